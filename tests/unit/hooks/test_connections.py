"""The ``delta_occ`` connection: Spark Connect through the Spark provider's connection, the form's
fields, and the test button (real ``java`` and ``spark-submit`` processes, no Spark session)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_delta_occ.demo import free_port
from airflow_delta_occ.exceptions import ProviderConfigError
from airflow_delta_occ.hooks.delta import DeltaSparkHook


def _conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))
    return conn_id


def test_connect_url_comes_from_the_spark_connect_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    _conn(monkeypatch, "spark_connect_prod", conn_type="spark_connect", host="connect.internal", port=15002,
          login="etl", password="s3cr3t token", extra={"use_ssl": True})
    conn = _conn(monkeypatch, "delta_connect", conn_type="delta_occ",
                 extra={"mode": "connect", "spark_connect_conn_id": "spark_connect_prod"})
    url = DeltaSparkHook(conn).connect_url()
    assert url == "sc://connect.internal:15002/;user_id=etl;token=s3cr3t%20token;use_ssl=True"


def test_a_token_in_connect_url_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = _conn(monkeypatch, "delta_token", conn_type="delta_occ",
                 extra={"mode": "connect", "connect_url": "sc://h:15002/;token=abc"})
    with pytest.raises(ProviderConfigError, match=r"carries a token.*spark_connect_conn_id"):
        DeltaSparkHook(conn).connect_url()
    plain = _conn(monkeypatch, "delta_plain", conn_type="delta_occ",
                  extra={"mode": "connect", "connect_url": "sc://h:15002"})
    assert DeltaSparkHook(plain).connect_url() == "sc://h:15002"


def test_connect_mode_without_a_server_names_both_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    conn = _conn(monkeypatch, "delta_none", conn_type="delta_occ", extra={"mode": "connect"})
    with pytest.raises(ProviderConfigError, match=r"spark_connect_conn_id.*connect_url"):
        DeltaSparkHook(conn).connect_url()


def test_the_form_lists_every_extra() -> None:
    from airflow.providers_manager import ProvidersManager

    widgets = ProvidersManager().connection_form_widgets
    fields = {k.removeprefix("extra__delta_occ__") for k in widgets if k.startswith("extra__delta_occ__")}
    assert fields == {"mode", "spark_conn_id", "spark_connect_conn_id", "connect_url", "master", "spark_conf",
                      "storage_conn_id", "spark_history_url", "spark_ui_url"}


def test_the_button_checks_java_for_embedded() -> None:
    ok, message = DeltaSparkHook(None, mode="embedded").test_connection()
    assert ok and "version" in message and "io.delta:delta-spark" in message, message


def test_the_button_checks_the_spark_connection_and_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    from pathlib import Path

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{__import__('os').environ['PATH']}")
    _conn(monkeypatch, "spark_local", conn_type="spark", host="local[2]")
    conn = _conn(monkeypatch, "delta_submit", conn_type="delta_occ",
                 extra={"mode": "spark-submit", "spark_conn_id": "spark_local"})
    ok, message = DeltaSparkHook(conn).test_connection()
    assert ok and "local[2]" in message and "4.2.0" in message, message
    missing = _conn(monkeypatch, "delta_submit_missing", conn_type="delta_occ",
                    extra={"mode": "spark-submit", "spark_conn_id": "no_such_spark"})
    ok, message = DeltaSparkHook(missing).test_connection()
    assert not ok and "no_such_spark" in message, message


def test_the_button_reports_an_unreachable_connect_server(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = _conn(monkeypatch, "delta_down", conn_type="delta_occ",
                 extra={"mode": "connect", "connect_url": f"sc://127.0.0.1:{free_port()}"})
    ok, message = DeltaSparkHook(conn).test_connection()
    assert not ok and message.startswith("connect:"), message


def test_delta_jars_are_named_by_delta_sparks_own_helper() -> None:
    """One name for the JVM side everywhere (embedded builder, spark-submit, the button), and it is the
    artifact of the installed wheels: delta-spark_<spark major.minor>_2.13 at delta-spark's version."""
    from importlib.metadata import version

    import pyspark

    from airflow_delta_occ.spark.session import delta_maven_coordinates, delta_submit_conf

    spark = ".".join(pyspark.__version__.split(".")[:2])
    assert delta_maven_coordinates() == f"io.delta:delta-spark_{spark}_2.13:{version('delta-spark')}"
    assert delta_submit_conf()["spark.jars.packages"] == delta_maven_coordinates()


def test_the_lease_store_form_keeps_its_labels_placeholders_and_every_extra() -> None:
    """Airflow 3 builds the form from the provider's info, not the hook (issue #24: the relabels were lost)."""
    from airflow.providers_manager import ProvidersManager

    from airflow_delta_occ.hooks.leases import DeltaLeaseStoreHook

    manager = ProvidersManager()
    shown = manager.field_behaviours["delta_occ_leases"]
    assert shown["relabeling"] == {"schema": "Database"}, shown
    assert "host" in shown["placeholders"] and "extra" in shown["placeholders"], shown
    hook = DeltaLeaseStoreHook.get_ui_field_behaviour()
    assert {k.replace("-", "_"): v for k, v in hook.items()} == shown   # one form, wherever it is read
    fields = {k.removeprefix("extra__delta_occ_leases__") for k in manager.connection_form_widgets
              if k.startswith("extra__delta_occ_leases__")}
    assert fields == {"backend", "path", "url"}


def test_a_connection_whose_spark_conf_names_the_commits_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection's ``spark_conf`` serves every job: a txnAppId there would make Delta skip the writes of every
    run after the first; refused when the hook is built, before any job."""
    conn = _conn(monkeypatch, "delta_named", conn_type="delta_occ",
                 extra={"mode": "embedded", "spark_conf": {"spark.databricks.delta.write.txnAppId": "etl"}})
    with pytest.raises(ProviderConfigError, match=r"connection 'delta_named' spark_conf sets spark\.databricks\.delta\."
                                                  r"write\.txnAppId: the provider names each commit"):
        DeltaSparkHook(conn)
    text = _conn(monkeypatch, "delta_text", conn_type="delta_occ",
                 extra={"mode": "embedded", "spark_conf": "spark.databricks.delta.write.txnAppId=etl"})
    with pytest.raises(ProviderConfigError, match=r"'delta_text': spark_conf must be an object of Spark settings, "
                                                  r"got str"):
        DeltaSparkHook(text)
    assert DeltaSparkHook(_conn(monkeypatch, "delta_null", conn_type="delta_occ",
                                extra={"mode": "embedded", "spark_conf": None})).spark_conf == {}
