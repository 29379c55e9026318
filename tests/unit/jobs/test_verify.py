"""``jobs.verify.escapes``: what a commit changed outside the job's plan, read from its actions (issue #20).

The proof on real delta-spark is in tests/spark/test_statement_text.py; these pin the rules on logs
written by hand, including the NOT MATCHED BY SOURCE MERGE that copies other partitions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.jobs.footprint import footprint_of
from airflow_delta_occ.jobs.spec import RunIdentity
from airflow_delta_occ.jobs.verify import escapes
from airflow_delta_occ.operators.delta import DeltaDeleteOperator, DeltaMergeOperator

from ..engine.logbuilder import LogBuilder, add, commit_info, dv, metadata, protocol, remove

pytestmark = pytest.mark.unit
RUN = RunIdentity("sales", "task", "manual__1")
DE = {"date": "2024-01-01", "country": "DE"}
FR = {"date": "2024-01-01", "country": "FR"}


def judged(tmp_path: Path, op: Any, *actions: dict[str, Any], fr_dv: dict[str, Any] | None = None
           ) -> list[tuple[str, str | None]]:
    b = LogBuilder(tmp_path / "t")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata())
    b.commit(commit_info(), add("de.parquet", DE, stats={"numRecords": 2}),
             add("fr.parquet", FR, stats={"numRecords": 3}, dv=fr_dv),
             add("null.parquet", {"date": "2024-01-01", "country": None}, stats={"numRecords": 2}))
    log = DeltaLog.for_table(b.root)
    snapshot = log.snapshot()
    spec = op.build_spec(snapshot, RUN)
    b.commit(commit_info("MERGE"), *actions)
    [commit] = log.commits_after(1)
    return [(e.change, e.partition["country"]) for e in escapes(spec, footprint_of(spec, snapshot), snapshot, commit)]


def delete_de() -> DeltaDeleteOperator:
    return DeltaDeleteOperator(task_id="d", table="/x", partitions={"country": "DE"})


def nmbs_merge_de() -> DeltaMergeOperator:
    return DeltaMergeOperator(task_id="m", table="/x", source="/src", merge_condition="t.id = s.id", partitions=DE,
                              clauses=[{"kind": "not_matched_insert_all"}, {"kind": "not_matched_by_source_delete"}])


def test_a_delete_inside_its_partition_passes(tmp_path: Path) -> None:
    assert judged(tmp_path, delete_de(), remove("de.parquet"), add("de2.parquet", DE)) == []


def test_a_delete_that_removed_or_added_in_another_partition_is_named(tmp_path: Path) -> None:
    assert judged(tmp_path, delete_de(), remove("fr.parquet"), add("fr2.parquet", FR)) == [("removed", "FR"),
                                                                                          ("added", "FR")]


def test_a_remove_without_partition_values_is_judged_by_the_read_snapshot(tmp_path: Path) -> None:
    bare = remove("fr.parquet")
    bare["remove"].pop("partitionValues", None)
    assert judged(tmp_path, delete_de(), bare) == [("removed", "FR")]


def test_a_not_matched_by_source_merge_may_copy_other_partitions_row_for_row(tmp_path: Path) -> None:
    copied = judged(tmp_path, nmbs_merge_de(), remove("de.parquet"), add("de2.parquet", DE, stats={"numRecords": 1}),
                    remove("fr.parquet"), add("fr2.parquet", FR, stats={"numRecords": 3}))
    assert copied == []


def test_a_not_matched_by_source_merge_that_drops_rows_elsewhere_is_named(tmp_path: Path) -> None:
    dropped = judged(tmp_path, nmbs_merge_de(), remove("fr.parquet"), add("fr2.parquet", FR, stats={"numRecords": 1}))
    assert dropped == [("removed", "FR"), ("added", "FR")]


def test_a_copied_null_partition_whose_remove_leaves_the_null_out_is_a_copy(tmp_path: Path) -> None:
    """delta-spark writes a remove's NULL partition values by leaving them out, its add's as null."""
    bare = remove("null.parquet")
    bare["remove"]["partitionValues"] = {"date": "2024-01-01"}
    assert judged(tmp_path, nmbs_merge_de(), bare, add("null2.parquet", {"date": "2024-01-01", "country": None},
                                                        stats={"numRecords": 2})) == []


def test_rows_a_deletion_vector_deleted_are_not_counted_as_copied(tmp_path: Path) -> None:
    copied = judged(tmp_path, nmbs_merge_de(), remove("fr.parquet"), add("fr2.parquet", FR, stats={"numRecords": 2}),
                    fr_dv=dv("abc", cardinality=1))
    assert copied == []


def test_an_escaped_commit_is_never_retried_at_the_task_level() -> None:
    from airflow.sdk.definitions.retry_policy import RetryAction

    from airflow_delta_occ.exceptions import CommitOutsidePartitionsError
    from airflow_delta_occ.operators.retry_policy import DeltaConflictRetryPolicy

    decision = DeltaConflictRetryPolicy("delete").evaluate(CommitOutsidePartitionsError("escaped"), 1, 3)
    assert decision.action is RetryAction.FAIL


def test_confirm_commit_finds_the_runs_commit_its_name_and_the_schema_it_left(tmp_path: Path) -> None:
    """The operator's confirmation, on a log written by hand: an untagged version is not confirmed, a
    tagged one gives Delta's name of it and the schema after it (what lineage reports, read once)."""
    from airflow_delta_occ.exceptions import CommitNotConfirmedError, CommitOutsidePartitionsError
    from airflow_delta_occ.jobs.footprint import read_plan_of
    from airflow_delta_occ.jobs.verify import confirm_commit

    from ..engine.logbuilder import SCHEMA

    b = LogBuilder(tmp_path / "t")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata())
    b.commit(commit_info(), add("de.parquet", DE, stats={"numRecords": 2}), add("fr.parquet", FR))
    log = DeltaLog.for_table(b.root)
    snapshot = log.snapshot()
    spec = delete_de().build_spec(snapshot, RUN)
    plan = read_plan_of(spec, snapshot)
    b.commit(commit_info("DELETE"), remove("de.parquet"))                       # v2: someone else's
    evolved = {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "extra", "type": "long", "nullable": True,
                                                        "metadata": {}}]}
    b.commit(commit_info("MERGE", userMetadata=RUN.user_metadata()), metadata(schema=evolved),
             remove("de.parquet"))                                              # v3: the run's
    commits = log.commits_after(snapshot.version)
    with pytest.raises(CommitNotConfirmedError, match=r"version 2 .* not tagged"):
        confirm_commit(spec, plan, snapshot, commits, 2, b.root)
    confirmed = confirm_commit(spec, plan, snapshot, commits, 3, b.root)
    assert (confirmed.version, confirmed.operation) == (3, "MERGE")
    assert confirmed.schema is not None and confirmed.schema.find("extra") is not None
    b.commit(commit_info("OPTIMIZE", userMetadata=RUN.user_metadata()), remove("fr.parquet"))  # v4: in the run's name
    with pytest.raises(CommitOutsidePartitionsError, match=r"RESTORE TABLE .* TO VERSION AS OF 3"):
        confirm_commit(spec, plan, snapshot, log.commits_after(snapshot.version), 3, b.root)
