"""The runner's typed edges: the commit it finds in the history and how a job's end becomes result fields
(the runner itself runs on real Spark in ``tests/spark``)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_delta_occ.exceptions import (
    ConflictFailure,
    ConflictSkipped,
    SourceOutsidePartitionsError,
)
from airflow_delta_occ.jobs.result import JobStatus
from airflow_delta_occ.jobs.spec import JobSpec
from airflow_delta_occ.retry.classify import ConflictKind
from airflow_delta_occ.spark.runner import Commit, JobEnd, _failure, _succeeded, find_commit

pytestmark = pytest.mark.unit

SPEC = JobSpec.from_json('{"operation": "delete", "target": {"path": "/lake/t"}, "run": {"dag_id": "d", '
                         '"task_id": "t", "run_id": "r", "map_index": -1, "try_number": 2, "first_try": 1}, '
                         '"condition": null}')


class _History:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows, self.statements = rows, []

    def sql(self, text: str) -> Any:
        self.statements.append(text)
        return self

    def collect(self) -> list[dict[str, Any]]:
        return self.rows[:int(self.statements[-1].rsplit("LIMIT ", 1)[1])]


def _row(version: int, operation: str, metadata: str | None, auto: bool = False) -> dict[str, Any]:
    return {"version": version, "operation": operation, "operationMetrics": {"numDeletedRows": str(version)},
            "userMetadata": metadata, "operationParameters": {"auto": "true"} if auto else {}}


def test_the_newest_commit_of_the_task_run_not_auto_compaction() -> None:
    mine = SPEC.run.user_metadata()
    other = json.dumps({"airflow": {"dag_id": "d", "task_id": "other", "run_id": "r", "map_index": -1}})
    history = _History([_row(9, "OPTIMIZE", mine, auto=True), _row(8, "WRITE", other), _row(7, "DELETE", mine),
                        _row(5, "DELETE", mine)])
    found = find_commit(history, SPEC, after_version=6)
    assert found == Commit(version=7, operation="DELETE", metrics={"numDeletedRows": "7"}, user_metadata=mine,
                           new=True)
    assert find_commit(history, SPEC, after_version=7) == Commit(7, "DELETE", {"numDeletedRows": "7"}, mine, False)
    assert find_commit(_History([_row(3, "WRITE", other)]), SPEC, after_version=0) is None
    assert history.statements == ["DESCRIBE HISTORY delta.`/lake/t` LIMIT 10"] * 2   # found among the newest


def test_a_commit_behind_ten_newer_ones_is_found_further_back_and_a_short_history_is_read_once() -> None:
    mine = SPEC.run.user_metadata()
    other = json.dumps({"airflow": {"dag_id": "d", "task_id": "other", "run_id": "r", "map_index": -1}})
    history = _History([_row(v, "WRITE", other) for v in range(30, 12, -1)] + [_row(12, "DELETE", mine)])
    assert find_commit(history, SPEC, after_version=11) == Commit(12, "DELETE", {"numDeletedRows": "12"}, mine, True)
    assert history.statements == [f"DESCRIBE HISTORY delta.`/lake/t` LIMIT {n}" for n in (10, 100)]
    short = _History([_row(2, "WRITE", other), _row(1, "WRITE", other)])
    assert find_commit(short, SPEC, after_version=0) is None and len(short.statements) == 1


def test_a_success_reports_the_commit_or_nothing() -> None:
    assert _succeeded(None) == JobEnd(JobStatus.SUCCESS)
    assert _succeeded(Commit(4, "DELETE", {"n": "1"}, "{}", new=False)) == JobEnd(
        JobStatus.SUCCESS, version=4, metrics={"n": "1"}, already_committed=True)


def test_each_failure_becomes_its_status() -> None:
    assert _failure(ConflictSkipped("skipped", kind=ConflictKind.APPEND)) == JobEnd(
        JobStatus.SKIPPED, error="skipped", conflict=ConflictKind.APPEND)
    assert _failure(ConflictFailure("gave up", kind=ConflictKind.APPEND, attempts=3)) == JobEnd(
        JobStatus.CONFLICT, error="gave up", conflict=ConflictKind.APPEND)
    refused = _failure(SourceOutsidePartitionsError("2 rows outside", count=2, samples=({"d": 1},)))
    assert refused == JobEnd(JobStatus.REJECTED, error="2 rows outside", error_type="SourceOutsidePartitionsError",
                             refused={"count": 2, "samples": [{"d": 1}]})
    assert _failure(OSError("disk")) == JobEnd(JobStatus.ERROR, error="OSError: disk", error_type="OSError")


class _Refusing:
    """A session whose write is refused by Spark's analysis; ``history`` is what the check that follows
    meets: an exception to raise, or the rows it reads."""

    def __init__(self, history: BaseException | list[dict[str, Any]]) -> None:
        self.history, self.statements = history, []
        self.settings: dict[str, str] = {}
        self.conf = SimpleNamespace(set=self.settings.__setitem__,   # the attempt names its commits here
                                    unset=lambda key: self.settings.pop(key, None))

    def sql(self, text: str) -> Any:
        from pyspark.errors import AnalysisException

        self.statements.append(text)
        if not text.startswith("DESCRIBE HISTORY"):
            raise AnalysisException(f"[DELTA_MISSING_DELTA_TABLE] refused: {text[:20]}")
        if isinstance(self.history, BaseException):
            raise self.history
        return _History(self.history).sql(text)


def _planned(operation: str = "delete") -> JobSpec:
    return JobSpec.from_json(json.dumps(json.loads(SPEC.to_json()) | {"operation": operation, "planned_version": 4}))


def test_a_refused_statement_is_table_not_found_only_when_the_check_says_so() -> None:
    from pyspark.errors import AnalysisException

    from airflow_delta_occ.engine.errors import TableNotFoundError
    from airflow_delta_occ.exceptions import StatementRefusedError
    from airflow_delta_occ.spark.runner import _execute_once

    gone = _Refusing(AnalysisException("[DELTA_MISSING_DELTA_TABLE] /lake/t is not a Delta table"))
    with pytest.raises(TableNotFoundError, match="/lake/t"):
        _execute_once(gone, _planned(), None, None)
    assert [s.split(" ")[0] for s in gone.statements] == ["DELETE", "DESCRIBE"]   # checked after the refusal
    # The table is there: the refusal stands.
    with pytest.raises(StatementRefusedError, match="refused"):
        _execute_once(_Refusing([_row(4, "WRITE", None)]), _planned(), None, None)
    # The check itself fails (an outage, not an answer): the refusal stands, never "table not found".
    with pytest.raises(StatementRefusedError, match="refused"):
        _execute_once(_Refusing(ConnectionError("S3 503")), _planned(), None, None)


@pytest.mark.parametrize(("operation", "idempotent", "named"), [
    ("delete", True, True), ("delete", False, False), ("append", True, False)])
def test_only_the_runner_names_a_jobs_transaction(operation: str, idempotent: bool, named: bool) -> None:
    """A ``txnAppId`` already on the job's session (a cluster's ``spark-defaults.conf``, a Connect server's launch
    settings) would make Delta skip a write the provider counts on: each attempt sets the run's own id where the
    job is an idempotent DML statement, and unsets any other (an append passes the run's id as writer options)."""
    from airflow_delta_occ.jobs.spec import TXN_APP_ID_CONF, TXN_VERSION_CONF, USER_METADATA_CONF
    from airflow_delta_occ.spark.runner import _identify_writes

    extra: dict[str, Any] = {"operation": operation, "idempotent": idempotent}
    if operation == "append":
        extra["source"] = {"path": "/landing/t"}
    spec = JobSpec.from_json(json.dumps(json.loads(SPEC.to_json()) | extra))
    session = _Refusing([])
    session.settings.update({TXN_APP_ID_CONF: "cluster-default-etl", TXN_VERSION_CONF: "7"})
    _identify_writes(session, spec)
    assert session.settings[USER_METADATA_CONF] == spec.run.user_metadata()
    if named:
        assert session.settings[TXN_APP_ID_CONF] == spec.run.app_id and session.settings[TXN_VERSION_CONF] == "0"
    else:
        assert TXN_APP_ID_CONF not in session.settings and TXN_VERSION_CONF not in session.settings
