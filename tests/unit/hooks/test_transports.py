"""``DeltaSparkHook`` picks one ``JobTransport`` from its mode; ``MemoryTransport`` runs jobs without Spark
through the hook's real decoding (status -> exception, ``on_kill`` -> ``JobKilledError``)."""

from __future__ import annotations

import ast
import inspect
import json
import threading
from typing import Any

import pytest

from airflow_delta_occ.engine.errors import TableNotFoundError
from airflow_delta_occ.exceptions import ConflictFailure, DeltaJobError, JobKilledError, ProviderConfigError
from airflow_delta_occ.hooks import delta as delta_module
from airflow_delta_occ.hooks.delta import DeltaSparkHook
from airflow_delta_occ.hooks.transports import MemoryTransport, register_transport, unregister_transport
from airflow_delta_occ.hooks.transports.base import TableDescription
from airflow_delta_occ.hooks.transports.connect import ConnectTransport
from airflow_delta_occ.hooks.transports.embedded import EmbeddedTransport
from airflow_delta_occ.hooks.transports.submit import SubmitTransport
from airflow_delta_occ.jobs.result import JobResult, JobStatus
from airflow_delta_occ.jobs.spec import JobSpec
from airflow_delta_occ.retry.classify import ConflictKind

pytestmark = pytest.mark.unit

SPEC = JobSpec.from_json('{"operation": "delete", "target": {"path": "/lake/t"}, "run": {"dag_id": "d", '
                         '"task_id": "t", "run_id": "r", "map_index": -1, "try_number": 1, "first_try": 1}, '
                         '"condition": null}')


@pytest.mark.parametrize(("mode", "transport"), [("embedded", EmbeddedTransport), ("spark-submit", SubmitTransport),
                                                 ("connect", ConnectTransport)])
def test_each_mode_has_its_transport(mode: str, transport: type) -> None:
    hook = DeltaSparkHook(None, mode=mode)
    assert type(hook.transport) is transport and hook.transport.mode == mode and hook.transport.host is hook


def test_an_unknown_mode_is_refused_as_before() -> None:
    with pytest.raises(DeltaJobError, match=r"unknown mode 'memory' in connection None; use one of "
                                            r"\('embedded', 'spark-submit', 'connect'\)"):
        DeltaSparkHook(None, mode="memory")


def test_the_hook_branches_on_its_mode_nowhere() -> None:
    """Every difference between the modes lives in a transport."""
    tree = ast.parse(inspect.getsource(delta_module))
    compared = [node for node in ast.walk(tree) if isinstance(node, ast.Compare)
                and any(isinstance(side, ast.Attribute) and side.attr == "mode"
                        for side in (node.left, *node.comparators))]
    assert compared == []


def test_the_built_in_modes_cannot_be_replaced() -> None:
    for mode in ("embedded", "spark-submit", "connect", ""):
        with pytest.raises(ProviderConfigError, match="cannot register a transport"):
            register_transport(mode, MemoryTransport().bind)


def test_a_registered_mode_is_chosen_by_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_MEM", json.dumps({"conn_type": "delta_occ", "extra": {"mode": "memory"}}))
    spark = MemoryTransport([MemoryTransport.success(version=7, metrics={"numDeletedRows": "2"})])
    with spark.registered("memory"):
        hook = DeltaSparkHook("delta_mem")
        result = hook.run(SPEC)
    assert hook.mode == "memory" and hook.transport is spark and spark.hosts == [hook]
    assert (result.status, result.table, result.operation, result.version) == (JobStatus.SUCCESS, "/lake/t",
                                                                               "delete", 7)
    assert spark.specs == [SPEC]
    with pytest.raises(DeltaJobError, match="unknown mode 'memory'"):  # gone with the block
        DeltaSparkHook("delta_mem")


def test_outcomes_are_decoded_like_a_real_jobs() -> None:
    conflict = JobResult(status=JobStatus.CONFLICT, table="/lake/t", operation="delete", attempts=3,
                         error="ConcurrentAppendException after 3 attempt(s)", conflict=ConflictKind.APPEND)
    spark = MemoryTransport([conflict, OSError("the driver died")])
    hook = DeltaSparkHook(None, transport=spark)
    with pytest.raises(ConflictFailure, match="after 3 attempt"):
        hook.run(SPEC)
    with pytest.raises(OSError, match="the driver died"):
        hook.run(SPEC)
    assert hook.run(SPEC).version is None  # the queue is empty: a success that committed nothing
    assert len(spark.specs) == 3


def test_a_killed_job_is_job_killed_unless_it_committed() -> None:
    def job(spec: JobSpec) -> JobResult:
        started.set()
        assert spark.kill_requested.wait(60)
        if spark.kills == 1:
            raise RuntimeError("the session was stopped")
        return MemoryTransport.success(version=4)  # the commit beat the kill

    started = threading.Event()
    spark = MemoryTransport(job)
    hook = DeltaSparkHook(None, transport=spark)
    hook.on_kill()  # no job: nothing happens
    assert spark.kills == 0
    for expected in (JobKilledError, None):
        outcome: dict[str, Any] = {}

        def run(outcome: dict[str, Any] = outcome) -> None:
            try:
                outcome["result"] = hook.run(SPEC)
            except Exception as exc:
                outcome["error"] = exc

        started.clear()
        thread = threading.Thread(target=run)
        thread.start()
        assert started.wait(60)
        assert hook._running is not None
        hook.on_kill()
        thread.join(60)
        if expected is JobKilledError:
            assert isinstance(outcome["error"], JobKilledError)
            assert "the memory job on /lake/t was stopped by on_kill" in str(outcome["error"])
        else:
            assert outcome["result"].version == 4
    assert hook._running is None and spark.kills == 2


def test_table_location_and_the_test_button() -> None:
    spark = MemoryTransport(tables={"db.sales": "/lake/sales", "db.csv": TableDescription("/lake/csv", "csv")},
                            connection=(False, "memory: down"))
    hook = DeltaSparkHook(None, transport=spark)
    assert hook.table_location("db.sales") == "/lake/sales"
    with pytest.raises(TableNotFoundError, match="the catalog table is csv, not Delta"):
        hook.table_location("db.csv")
    with pytest.raises(TableNotFoundError, match="no such table"):
        hook.table_location("db.nope")
    assert hook.test_connection() == (False, "memory: down")


def test_a_transport_without_a_session_says_so() -> None:
    with pytest.raises(ProviderConfigError, match="the memory transport has no Spark session"):
        DeltaSparkHook(None, transport=MemoryTransport()).get_spark()


def test_unregistering_an_unknown_mode_does_nothing() -> None:
    unregister_transport("never-registered")
