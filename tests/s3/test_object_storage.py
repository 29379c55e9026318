"""Delta tables on a real S3 API: delta-spark writes through ``s3a://``, the engine reads the same log
with credentials from an Airflow connection, and an operator MERGEs on it through the embedded mode."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog, StorageError
from airflow_delta_occ.engine.storage import PyArrowStorage
from airflow_delta_occ.exceptions import UnsafeLogStoreError
from airflow_delta_occ.hooks.storage import storage_credentials
from airflow_delta_occ.operators.delta import DeltaMergeOperator

from ..spark.jobs import context, create_sales, rows
from .conftest import BUCKET


def _spark_files(spark: Any, path: str, where: str = "true") -> set[str]:
    """The data files delta-spark reads for ``where``, as paths relative to the table root."""
    names = spark.sql(f"SELECT DISTINCT input_file_name() AS f FROM delta.`{path}` WHERE {where}").collect()
    return {r["f"].split(path.split("://", 1)[1] + "/", 1)[1] for r in names}


def test_engine_reads_the_table_spark_wrote_with_the_connections_credentials(
        s3_spark: Any, s3_connection: str, s3_path: str) -> None:
    create_sales(s3_spark, s3_path)
    s3_spark.sql(f"UPDATE delta.`{s3_path}` SET v = 7 WHERE country = 'FR'")
    log = DeltaLog.for_table(s3_path, credentials=storage_credentials(s3_connection))
    assert isinstance(log.storage, PyArrowStorage)
    snapshot = log.snapshot()
    history = s3_spark.sql(f"DESCRIBE HISTORY delta.`{s3_path}`").collect()
    assert snapshot.version == max(r["version"] for r in history) == 2
    assert snapshot.partition_columns == ("date", "country")
    assert {f.path for f in snapshot.files()} == _spark_files(s3_spark, s3_path)
    de = {f.path for f in snapshot.files_matching("country = 'DE' AND date = '2024-01-01'")}
    assert de == _spark_files(s3_spark, s3_path, "country = 'DE'") and de
    assert [c.version for c in log.commits_after(0)] == [1, 2]


def test_a_missing_bucket_or_an_unreachable_store_is_typed_and_names_the_table(s3_connection: str) -> None:
    from airflow_delta_occ.engine import S3Credentials, TableNotFoundError

    good = storage_credentials(s3_connection)
    with pytest.raises(TableNotFoundError, match=f"{BUCKET}-missing/sales"):
        DeltaLog.for_table(f"s3a://{BUCKET}-missing/sales", credentials=good).snapshot()
    from airflow_delta_occ.demo import free_port

    nowhere = S3Credentials(access_key="a", secret_key="b", endpoint=f"http://127.0.0.1:{free_port()}",
                            region="us-east-1", path_style=True)
    with pytest.raises(StorageError, match=f"cannot list {BUCKET}/sales/_delta_log: .*Could not connect"):
        DeltaLog.for_table(f"s3a://{BUCKET}/sales", credentials=nowhere).snapshot()


def test_operator_merges_on_s3_through_the_embedded_mode(s3_spark: Any, s3_connection: str, s3_path: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    create_sales(s3_spark, s3_path)
    src = f"s3a://{BUCKET}/sources/{s3_path.rsplit('/', 1)[1]}"
    s3_spark.createDataFrame([(1, 10, "2024-01-01", "DE"), (9, 90, "2024-01-01", "DE")],
                             "id INT, v INT, date STRING, country STRING") \
        .selectExpr("id", "v", "CAST(date AS DATE) AS date", "country").write.format("delta").save(src)
    log = DeltaLog.for_table(s3_path, credentials=storage_credentials(s3_connection))
    before = log.snapshot()
    fr_files = {f.path for f in before.files_matching("country = 'FR'")}

    def merge(task_id: str) -> DeltaMergeOperator:
        return DeltaMergeOperator(task_id=task_id, table=s3_path, source=src, merge_condition="t.id = s.id",
                                  partitions={"date": "2024-01-01", "country": "DE"}, storage_conn_id=s3_connection)

    # Each embedded task starts its own driver, and Delta's default S3 LogStore is exclusive only
    # inside one: refused before anything is written.
    with pytest.raises(UnsafeLogStoreError, match="S3DynamoDBLogStore"):
        merge("refused").execute(context("refused"))
    assert log.latest_version() == before.version

    monkeypatch.setenv("AIRFLOW__DELTA_OCC__UNSAFE_S3_COMMITS", "warn")
    result = merge("m").execute(context("m"))
    assert result["confirmed"] and result["version"] == before.version + 1
    assert int(result["metrics"]["numTargetRowsUpdated"]) == 1 and int(result["metrics"]["numTargetRowsInserted"]) == 1
    assert rows(s3_spark, s3_path) == [(1, 10, "DE"), (2, 0, "DE"), (3, 0, "FR"), (4, 0, "FR"), (9, 90, "DE")]
    after = log.snapshot()
    assert {f.path for f in after.files_matching("country = 'FR'")} == fr_files  # the other partition untouched
    assert after.version == result["version"]


def test_s3_scheme_is_served_by_s3a(s3_spark: Any, s3_connection: str, s3_path: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``s3://`` (what AWS users write) reaches the same bucket: the engine through pyarrow, Spark through
    S3A mapped by the provider (OSS Spark has no s3:// filesystem of its own)."""
    create_sales(s3_spark, s3_path)
    s3_uri = s3_path.replace("s3a://", "s3://", 1)
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__UNSAFE_S3_COMMITS", "warn")
    result = DeltaMergeOperator(task_id="s3", table=s3_uri, source_query="SELECT 2 AS id, 5 AS v, "
                                "DATE'2024-01-01' AS date, 'DE' AS country", merge_condition="t.id = s.id",
                                clauses=[{"kind": "matched_update", "set": {"v": "s.v"}}],
                                partitions={"date": "2024-01-01", "country": "DE"},
                                storage_conn_id=s3_connection).execute(context("s3"))
    assert result["confirmed"] and result["table"] == s3_uri
    assert rows(s3_spark, s3_path) == [(1, 0, "DE"), (2, 5, "DE"), (3, 0, "FR"), (4, 0, "FR")]


def test_catalog_table_on_s3(s3_spark: Any, s3_connection: str, s3_path: str,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``table_name=``: the catalog gives the s3a:// location, the engine reads its log with the connection."""
    create_sales(s3_spark, s3_path)
    s3_spark.sql(f"CREATE TABLE default.sales_on_s3 USING delta LOCATION '{s3_path}'")
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__UNSAFE_S3_COMMITS", "warn")
    result = DeltaMergeOperator(task_id="cat", table_name="default.sales_on_s3", storage_conn_id=s3_connection,
                                source_query="SELECT 3 AS id, 33 AS v, DATE'2024-01-01' AS date, 'FR' AS country",
                                merge_condition="t.id = s.id",
                                clauses=[{"kind": "matched_update", "set": {"v": "s.v"}}],
                                partitions={"date": "2024-01-01", "country": "FR"}).execute(context("cat"))
    assert result["confirmed"] and result["table"] == "default.sales_on_s3"
    assert rows(s3_spark, s3_path) == [(1, 0, "DE"), (2, 0, "DE"), (3, 33, "FR"), (4, 0, "FR")]
