"""The operators' "Spark UI" extra link: where it points in each mode, and that only http(s) URLs
reach the Airflow UI. (The Connect example DAG in tests/spark/test_cluster_modes.py proves the link a
real task stores opens the server's UI.)"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_delta_occ.exceptions import ProviderConfigError
from airflow_delta_occ.hooks.delta import DeltaSparkHook
from airflow_delta_occ.hooks.transports import MemoryTransport
from airflow_delta_occ.operators.delta import DeltaDeleteOperator
from airflow_delta_occ.operators.links import SparkUILink

pytestmark = pytest.mark.unit


def _hook(monkeypatch: pytest.MonkeyPatch, **extra: Any) -> DeltaSparkHook:
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_UI", json.dumps({"conn_type": "delta_occ", "extra": extra}))
    return DeltaSparkHook("delta_ui")


def test_the_history_server_wins_when_the_application_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _hook(monkeypatch, mode="spark-submit", spark_history_url="https://history.internal:18080/",
                 spark_ui_url="https://spark.internal")
    assert hook.spark_ui_link("app-2024/1", "http://worker:4040") == \
        "https://history.internal:18080/history/app-2024%2F1/jobs/"
    # Without an application id (the driver died before reporting) the configured UI is next.
    assert hook.spark_ui_link(None, None) == "https://spark.internal"


def test_the_drivers_own_ui_then_the_connect_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _hook(monkeypatch, mode="embedded").spark_ui_link("local-1", "http://worker:4041") == "http://worker:4041"
    assert _hook(monkeypatch, mode="embedded").spark_ui_link("local-1", None) is None
    connect = _hook(monkeypatch, mode="connect", connect_url="sc://connect.internal:15002")
    assert connect.spark_ui_link(None, None) == "http://connect.internal:4040"
    assert connect.spark_ui_link("app-1", "http://10.0.0.5:4050") == "http://10.0.0.5:4050"


@pytest.mark.parametrize("key", ["spark_history_url", "spark_ui_url"])
def test_a_link_that_is_not_http_is_refused(monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    with pytest.raises(ProviderConfigError, match=f"{key} must be an http\\(s\\) URL"):
        _hook(monkeypatch, **{key: "javascript:alert(1)"})


def test_the_link_reads_the_hook_of_the_operator_that_ran(monkeypatch: pytest.MonkeyPatch,
                                                          sales_log: tuple[str, Any]) -> None:
    operator = DeltaDeleteOperator(task_id="d", table=sales_log[0], partitions={"date": "2024-01-01", "country": "DE"})
    link, key = SparkUILink(), SimpleNamespace()
    assert SparkUILink in {type(x) for x in operator.operator_extra_links}
    assert link.get_link(operator, ti_key=key) == ""  # no job ran: no hook was built
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_DEFAULT",
                       json.dumps({"conn_type": "delta_occ", "extra": {"mode": "memory"}}))
    spark = MemoryTransport([MemoryTransport.success(spark_app_id="local-1", spark_ui_url="http://worker:4040")])
    with spark.registered("memory"):
        operator.execute({"ti": SimpleNamespace(dag_id="dag", task_id="d", map_index=-1, try_number=1, max_tries=2),
                          "run_id": "manual__1"})
    assert [spec.operation for spec in spark.specs] == ["delete"]
    assert link.get_link(operator, ti_key=key) == "http://worker:4040"  # the driver's UI, as the job reported it
    operator.hook.spark_ui_url = "javascript:alert(1)"  # never rendered, whatever a hook holds
    assert link.get_link(operator, ti_key=key) == ""


def test_a_driver_ui_that_is_not_http_is_not_linked() -> None:
    """What the job reports about its driver is not trusted either (the memory transport stands in)."""
    from airflow_delta_occ.jobs.spec import JobSpec

    spark = MemoryTransport([MemoryTransport.success(spark_ui_url="javascript:alert(1)")])
    hook = DeltaSparkHook(None, transport=spark)
    hook.run(JobSpec.from_json(
        '{"operation": "delete", "target": {"path": "/lake/t"}, "run": {"dag_id": "d", "task_id": "t", '
        '"run_id": "r", "map_index": -1, "try_number": 1, "first_try": 1}, "condition": null}'))
    assert hook.spark_ui_url is None
