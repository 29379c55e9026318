"""Operators on real Spark + delta-spark: injection, bad input, conflicts, retries and idempotency.

Concurrency uses the gate LogStore: job A is held at its commit while job B commits, so both read
the same version, as two Airflow tasks racing on one table would.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog, TableNotFoundError
from airflow_delta_occ.exceptions import (
    MissingPartitionConstraintError,
    PartitionSpecError,
    SourceNotFoundError,
    StatementRefusedError,
    UnsafeExpressionError,
)
from airflow_delta_occ.operators.delta import (
    DeltaAppendOperator,
    DeltaDeleteOperator,
    DeltaMergeOperator,
    DeltaOptimizeOperator,
    DeltaOverwritePartitionsOperator,
    DeltaUpdateOperator,
)

from .jobs import check_disjoint_merges, check_overlapping_merges, context, merge, rows, run_checked, source


def test_merge_injects_typed_partition_predicate(spark: Any, sales: str, tmp_path: Any) -> None:
    src = source(spark, tmp_path, "src", [(1, 10, "2024-01-01", "DE"), (9, 90, "2024-01-01", "DE")])
    result = merge(sales, src, "DE").execute(context())
    assert result["condition"] == ("(`t`.`id` = `s`.`id` AND `t`.`country` = `s`.`country`) AND "
                                   "(`t`.`date` = DATE'2024-01-01' AND `t`.`country` = 'DE')")
    assert result["confirmed"] and result["attempts"] == 1 and result["version"] == 2
    assert result["task_seconds"] >= result["run_seconds"] > 0 and result["wait_seconds"] == 0
    assert int(result["metrics"]["numTargetRowsUpdated"]) == 1 and int(result["metrics"]["numTargetRowsInserted"]) == 1
    assert rows(spark, sales) == [(1, 10, "DE"), (2, 0, "DE"), (3, 0, "FR"), (4, 0, "FR"), (9, 90, "DE")]


def test_update_delete_optimize_overwrite(spark: Any, sales: str, tmp_path: Any) -> None:
    DeltaUpdateOperator(task_id="u", table=sales, set={"v": "v + 5"}, where="id > 1",
                        partitions={"date": "2024-01-01", "country": "FR"}).execute(context("u"))
    DeltaDeleteOperator(task_id="d", table=sales, where="id = 2",
                        partitions={"date": "2024-01-01", "country": "DE"}).execute(context("d"))
    result = DeltaOptimizeOperator(task_id="o", table=sales, partitions={"date": "2024-01-01", "country": "FR"},
                                   zorder_by=["id"]).execute(context("o"))
    assert result["confirmed"] and result["metrics"]["numRemovedFiles"]
    src = source(spark, tmp_path, "fr", [(7, 7, "2024-01-01", "FR")])
    DeltaOverwritePartitionsOperator(task_id="w", table=sales, source=src,
                                     partitions={"date": "2024-01-01", "country": "FR"}).execute(context("w"))
    assert rows(spark, sales) == [(1, 0, "DE"), (7, 7, "FR")]


def test_catalog_target_with_table_and_query_sources(spark: Any, sales: str, tmp_path: Any) -> None:
    name = f"sales_{tmp_path.name[-12:].replace('-', '_')}"
    spark.sql(f"CREATE TABLE default.{name} USING delta LOCATION '{sales}'")
    src = source(spark, tmp_path, "src", [(1, 10, "2024-01-01", "DE"), (9, 90, "2024-01-01", "DE")])
    spark.sql(f"CREATE TABLE default.{name}_src USING delta LOCATION '{src}'")
    by_table = DeltaMergeOperator(task_id="m1", table_name=f"default.{name}", source_table=f"default.{name}_src",
                                  merge_condition="t.id = s.id", partitions={"date": "2024-01-01", "country": "DE"},
                                  clauses=[{"kind": "matched_update", "set": {"v": "s.v"}}])
    result = by_table.execute(context("m1"))
    assert result["confirmed"] and result["table"] == f"default.{name}"
    by_query = DeltaMergeOperator(task_id="m2", table_name=f"default.{name}",
                                  source_query=f"SELECT id, v * 2 AS v, date, country FROM default.{name}_src",
                                  merge_condition="t.id = s.id", partitions={"date": "2024-01-01", "country": "DE"},
                                  clauses=[{"kind": "not_matched_insert_all"}])
    assert by_query.execute(context("m2"))["confirmed"]
    assert rows(spark, sales) == [(1, 10, "DE"), (2, 0, "DE"), (3, 0, "FR"), (4, 0, "FR"), (9, 180, "DE")]
    version = DeltaLog.for_table(sales).latest_version()
    with pytest.raises(TableNotFoundError, match="no_such_table"):
        DeltaMergeOperator(task_id="m3", table_name="default.no_such_table", source=src,
                           merge_condition="t.id = s.id").execute(context("m3"))
    parquet = str(tmp_path / "plain")
    spark.range(3).write.parquet(parquet)
    spark.sql(f"CREATE TABLE default.{name}_pq USING parquet LOCATION '{parquet}'")
    with pytest.raises(TableNotFoundError, match="not Delta"):
        DeltaDeleteOperator(task_id="d", table_name=f"default.{name}_pq", where="id = 1").execute(context("d"))
    assert DeltaLog.for_table(sales).latest_version() == version


def test_bad_input_is_refused_before_spark_and_changes_nothing(spark: Any, sales: str, tmp_path: Any,
                                                              capfd: Any) -> None:
    src = source(spark, tmp_path, "src", [(1, 10, "2024-01-01", "DE")])
    version = DeltaLog.for_table(sales).latest_version()
    with pytest.raises(PartitionSpecError, match="not a column"):
        merge(sales, src, None, partitions={"region": "EU"}).execute(context())
    with pytest.raises(PartitionSpecError, match="not a partition column"):
        merge(sales, src, None, partitions={"id": 1}).execute(context())
    with pytest.raises(PartitionSpecError, match="type date"):
        merge(sales, src, None, partitions={"date": "2024-02-30"}).execute(context())
    with pytest.raises(UnsafeExpressionError, match="not accepted"):
        DeltaMergeOperator(task_id="m", table=sales, source=src, merge_condition="t.id = s.id; DROP TABLE x",
                           partitions={"date": "2024-01-01", "country": "DE"}).execute(context())
    with pytest.raises(UnsafeExpressionError):
        DeltaDeleteOperator(task_id="d", table=sales, where="id = 1 -- and more").execute(context())
    with pytest.raises(TableNotFoundError):
        merge(str(tmp_path / "nope"), src, "DE").execute(context())
    with pytest.raises(SourceNotFoundError, match="cannot read source"):
        merge(sales, str(tmp_path / "no_source"), "DE").execute(context())
    # Issue #24: Spark's refusal pointed at a position in the MERGE the provider rendered; now into the
    # author's own condition.
    with pytest.raises(StatementRefusedError) as refused:
        merge(sales, src, "DE", merge_condition="t.id = s.id AND t.v < s.no_such_column").execute(context())
    lines = str(refused.value).splitlines()
    assert "no_such_column" in lines[0] and " pos " not in lines[0], lines
    assert lines[1] == "  in merge_condition: t.id = s.id AND t.v < s.no_such_column", lines
    assert lines[2].index("^") == lines[1].index("s.no_such_column"), lines
    with pytest.raises(MissingPartitionConstraintError, match="ConcurrentAppendException"):
        merge(sales, src, None, strict_partitions=True).execute(context())
    assert DeltaLog.for_table(sales).latest_version() == version
    # A quote or a comment inside a partition value is data: nothing matches it, nothing is deleted.
    DeltaDeleteOperator(task_id="d", table=sales, partitions={"country": "DE' OR '1'='1"}).execute(context("d"))
    DeltaDeleteOperator(task_id="d2", table=sales, partitions={"country": "x') OR true --"}).execute(context("d2"))
    assert len(rows(spark, sales)) == 4
    capfd.readouterr()
    merge(sales, src, None).execute(context("unconstrained"))
    assert "not confined to partitions" in "".join(capfd.readouterr())


def test_concurrent_merges_on_different_partitions(spark: Any, sales: str, tmp_path: Any) -> None:
    check_disjoint_merges(spark, sales, tmp_path, run_checked)


def test_overlapping_merges_retry_to_the_serial_result(spark: Any, sales: str, tmp_path: Any) -> None:
    check_overlapping_merges(spark, sales, tmp_path, run_checked)


def test_retried_task_run_never_writes_twice(spark: Any, sales: str, tmp_path: Any) -> None:
    src = source(spark, tmp_path, "new", [(50, 5, "2024-01-02", "DE"), (51, 5, "2024-01-02", "DE")])
    append = DeltaAppendOperator(task_id="load", table=sales, source=src)
    first = append.execute(context("load", try_number=1))
    # The worker died after Delta committed (ambiguous failure); Airflow runs try 2 of the same run.
    second = append.execute(context("load", try_number=2))
    assert first["version"] == second["version"] and second["already_committed"]
    assert len(rows(spark, sales)) == 6
    # The same holds for a non-idempotent DML (v = v + 1), through Delta's txnAppId for DML.
    bump = DeltaUpdateOperator(task_id="bump", table=sales, set={"v": "v + 1"},
                               partitions={"date": "2024-01-01", "country": "DE"})
    bump.execute(context("bump", try_number=1))
    bump.execute(context("bump", try_number=2))
    assert rows(spark, sales)[:2] == [(1, 1, "DE"), (2, 1, "DE")]
    # A different run of the task writes again.
    append.execute(context("load", run_id="manual__2024-01-02"))
    assert len(rows(spark, sales)) == 8
    # Clearing the task starts a new series of tries (Airflow sets max_tries = try_number + retries):
    # the clear redoes the write, and a retry within the new series still writes nothing twice.
    cleared = append.execute(context("load", try_number=3, max_tries=2 + append.retries))
    assert cleared["version"] > second["version"] and not cleared["already_committed"]
    assert len(rows(spark, sales)) == 10
    retry_after_clear = append.execute(context("load", try_number=4, max_tries=2 + append.retries))
    assert retry_after_clear["already_committed"] and retry_after_clear["version"] == cleared["version"]
    assert len(rows(spark, sales)) == 10
