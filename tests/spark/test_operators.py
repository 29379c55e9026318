"""Operators on real Spark + delta-spark: injection, bad input, conflicts, retries and idempotency.

Concurrency uses the gate LogStore: job A is held at its commit while job B commits, so both read
the same version, as two Airflow tasks racing on one table would.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog, TableNotFoundError
from airflow_delta_occ.exceptions import (
    MissingPartitionConstraintError,
    PartitionSpecError,
    SourceNotFoundError,
    UnsafeExpressionError,
)
from airflow_delta_occ.jobspec import RunIdentity
from airflow_delta_occ.operators.delta import (
    DeltaAppendOperator,
    DeltaDeleteOperator,
    DeltaMergeOperator,
    DeltaOptimizeOperator,
    DeltaOverwritePartitionsOperator,
    DeltaUpdateOperator,
)
from airflow_delta_occ.retry import ConflictFailure, ConflictKind
from airflow_delta_occ.spark.runner import run_job

from .differential.harness import USER_METADATA_CONF, run_interleaved

FAST = {"initial_delay": 0.0, "jitter": 0.0}


def context(task_id: str = "task", run_id: str = "manual__2024-01-01", try_number: int = 1) -> dict[str, Any]:
    return {"ti": SimpleNamespace(dag_id="sales", task_id=task_id, map_index=-1, try_number=try_number),
            "run_id": run_id}


@pytest.fixture
def sales(spark: Any, tmp_path: Any) -> str:
    """Partitioned by (date, country); two rows per partition."""
    path = str(tmp_path / "sales")
    spark.sql(f"CREATE TABLE delta.`{path}` (id INT, v INT, date DATE, country STRING) USING delta "
              "PARTITIONED BY (date, country)")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 0, DATE'2024-01-01', 'DE'), (2, 0, DATE'2024-01-01', 'DE'), "
              "(3, 0, DATE'2024-01-01', 'FR'), (4, 0, DATE'2024-01-01', 'FR')")
    return path


def source(spark: Any, tmp_path: Any, name: str, rows: list[tuple[int, int, str, str]]) -> str:
    path = str(tmp_path / name)
    spark.createDataFrame(rows, "id INT, v INT, date STRING, country STRING") \
        .selectExpr("id", "v", "CAST(date AS DATE) AS date", "country").write.format("delta").save(path)
    return path


def rows(spark: Any, path: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.sql(f"SELECT id, v, country FROM delta.`{path}`").collect())


def merge(table: str, src: str, country: str | None, **kw: Any) -> DeltaMergeOperator:
    kw.setdefault("partitions", {"date": "2024-01-01", "country": country} if country else None)
    return DeltaMergeOperator(task_id=f"merge_{country}", table=table, source=src,
                              merge_condition="t.id = s.id AND t.country = s.country", **kw)


def test_merge_injects_typed_partition_predicate(spark: Any, sales: str, tmp_path: Any) -> None:
    src = source(spark, tmp_path, "src", [(1, 10, "2024-01-01", "DE"), (9, 90, "2024-01-01", "DE")])
    result = merge(sales, src, "DE").execute(context())
    assert result["condition"] == ("(t.id = s.id AND t.country = s.country) AND (`t`.`date` = DATE'2024-01-01' "
                                   "AND `t`.`country` = 'DE')")
    assert result["confirmed"] and result["attempts"] == 1 and result["version"] == 2
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
    with pytest.raises(MissingPartitionConstraintError, match="ConcurrentAppendException"):
        merge(sales, src, None, strict_partitions=True).execute(context())
    assert DeltaLog.for_table(sales).latest_version() == version
    # A quote or a comment inside a partition value is data: nothing matches it, nothing is deleted.
    DeltaDeleteOperator(task_id="d", table=sales, partitions={"country": "DE' OR '1'='1"}).execute(context("d"))
    DeltaDeleteOperator(task_id="d2", table=sales, partitions={"country": "x') OR true --"}).execute(context("d2"))
    assert len(rows(spark, sales)) == 4
    capfd.readouterr()
    merge(sales, src, None).execute(context("unconstrained"))
    assert "not constrained to partitions" in "".join(capfd.readouterr())


def _merge_spec(table: str, src: str, country: str | None, run_id: str, policies: dict[str, Any]) -> Any:
    op = merge(table, src, country, conflict_policies=policies)
    snapshot = DeltaLog.for_table(table).snapshot()
    return op.build_spec(snapshot, RunIdentity("sales", f"merge_{country}", run_id))


def _race(spark: Any, table: str, a_src: str, b_src: str, a_country: str | None, b_country: str | None,
          policies: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    results: dict[str, Any] = {}

    def job_a(session: Any) -> None:
        token = session.conf.get(USER_METADATA_CONF)  # the gate holds commits tagged with it
        results["a"] = run_job(session, _merge_spec(table, a_src, a_country, token, policies))

    def job_b(session: Any) -> None:
        results["b"] = run_job(session, _merge_spec(table, b_src, b_country, "run-b", policies))

    return run_interleaved(spark, job_a, job_b), results


def test_concurrent_merges_on_different_partitions(spark: Any, sales: str, tmp_path: Any) -> None:
    de = source(spark, tmp_path, "de", [(1, 11, "2024-01-01", "DE")])
    fr = source(spark, tmp_path, "fr", [(3, 33, "2024-01-01", "FR")])
    fail_fast = {"ConcurrentAppendException": "fail"}
    # Without partition predicates both MERGEs read the whole table for Delta: the real conflict.
    race, _ = _race(spark, sales, de, fr, None, None, fail_fast)
    assert isinstance(race.a_error, ConflictFailure) and race.a_error.kind is ConflictKind.APPEND
    assert rows(spark, sales) == [(1, 0, "DE"), (2, 0, "DE"), (3, 33, "FR"), (4, 0, "FR")]
    # With them, both commit at the first attempt.
    race, results = _race(spark, sales, de, fr, "DE", "FR", fail_fast)
    assert race.a_error is None and race.b_error is None
    assert results["a"]["attempts"] == 1 and results["b"]["attempts"] == 1
    assert rows(spark, sales) == [(1, 11, "DE"), (2, 0, "DE"), (3, 33, "FR"), (4, 0, "FR")]


def test_overlapping_merges_retry_to_the_serial_result(spark: Any, sales: str, tmp_path: Any) -> None:
    a_src = source(spark, tmp_path, "a", [(1, 100, "2024-01-01", "DE"), (5, 5, "2024-01-01", "DE")])
    b_src = source(spark, tmp_path, "b", [(1, 200, "2024-01-01", "DE"), (6, 6, "2024-01-01", "DE")])
    race, results = _race(spark, sales, a_src, b_src, "DE", "DE", {"ConcurrentAppendException": FAST})
    assert race.a_error is None and race.b_error is None
    assert results["a"]["attempts"] == 2
    assert results["a"]["conflicts"][0]["kind"] == "ConcurrentAppendException"
    # Serial order: B, then A (A's retry re-read the table B changed, with the source read once).
    assert rows(spark, sales) == [(1, 100, "DE"), (2, 0, "DE"), (3, 0, "FR"), (4, 0, "FR"), (5, 5, "DE"),
                                  (6, 6, "DE")]


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
