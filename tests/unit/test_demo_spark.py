"""Where the demo runs its Spark jobs (``make demo --spark``), without starting Spark: the connection it gives
Airflow, the embedded option, and a server that fails to start. The whole demo runs in
``tests/airflow/test_example_dags.py``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from airflow_delta_occ.demo import spark_server
from airflow_delta_occ.demo.__main__ import main
from airflow_delta_occ.demo.spark_server import DemoSpark, demo_spark


def test_a_connect_server_becomes_the_default_delta_occ_connection() -> None:
    spark = DemoSpark("connect", url="sc://127.0.0.1:15002", ui_url="http://127.0.0.1:4041")
    [(name, value)] = spark.connection_env().items()
    assert name == "AIRFLOW_CONN_DELTA_OCC_DEFAULT"
    assert json.loads(value) == {"conn_type": "delta_occ", "extra": {
        "mode": "connect", "connect_url": "sc://127.0.0.1:15002", "spark_ui_url": "http://127.0.0.1:4041"}}


def test_embedded_starts_nothing_and_sets_no_connection(tmp_path: Path) -> None:
    with demo_spark("embedded", tmp_path / "spark") as spark:
        assert spark == DemoSpark("embedded") and spark.connection_env() == {}
    assert not (tmp_path / "spark").exists()
    with pytest.raises(ValueError, match="unknown Spark mode 'local'"), demo_spark("local", tmp_path):
        pass


def test_a_server_that_does_not_start_is_an_error_naming_its_logs(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spark_server, "SERVER_MODULE", "airflow_delta_occ.no_such_module")
    with pytest.raises(RuntimeError, match=f"(?s)did not start; see {re.escape(str(tmp_path))}.*No module named"), \
            demo_spark("connect", tmp_path, progress=lambda line: None):
        pass


def test_the_command_line_offers_connect_and_embedded(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--spark", "local"])
    err = capsys.readouterr().err
    assert "invalid choice: 'local'" in err and "connect" in err and "embedded" in err
