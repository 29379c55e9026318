"""Every operator's ``build_spec`` without Spark: a table's log written by hand, the spec the operator
builds from it, its JSON round trip, the statement it becomes, and the footprint planned from it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_delta_occ.engine import Snapshot
from airflow_delta_occ.engine.expressions import split_conjuncts
from airflow_delta_occ.engine.planner import Operation, can_conflict
from airflow_delta_occ.engine.sql_parser import parse_predicate, to_sql
from airflow_delta_occ.exceptions import JobSpecError
from airflow_delta_occ.jobs.footprint import engine_operation, footprint_of
from airflow_delta_occ.jobs.spec import JobSpec, RunIdentity, SourceRef, TableRef
from airflow_delta_occ.jobs.sql import statement_sql
from airflow_delta_occ.operators.delta import (
    DeltaAppendOperator,
    DeltaBaseOperator,
    DeltaDeleteOperator,
    DeltaMergeOperator,
    DeltaOptimizeOperator,
    DeltaOverwritePartitionsOperator,
    DeltaUpdateOperator,
)

pytestmark = pytest.mark.unit
RUN = RunIdentity("sales", "task", "manual__1")
DE = {"date": "2024-01-01", "country": "DE"}


@pytest.fixture
def table(sales_log: tuple[str, Snapshot]) -> tuple[str, Snapshot]:
    return sales_log


def operators(path: str) -> dict[str, DeltaBaseOperator]:
    return {
        "merge": DeltaMergeOperator(task_id="m", table=path, source="/src", merge_condition="t.id = s.id",
                                    partitions=DE),
        "update": DeltaUpdateOperator(task_id="u", table=path, set={"name": "'x'"}, where="id > 3", partitions=DE),
        "delete": DeltaDeleteOperator(task_id="d", table=path, where="id = 1", partitions=DE),
        "optimize": DeltaOptimizeOperator(task_id="o", table=path, partitions=DE, zorder_by=["ID"]),
        "append": DeltaAppendOperator(task_id="a", table=path, source="/src", partitions=DE),
        "overwrite_partitions": DeltaOverwritePartitionsOperator(task_id="w", table=path, source="/src",
                                                                 partitions=DE),
    }


@pytest.mark.parametrize("operation", ["merge", "update", "delete", "optimize", "append", "overwrite_partitions"])
def test_every_operator_builds_a_typed_spec_that_round_trips(table: tuple[str, Snapshot], operation: str) -> None:
    path, snapshot = table
    spec = operators(path)[operation].build_spec(snapshot, RUN)
    assert spec.operation == operation
    assert JobSpec.from_json(spec.to_json()) == spec
    assert spec.partitions == {"date": ("2024-01-01",), "country": ("DE",)}
    assert spec.partition_filter == parse_predicate("`date` = DATE'2024-01-01' AND `country` = 'DE'")
    if spec.condition is not None:  # each partition conjunct is a top-level conjunct, never nested
        conjuncts = [to_sql(c, qualifier=None) for c in split_conjuncts(spec.condition)]
        for part in split_conjuncts(spec.partition_filter):
            assert any(c.endswith(to_sql(part)) for c in conjuncts), (conjuncts, to_sql(part))
    # The statement is rendered from the tree, and the footprint planned from the spec alone.
    sql = statement_sql(spec, "src_view")
    if sql is not None:
        assert "`country` = 'DE'" in sql
    footprint = footprint_of(spec, snapshot)
    assert footprint.operation is engine_operation(spec)
    if operation != "append":  # a MERGE's join conjunct (t.id = s.id) neither narrows nor widens it
        assert set(footprint.read_files) == {"DE-0.parquet", "DE-1.parquet"}


def test_engine_operations() -> None:
    def spec(operation: str, **kw: Any) -> JobSpec:
        return JobSpec(operation=operation, target=TableRef(path="/t"), run=RUN, **kw)

    assert engine_operation(spec("optimize", zorder_by=("id",))) is Operation.OPTIMIZE_ZORDER
    assert engine_operation(spec("optimize")) is Operation.OPTIMIZE
    assert engine_operation(spec("append", source=SourceRef(path="/s"))) is Operation.INSERT


def test_footprints_of_jobs_on_other_partitions_do_not_conflict(table: tuple[str, Snapshot]) -> None:
    path, snapshot = table
    fr = {"date": "2024-01-01", "country": "FR"}
    def run(task: str) -> RunIdentity:  # each task its own txnAppId: one id twice is a real conflict
        return RunIdentity("sales", task, "manual__1")

    de_merge = operators(path)["merge"].build_spec(snapshot, run("m"))
    de_delete = operators(path)["delete"].build_spec(snapshot, run("d"))
    fr_update = DeltaUpdateOperator(task_id="u", table=path, set={"name": "'x'"}, partitions=fr) \
        .build_spec(snapshot, run("u_fr"))
    de_update = operators(path)["update"].build_spec(snapshot, run("u_de"))
    assert footprint_of(de_merge, snapshot).write_partitions == ({"country": "DE", "date": "2024-01-01"},)
    assert not can_conflict(footprint_of(de_merge, snapshot), footprint_of(fr_update, snapshot), snapshot)
    assert not can_conflict(footprint_of(de_delete, snapshot), footprint_of(fr_update, snapshot), snapshot)
    assert can_conflict(footprint_of(de_delete, snapshot), footprint_of(de_update, snapshot), snapshot)
    assert can_conflict(footprint_of(de_merge, snapshot), footprint_of(de_update, snapshot), snapshot)


def test_a_not_matched_by_source_merge_reads_the_whole_table(table: tuple[str, Snapshot]) -> None:
    path, snapshot = table
    merge = DeltaMergeOperator(task_id="m", table=path, source="/src", merge_condition="t.id = s.id", partitions=DE,
                               clauses=[{"kind": "not_matched_by_source_delete"}])
    footprint = footprint_of(merge.build_spec(snapshot, RUN), snapshot)
    assert footprint.read_whole_table and len(footprint.read_files) == 4


def test_a_spec_whose_tree_does_not_render_back_is_refused() -> None:
    from airflow_delta_occ.engine.expressions import And, Column, Comparison, Literal, Unknown

    tampered = And(Comparison("=", Column("id"), Literal(1)), Unknown("x) OR (1 = 1"))
    with pytest.raises(JobSpecError, match=r"renders? back|not accepted|parse"):
        JobSpec(operation="delete", target=TableRef(path="/t"), run=RUN, condition=tampered)


@pytest.mark.parametrize(("max_tries", "try_number", "retries", "first_try"), [
    (2, 1, 2, 1),    # first run: max_tries = retries
    (2, 3, 2, 1),    # its last retry
    (5, 4, 2, 4),    # cleared after try 3: max_tries = 3 + 2
    (5, 5, 2, 4),    # a retry after that clear keeps the series
    (1, 2, 0, 2),    # no retries, cleared after try 1: max_tries = 1 + 0
])
def test_the_series_of_tries_follows_airflow_clears(max_tries: int, try_number: int, retries: int,
                                                    first_try: int) -> None:
    op = DeltaDeleteOperator(task_id="d", table="/t", where="id = 1", retries=retries)
    ti = SimpleNamespace(dag_id="sales", task_id="d", map_index=-1, try_number=try_number, max_tries=max_tries)
    run = op._run_identity({"ti": ti, "run_id": "r"})
    assert run.first_try == first_try
    same_series = RunIdentity("sales", "d", "r", try_number=1, first_try=first_try)
    assert same_series.tagged(run.user_metadata()) and run.app_id == same_series.app_id
    other_series = RunIdentity("sales", "d", "r", first_try=first_try + 1)
    assert not other_series.tagged(run.user_metadata()) and other_series.app_id != run.app_id



def test_a_series_that_cannot_be_told_apart_fails_instead_of_guessing() -> None:
    """retries changed in the DAG file since Airflow set max_tries: guessing the series could write twice
    (a retry taken for a new series) or skip a clear's redo; the task fails and asks for a clear."""
    op = DeltaDeleteOperator(task_id="d", table="/t", where="id = 1", retries=1)
    ti = SimpleNamespace(dag_id="sales", task_id="d", map_index=-1, try_number=2, max_tries=3)  # created with 3
    with pytest.raises(JobSpecError, match="clear the task"):
        op._run_identity({"ti": ti, "run_id": "r"})


def test_mapped_tasks_get_the_delta_retry_policy_when_unmapped() -> None:
    import datetime as dt

    from airflow.sdk import DAG

    from airflow_delta_occ.operators.retry_policy import DeltaConflictRetryPolicy

    with DAG("mapped", schedule=None, start_date=dt.datetime(2024, 1, 1)):
        mapped = DeltaDeleteOperator.partial(task_id="d", table="/t", partitions=DE,
                                             conflict_policies={"MetadataChangedException": "fail"}) \
            .expand(where=["id = 1", "id = 2"])
    # What the worker runs: the operator built from the partial kwargs (retry_policy=None among them).
    op = DeltaDeleteOperator(**{k: v for k, v in mapped.partial_kwargs.items() if k not in ("dag", "task_group")},
                             task_id="d2", where="id = 1")
    assert isinstance(op.retry_policy, DeltaConflictRetryPolicy)
    assert op.retry_policy.overrides == {"MetadataChangedException": {"action": "fail"}}


@pytest.mark.parametrize("partitions", [DE, None])
@pytest.mark.parametrize("operation", ["merge", "update", "delete", "optimize", "append", "overwrite_partitions",
                                       "merge_nmbs"])
def test_the_read_plan_is_the_footprints_read_without_listing_files(table: tuple[str, Snapshot], operation: str,
                                                                     partitions: dict[str, str] | None,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``prepare`` plans only what the commit check needs (no file listing without a lease): the same
    read predicate and whole-table read as the footprint a lease would take."""
    from airflow_delta_occ.jobs.footprint import read_plan_of

    path, snapshot = table
    if operation == "overwrite_partitions" and partitions is None:
        return
    op = (DeltaMergeOperator(task_id="m", table=path, source="/src", merge_condition="t.id = s.id",
                             partitions=partitions, clauses=[{"kind": "not_matched_by_source_delete"}])
          if operation == "merge_nmbs" else operators(path)[operation])
    op.partitions = partitions
    spec = op.build_spec(snapshot, RUN)
    footprint = footprint_of(spec, snapshot)
    listed: list[str] = []
    monkeypatch.setattr(Snapshot, "files_matching", lambda self, *a, **k: listed.append("files_matching"))
    monkeypatch.setattr(Snapshot, "files", lambda self, *a, **k: listed.append("files"))
    plan = read_plan_of(spec, snapshot)
    assert (plan.read_predicate, plan.read_whole_table) == (footprint.read_predicate, footprint.read_whole_table)
    assert listed == []


def test_partitions_with_thousands_of_values_build_plan_and_judge(table: tuple[str, Snapshot]) -> None:
    """``partitions=`` accepts 10,000 values: the filter, the source check that repeats it for each way a
    MERGE writes rows, the footprint and the commit check all handle them (no length refusal, no deep
    recursion), before Spark runs."""
    import datetime as dt

    from airflow_delta_occ.jobs.footprint import read_plan_of
    from airflow_delta_occ.jobs.sql import source_check_sql

    path, snapshot = table
    dates = [str(dt.date(2000, 1, 1) + dt.timedelta(days=i)) for i in range(10_000)]
    merge = DeltaMergeOperator(task_id="m", table=path, source="/src", merge_condition="t.id = s.id",
                               partitions={"date": dates, "country": "DE"},
                               clauses=[{"kind": "matched_update_all"},
                                        {"kind": "not_matched_insert", "set": {"id": "s.id", "date": "s.date",
                                                                               "country": "s.country"}}])
    spec = merge.build_spec(snapshot, RUN)
    assert len(source_check_sql(spec) or "") > 100_000   # longer than an author's condition may be
    assert JobSpec.from_json(spec.to_json()) == spec
    footprint = footprint_of(spec, snapshot)
    assert read_plan_of(spec, snapshot).read_predicate == footprint.read_predicate
