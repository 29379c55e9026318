"""The runner's check of the target before a write, on real delta-spark.

A job planned by the operator carries the version it was planned at (``JobSpec.planned_version``).
A SQL statement (MERGE, UPDATE, DELETE, OPTIMIZE) on a table that is gone fails by itself, so such a
job runs no history read before its write; a DataFrame write (append, overwrite of partitions) would
create a table where there is none, so it still checks first. Either way a table gone between the
plan and the run is a ``TableNotFoundError`` and nothing is written.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.jobs.result import JobStatus
from airflow_delta_occ.jobs.spec import RunIdentity
from airflow_delta_occ.operators.delta import (
    DeltaAppendOperator,
    DeltaDeleteOperator,
    DeltaOptimizeOperator,
    DeltaUpdateOperator,
)
from airflow_delta_occ.spark.runner import run_job

from .jobs import merge_spec, source


def _update_spec(table: str, run_id: str = "manual__1") -> Any:
    op = DeltaUpdateOperator(task_id="u", table=table, partitions={"date": "2024-01-01", "country": "DE"},
                             set={"v": "v + 1"})
    return op.build_spec(DeltaLog.for_table(table).snapshot(), RunIdentity("sales", "u", run_id))


def _spec_of(op: Any, table: str) -> Any:
    return op.build_spec(DeltaLog.for_table(table).snapshot(), RunIdentity("sales", op.task_id, "manual__1"))


def _append_spec(table: str, src: str) -> Any:
    op = DeltaAppendOperator(task_id="a", table=table, source=src, partitions={"date": "2024-01-01", "country": "DE"})
    return op.build_spec(DeltaLog.for_table(table).snapshot(), RunIdentity("sales", "a", "manual__1"))


def test_a_planned_statement_reads_no_history_before_its_write(spark: Any, sales: str, tmp_path: Path) -> None:
    src = source(spark, tmp_path, "src", [(1, 10, "2024-01-01", "DE")])
    planned = DeltaLog.for_table(sales).latest_version()
    for plan in (lambda: merge_spec(sales, src, "DE", "manual__1", {}), lambda: _update_spec(sales)):
        spec = plan()   # planned after the previous job's commit
        assert spec.planned_version == DeltaLog.for_table(sales).latest_version()
        result = run_job(spark, spec).raise_for_status()
        assert "target_check" not in result.phase_seconds, result.phase_seconds
        assert result.version is not None and result.version > spec.planned_version
        assert result.already_committed is False
    assert DeltaLog.for_table(sales).latest_version() == planned + 2


def test_the_same_run_planned_after_its_commit_finds_it_already_committed(spark: Any, sales: str) -> None:
    first = run_job(spark, _update_spec(sales, "manual__again")).raise_for_status()
    again = run_job(spark, _update_spec(sales, "manual__again")).raise_for_status()   # a retry re-plans
    assert again.already_committed is True and again.version == first.version
    assert DeltaLog.for_table(sales).latest_version() == first.version   # written once


def test_a_table_gone_after_planning_is_table_not_found_and_nothing_is_written(
        spark: Any, sales: str, tmp_path: Path) -> None:
    src = source(spark, tmp_path, "src", [(1, 10, "2024-01-01", "DE")])
    de = {"date": "2024-01-01", "country": "DE"}
    specs = [merge_spec(sales, src, "DE", "manual__1", {}), _update_spec(sales), _append_spec(sales, src),
             _spec_of(DeltaDeleteOperator(task_id="d", table=sales, partitions=de, where="id = 1"), sales),
             _spec_of(DeltaOptimizeOperator(task_id="o", table=sales, partitions=de), sales)]
    shutil.rmtree(sales)
    for spec in specs:
        result = run_job(spark, spec)
        assert result.status is JobStatus.REJECTED and result.error_type == "TableNotFoundError", \
            (spec.operation, result.status, result.error)
        assert not Path(sales).exists(), spec.operation   # the append did not create a table there
