"""The storage settings reach the job in the remote modes too: a MERGE on ``s3a://`` through
``spark-submit`` (its own driver, settings as ``spark.hadoop.*`` confs, ``hadoop-aws`` added to its
packages) and through a Spark Connect server (settings on the job's Connect session)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.hooks.storage import storage_credentials
from airflow_delta_occ.operators.delta import DeltaMergeOperator
from airflow_delta_occ.spark.session import delta_submit_conf
from airflow_delta_occ.spark.storage import connector_packages

from ..servers import SMALL_SUBMIT_CONF, connect_server, spark_env
from ..spark.jobs import context, create_sales, rows


@pytest.fixture(scope="module")
def s3_connect(s3_spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A Connect server with delta-spark and the S3 connector on its classpath, and no S3 settings:
    the endpoint and keys come from each job's session."""
    from airflow_delta_occ.engine.object_store import StoreKind

    conf = delta_submit_conf()
    conf["spark.jars.packages"] += "," + ",".join(connector_packages([StoreKind.S3]))
    with connect_server(tmp_path_factory.mktemp("s3_connect"), conf) as server:
        yield server


def _merge(table: str, conn: str, task_id: str, storage_conn_id: str) -> dict[str, Any]:
    return DeltaMergeOperator(
        task_id=task_id, table=table, delta_conn_id=conn, storage_conn_id=storage_conn_id,
        source_query="SELECT 2 AS id, 7 AS v, DATE'2024-01-01' AS date, 'DE' AS country",
        merge_condition="t.id = s.id", clauses=[{"kind": "matched_update", "set": {"v": "s.v"}}],
        partitions={"date": "2024-01-01", "country": "DE"}).execute(context(task_id))


@pytest.mark.parametrize("mode", ["spark-submit", "connect"])
def test_merge_on_s3_in_a_remote_mode(mode: str, s3_spark: Any, s3_connection: str, s3_path: str,
                                      request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                                      tmp_path: Any) -> None:
    create_sales(s3_spark, s3_path)
    if mode == "spark-submit":
        for key, value in spark_env(tmp_path).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_S3", json.dumps({"conn_type": "spark", "host": "local[2]"}))
        extra: dict[str, Any] = {"mode": mode, "spark_conn_id": "spark_s3", "spark_conf": dict(SMALL_SUBMIT_CONF)}
        # Its own driver: the default S3 LogStore could lose commits; this test is the only writer.
        monkeypatch.setenv("AIRFLOW__DELTA_OCC__UNSAFE_S3_COMMITS", "warn")
        commands = _record_spark_submit_commands(monkeypatch)
    else:
        extra = {"mode": mode, "connect_url": request.getfixturevalue("s3_connect")["url"]}
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_S3", json.dumps({"conn_type": "delta_occ", "extra": extra}))
    result = _merge(s3_path, "delta_occ_s3", f"m_{mode.replace('-', '_')}", s3_connection)
    assert result["confirmed"]
    assert DeltaLog.for_table(s3_path, credentials=storage_credentials(s3_connection)).latest_version() == \
        result["version"] == 2
    assert rows(s3_spark, s3_path) == [(1, 0, "DE"), (2, 7, "DE"), (3, 0, "FR"), (4, 0, "FR")]
    if mode == "spark-submit":
        # The driver reached the bucket with the secret key, which never was on a command line.
        secret = storage_credentials(s3_connection).secret_key
        assert commands and secret and not any(secret in " ".join(c) for c in commands), commands


def _record_spark_submit_commands(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every command line spark-submit is started with (the real process still runs)."""
    import subprocess

    real, seen = subprocess.Popen, []

    def popen(args: Any, *rest: Any, **kwargs: Any) -> Any:
        if isinstance(args, list) and any("spark-submit" in str(a) for a in args[:1]):
            seen.append([str(a) for a in args])
        return real(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    return seen
