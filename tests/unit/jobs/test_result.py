"""``JobResult``: one typed result in every mode, and the one place a status becomes an exception."""

from __future__ import annotations

import pickle

import pytest

from airflow_delta_occ.engine import TableNotFoundError
from airflow_delta_occ.exceptions import (
    ConflictFailure,
    ConflictSkipped,
    DeltaJobError,
    JobSpecError,
    SourceNotFoundError,
    SourceOutsidePartitionsError,
    StatementRefusedError,
)
from airflow_delta_occ.jobs.result import JobResult, JobStatus, OpenLineageParent
from airflow_delta_occ.retry.classify import ConflictKind, conflict_failure
from airflow_delta_occ.retry.policy import ConflictRecord

pytestmark = pytest.mark.unit


def result(**kw: object) -> JobResult:
    return JobResult(table="/lake/sales", operation="merge", **kw)  # type: ignore[arg-type]


def test_round_trips_through_json_with_typed_conflicts() -> None:
    done = result(status=JobStatus.SUCCESS, version=7, attempts=2, metrics={"numTargetRowsUpdated": "3"},
                  conflicts=(ConflictRecord(1, ConflictKind.APPEND, "files were added", "retry", 0.5),))
    back = JobResult.from_json(done.to_json())
    assert back == done and back.conflicts[0].kind is ConflictKind.APPEND
    assert back.raise_for_status() is back
    assert done.to_dict()["conflicts"][0]["kind"] == "ConcurrentAppendException"


@pytest.mark.parametrize(("status", "fields", "error_class"), [
    (JobStatus.SKIPPED, {"conflict": ConflictKind.DELETE_DELETE}, ConflictSkipped),
    (JobStatus.CONFLICT, {"conflict": ConflictKind.APPEND, "attempts": 5}, ConflictFailure),
    (JobStatus.REJECTED, {"error_type": "StatementRefusedError"}, StatementRefusedError),
    (JobStatus.REJECTED, {"error_type": "SourceNotFoundError"}, SourceNotFoundError),
    (JobStatus.REJECTED, {"error_type": "UnknownRefusal"}, JobSpecError),
    (JobStatus.ERROR, {"error_type": "Py4JError"}, DeltaJobError),
])
def test_every_status_raises_its_class_with_the_message(status: JobStatus, fields: dict[str, object],
                                                        error_class: type[Exception]) -> None:
    failed = JobResult.from_json(result(status=status, error="what went wrong", **fields).to_json())
    with pytest.raises(error_class, match="what went wrong") as info:
        failed.raise_for_status()
    if isinstance(info.value, ConflictFailure):
        assert info.value.kind is ConflictKind.APPEND and info.value.attempts == 5


def test_refused_rows_and_missing_tables_keep_their_fields() -> None:
    refused = result(status=JobStatus.REJECTED, error_type="SourceOutsidePartitionsError", error="2 source row(s)",
                     refused={"count": 2, "samples": [{"country": "FR"}]})
    with pytest.raises(SourceOutsidePartitionsError) as info:
        JobResult.from_json(refused.to_json()).raise_for_status()
    assert info.value.count == 2 and info.value.samples == ({"country": "FR"},)
    missing = TableNotFoundError("/lake/sales", "not in the catalog")
    with pytest.raises(TableNotFoundError) as lost:
        result(status=JobStatus.REJECTED, error_type="TableNotFoundError", error=str(missing)).raise_for_status()
    assert str(lost.value) == str(missing)


def test_malformed_results_are_a_typed_error() -> None:
    for text in ("[]", "{}", '{"status": "great", "table": "t", "operation": "merge"}',
                 '{"status": "conflict", "table": "t", "operation": "merge"}'):
        with pytest.raises(DeltaJobError):
            JobResult.from_json(text)


def test_conflict_errors_survive_pickling_with_their_kind() -> None:
    failure = conflict_failure(ConflictKind.METADATA, 2, RuntimeError("schema changed"))
    back = pickle.loads(pickle.dumps(failure))
    assert type(back) is ConflictFailure and back.kind is ConflictKind.METADATA and str(back) == str(failure)
    skipped = pickle.loads(pickle.dumps(ConflictSkipped("skip", kind=ConflictKind.DELETE_READ)))
    assert skipped.kind is ConflictKind.DELETE_READ


def test_the_openlineage_parent_the_spark_session_saw_round_trips_typed() -> None:
    """The runner reports the ``spark.openlineage.parent*`` confs its session held; the operator compares
    them with the parent it handed over, so the value must come back from JSON as the same typed value."""
    conf = {"spark.openlineage.parentJobNamespace": "lake", "spark.openlineage.parentJobName": "sales.merge",
            "spark.openlineage.parentRunId": "019a0000-0000-7000-8000-000000000001",
            "spark.openlineage.rootParentJobNamespace": "lake", "spark.openlineage.rootParentJobName": "sales",
            "spark.openlineage.rootParentRunId": "019a0000-0000-7000-8000-000000000000",
            "spark.openlineage.transport.type": "http", "spark.app.name": "x"}
    parent = OpenLineageParent.from_conf(conf)
    assert parent == OpenLineageParent(job_namespace="lake", job_name="sales.merge",
                                       run_id="019a0000-0000-7000-8000-000000000001", root_job_namespace="lake",
                                       root_job_name="sales", root_run_id="019a0000-0000-7000-8000-000000000000")
    done = result(status=JobStatus.SUCCESS, version=3, openlineage_parent=parent)
    back = JobResult.from_json(done.to_json())
    assert back == done and isinstance(back.openlineage_parent, OpenLineageParent)
    assert done.to_dict()["openlineage_parent"]["run_id"] == "019a0000-0000-7000-8000-000000000001"
    # A session without parent confs (injection off) reports none, and that survives JSON too.
    assert OpenLineageParent.from_conf({"spark.openlineage.transport.type": "http"}) is None
    assert JobResult.from_json(result(status=JobStatus.SUCCESS).to_json()).openlineage_parent is None
    with pytest.raises(DeltaJobError):
        JobResult.from_json({**done.to_dict(), "openlineage_parent": {"run_id": 7}})
