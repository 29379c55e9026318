"""A job's own ``spark_conf`` reaches its Spark Connect session, on a real Connect server.

The server is the spark tier's shared one (``connect_server`` in ``conftest.py``). The table is
created and read through Connect sessions too, so this module starts no local Spark of its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from airflow_delta_occ.exceptions import ProviderConfigError
from airflow_delta_occ.hooks.delta import DeltaSparkHook
from airflow_delta_occ.operators.delta import DeltaMergeOperator

from .jobs import context, create_sales, rows


@pytest.fixture
def connect_conn(connect_server: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_CONF", json.dumps(
        {"conn_type": "delta_occ", "extra": {"mode": "connect", "connect_url": connect_server["url"]}}))
    return "delta_occ_conf"


def test_a_connect_job_runs_with_its_spark_conf(connect_conn: str, tmp_path: Path) -> None:
    """``spark.sql.files.maxRecordsPerFile=1`` in the job's ``spark_conf`` makes its MERGE write each of
    the three rows it inserts to a file of its own, so the commit's file count shows the setting the
    job ran with (the server's default writes them together). A server-wide key
    (``spark.executor.memory``) cannot change per session: it is skipped, named in a warning, and the
    job still runs."""
    table = str(tmp_path / "sales")
    with DeltaSparkHook(connect_conn).job_session() as spark:
        create_sales(spark, table)
        assert spark.conf.get("spark.sql.files.maxRecordsPerFile") != "1"  # the server's own value
    with structlog.testing.capture_logs() as logs:  # the hook logs through Airflow's structlog
        result = DeltaMergeOperator(
            task_id="m_conf", table=table, delta_conn_id=connect_conn,
            spark_conf={"spark.sql.files.maxRecordsPerFile": "1", "spark.executor.memory": "1g"},
            source_query="SELECT id, 7 AS v, DATE'2024-01-01' AS date, 'DE' AS country FROM VALUES (5), (6), (7) "
                         "AS src(id)",
            merge_condition="t.id = s.id", clauses=[{"kind": "not_matched_insert_all"}],
            partitions={"date": "2024-01-01", "country": "DE"}).execute(context("m_conf"))
    assert result["confirmed"] and int(result["metrics"]["numTargetFilesAdded"]) == 3, result["metrics"]
    with DeltaSparkHook(connect_conn).job_session() as spark:
        assert rows(spark, table) == [(1, 0, "DE"), (2, 0, "DE"), (3, 0, "FR"), (4, 0, "FR"), (5, 7, "DE"),
                                      (6, 7, "DE"), (7, 7, "DE")]
    warnings = [str(e["event"]) % tuple(e.get("positional_args", ())) for e in logs if e["log_level"] == "warning"]
    skipped = [line for line in warnings if "spark.executor.memory" in line]
    assert skipped and "spark.sql.shuffle.partitions" not in skipped[0], warnings


def test_a_value_the_connect_server_rejects_is_a_typed_error_naming_the_key(connect_conn: str) -> None:
    hook = DeltaSparkHook(connect_conn, spark_conf={"spark.sql.shuffle.partitions": "three"})
    with pytest.raises(ProviderConfigError, match=r"spark\.sql\.shuffle\.partitions.*three"):
        with hook.job_session():
            pass
