"""``DeltaConflictSensor`` and ``DeltaLeaseReleaseOperator`` against a real SQLite lease store and a
hand-written Delta log (``sales``: partitioned by date and country, two files in DE and FR)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.bases.operator import TriggerFailureReason
from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException, TaskDeferred

from airflow_delta_occ.engine import Snapshot
from airflow_delta_occ.engine.planner import TableState, plan_footprint
from airflow_delta_occ.exceptions import (
    JobSpecError,
    LeaseOwnershipError,
    LeaseStoreError,
    PartitionSpecError,
    PoolConfigError,
    UnsafeExpressionError,
)
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
from airflow_delta_occ.pools.requests import AuditKind, LeaseRequest, LeaseStatus, utc_text
from airflow_delta_occ.sensors import DeltaConflictSensor, DeltaLeaseReleaseOperator
from airflow_delta_occ.triggers.lease import DeltaLeaseTrigger

from ..triggers.test_lease_trigger import _first_event

pytestmark = pytest.mark.unit


@pytest.fixture
def pools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "pools.toml"
    path.write_text(f'[pools.sales]\ntables = ["{tmp_path}/sales"]\nairflow_pool = "delta_sales"\n'
                    'lease_ttl = "30s"\nheartbeat = "2s"\n')
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(path))
    return path


def _context(task_id: str = "wait", xcom: Any = None) -> dict[str, Any]:
    pushed: dict[str, Any] = {}
    ti = SimpleNamespace(dag_id="d", task_id=task_id, map_index=-1, try_number=1, max_tries=1,
                         xcom_pull=lambda task_ids: xcom, xcoms=pushed,
                         xcom_push=lambda key, value: pushed.__setitem__(key, value))
    return {"ti": ti, "run_id": "manual__1"}


def _sensor(table: str, **kwargs: Any) -> DeltaConflictSensor:
    kwargs.setdefault("operation", "update")
    kwargs.setdefault("conflict_pool", "sales")
    return DeltaConflictSensor(task_id=kwargs.pop("task_id", "wait"), table=table, **kwargs)


def _hold(store: SqlLeaseStore, table: str, snapshot: Snapshot, owner: str, predicate: str | None) -> str:
    """A lease held by another job on ``predicate`` (an UPDATE), as an operator would take it."""
    state = store.acquire(LeaseRequest.of(pool="sales", table=f"file://{table}", owner=owner,
                                          footprint=plan_footprint(snapshot, "UPDATE", predicate),
                                          table_state=TableState.of(snapshot), ttl=30.0))
    assert state.granted
    return state.request_id


# -- parse time -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"operation": "truncate"}, JobSpecError, r"operation must be one of merge, update, .*, got 'truncate'"),
    ({"operation": None}, JobSpecError, "operation must be one of"),
    ({"conflict_pool": "nope"}, PoolConfigError, r"conflict_pool='nope'.*unknown pool 'nope'"),
    ({"lease_ttl": 0}, JobSpecError, "lease_ttl must be a positive number of seconds, got 0"),
    ({"lease_ttl": True}, JobSpecError, "lease_ttl must be a positive number"),
    ({"partitions": {"country": None}}, PartitionSpecError, "country"),
    ({"condition": "id = 1; DROP TABLE x"}, UnsafeExpressionError, "condition is not accepted"),
    ({"properties": ["a"]}, JobSpecError, "properties must be a mapping"),
])
def test_bad_arguments_fail_at_parse_time(pools: Path, kwargs: dict[str, Any], error: type[Exception],
                                          message: str) -> None:
    with pytest.raises(error, match=message):
        _sensor("/lake/t", **kwargs)


def test_the_sensor_runs_in_the_pools_airflow_pool_and_takes_planner_operations(pools: Path) -> None:
    sales = str(pools.parent / "sales")
    assert _sensor(sales).pool == "delta_sales"
    assert _sensor(sales, pool="mine").pool == "mine"
    assert _sensor(sales, operation=" SET_Properties ").planner_operation == "SET_PROPERTIES"
    assert _sensor(sales, operation="append").planner_operation == "INSERT"


def test_release_needs_exactly_one_source_of_the_lease() -> None:
    with pytest.raises(JobSpecError, match="exactly one of sensor_task_id= or lease="):
        DeltaLeaseReleaseOperator(task_id="r")
    assert DeltaLeaseReleaseOperator(task_id="r", sensor_task_id="wait").trigger_rule == "all_done"


# -- the footprint it plans -----------------------------------------------------------------------
def test_the_footprint_is_the_partition_filter_and_condition(pools: Path, sales_log: tuple[str, Snapshot]) -> None:
    table, snapshot = sales_log
    de = _sensor(table, partitions={"date": "2024-01-01", "country": "DE"}, condition="id > 5").footprint(snapshot)
    assert sorted(de.read_files) == sorted(de.removes) == ["DE-0.parquet", "DE-1.parquet"]
    whole = _sensor(table, operation="optimize").footprint(snapshot)
    assert len(whole.removes) == 4
    props = _sensor(table, operation="set_properties", properties={"a": "b"}).footprint(snapshot)
    assert props.metadata is not None and props.metadata.configuration.get("a") == "b"


def test_unknown_properties_conflict_with_every_writer(pools: Path, sales_log: tuple[str, Snapshot]) -> None:
    """Without ``properties=`` a set_properties writer is not taken to change nothing (which the planner
    would let any writer rebase over): it conflicts even with an UPDATE of another partition."""
    from airflow_delta_occ.engine.planner import can_conflict

    table, snapshot = sales_log
    unknown = _sensor(table, operation="set_properties").footprint(snapshot)
    assert can_conflict(plan_footprint(snapshot, "UPDATE", "country = 'FR'"), unknown, snapshot).conflict


def test_an_append_is_placed_only_where_partitions_pin_every_column(pools: Path, sales_log: tuple[str, Snapshot]
                                                                    ) -> None:
    from airflow_delta_occ.engine.planner import can_conflict

    table, snapshot = sales_log
    update_fr = plan_footprint(snapshot, "UPDATE", "country = 'FR'")
    pinned = _sensor(table, operation="append", partitions={"date": "2024-01-01", "country": "DE"})
    open_column = _sensor(table, operation="append", partitions={"country": "DE"})
    # Pinned to DE: an UPDATE of FR cannot see its files. One column open: it may write anywhere.
    assert can_conflict(update_fr, pinned.footprint(snapshot), snapshot).conflict is False
    assert can_conflict(update_fr, open_column.footprint(snapshot), snapshot).conflict is True


# -- run time, against a real lease store ---------------------------------------------------------
def test_granted_at_once_it_succeeds_holding_the_lease(pools: Path, store: SqlLeaseStore,
                                                       sales_log: tuple[str, Snapshot]) -> None:
    table, _ = sales_log
    out = _sensor(table, partitions={"date": "2024-01-01", "country": "DE"}, lease_ttl=120).execute(_context())
    assert out["pool"] == "sales" and out["owner"] == "d/wait/manual__1/-1/1" and out["waited_for"] == []
    assert out["expires_in"] == pytest.approx(120.0) and out["table"] == table and out["waited"] == 0.0
    assert set(out) == {"pool", "request_id", "owner", "table", "waited", "waited_for", "expires_in"}
    json.dumps(out)  # an XCom: plain JSON
    [held] = store.holders()
    assert held.granted_at is not None and held.request_id == out["request_id"]
    assert held.expires_at - held.granted_at == pytest.approx(120.0)


def test_a_conflicting_holder_defers_it_and_a_disjoint_one_does_not(pools: Path, store: SqlLeaseStore,
                                                                    sales_log: tuple[str, Snapshot]) -> None:
    table, snapshot = sales_log
    _hold(store, table, snapshot, "job-de", "country = 'DE'")
    fr = _sensor(table, task_id="fr", partitions={"date": "2024-01-01", "country": "FR"})
    assert fr.execute(_context("fr"))["waited_for"] == []
    de = _sensor(table, task_id="de", partitions={"date": "2024-01-01", "country": "DE"}, poke_interval=0.5)
    context = _context("de")
    with pytest.raises(TaskDeferred) as deferred:
        de.execute(context)
    trigger = deferred.value.trigger
    # Issue #24: whom it waits for, where the UI shows it (the task instance's XCom tab).
    assert [b["owner"] for b in context["ti"].xcoms["delta_occ_wait"]["waits_for"]] == ["job-de"]
    assert isinstance(trigger, DeltaLeaseTrigger) and trigger.poll_interval == 0.5
    assert trigger.owner == "d/de/manual__1/-1/1"
    assert deferred.value.method_name == "execute_complete"
    [waiter] = store.waiters()
    assert waiter.request_id == trigger.request_id


def _defer(sensor: DeltaConflictSensor, context: dict[str, Any]) -> DeltaLeaseTrigger:
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context)
    trigger = deferred.value.trigger
    assert isinstance(trigger, DeltaLeaseTrigger)
    return trigger


def test_execute_complete_hands_over_the_granted_lease_renewed(pools: Path, store: SqlLeaseStore,
                                                               sales_log: tuple[str, Snapshot],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The whole wait: deferred behind a holder, granted in the trigger when it is released, handed over
    with its TTL started again (the grant happened in the triggerer, before the sensor resumed)."""
    table, snapshot = sales_log
    holder = _hold(store, table, snapshot, "job-de", "country = 'DE'")
    sensor = _sensor(table, partitions={"date": "2024-01-01", "country": "DE"}, poke_interval=0.05, lease_ttl=60)
    trigger = _defer(sensor, _context())
    timer = threading.Timer(0.3, store.release, (holder, "job-de"))
    timer.start()
    event = asyncio.run(_first_event(trigger))
    timer.join()
    assert event["status"] == "granted"
    out = sensor.execute_complete(_context(), event)
    assert (out["request_id"], out["waited_for"], out["expires_in"]) == (trigger.request_id, ["job-de"], 60.0)
    assert out["waited"] >= 0.2
    [held] = store.holders()
    assert held.granted_at is not None and held.request_id == out["request_id"]
    assert held.expires_at - held.granted_at >= 60.0  # renewed at the hand-over
    assert store.history()[-1].kind is AuditKind.RENEW
    [renewed] = [line for line in capsys.readouterr().out.splitlines() if "renewed at the hand-over" in line]
    assert f"until {utc_text(held.expires_at)}" in renewed, renewed   # a time people read, not epoch seconds


def test_the_hand_over_names_whom_the_sensor_waited_for_before_it_deferred(
        pools: Path, store: SqlLeaseStore, sales_log: tuple[str, Snapshot]) -> None:
    """The holder is gone before the trigger's first poll: the grant still names it (issue #24: the
    sensor logged that it waited for a task, then "waited ... for nobody" with ``waited_for: []``)."""
    table, snapshot = sales_log
    holder = _hold(store, table, snapshot, "job-de", "country = 'DE'")
    sensor = _sensor(table, partitions={"date": "2024-01-01", "country": "DE"}, poke_interval=0.05)
    trigger = _defer(sensor, _context())
    store.release(holder, "job-de")
    event = asyncio.run(_first_event(trigger))
    assert event["status"] == "granted"
    assert sensor.execute_complete(_context(), event)["waited_for"] == ["job-de"]


def test_a_lease_that_expired_before_the_sensor_resumed_is_asked_for_again(
        pools: Path, store: SqlLeaseStore, sales_log: tuple[str, Snapshot]) -> None:
    table, _ = sales_log
    event = {"status": "granted", "request_id": "gone", "waited": 2.5, "blockers_seen": []}
    out = _sensor(table).execute_complete(_context(), event)
    assert out["request_id"] != "gone" and [h.request_id for h in store.holders()] == [out["request_id"]]


def test_a_trigger_error_fails_the_sensor_and_cancels_its_request(pools: Path, store: SqlLeaseStore,
                                                                  sales_log: tuple[str, Snapshot]) -> None:
    table, snapshot = sales_log
    _hold(store, table, snapshot, "job-de", "country = 'DE'")
    sensor = _sensor(table, partitions={"date": "2024-01-01", "country": "DE"})
    trigger = _defer(sensor, _context())
    with pytest.raises(LeaseStoreError, match="waiting for a lease failed: store down"):
        sensor.execute_complete(_context(), {"status": "error", "request_id": trigger.request_id,
                                             "message": "store down"})
    assert store.waiters() == [] and [h.owner for h in store.holders()] == ["job-de"]


@pytest.mark.parametrize("soft_fail", [False, True])
def test_a_sensor_that_times_out_cancels_its_request(pools: Path, store: SqlLeaseStore,
                                                     sales_log: tuple[str, Snapshot], soft_fail: bool) -> None:
    """The scheduler ends a deferral past ``timeout`` by resuming the task with ``__fail__`` (the triggerer
    cancels the trigger without ``on_kill``): the sensor cancels its request, then fails as sensors do.
    The next writer in line is then granted as soon as the holder is done."""
    table, snapshot = sales_log
    holder = _hold(store, table, snapshot, "job-de", "country = 'DE'")
    sensor = _sensor(table, partitions={"date": "2024-01-01", "country": "DE"}, timeout=1, soft_fail=soft_fail)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(_context())
    assert deferred.value.timeout is not None and deferred.value.timeout.total_seconds() == 1.0
    assert len(store.waiters()) == 1
    expected = AirflowSkipException if soft_fail else AirflowSensorTimeout
    with pytest.raises(expected):
        sensor.resume_execution("__fail__", {"error": TriggerFailureReason.TRIGGER_TIMEOUT}, _context())
    assert store.waiters() == [] and [h.request_id for h in store.holders()] == [holder]
    assert store.history()[-1].kind is AuditKind.CANCEL


def test_the_release_step_frees_the_table_for_the_next_writer(pools: Path, store: SqlLeaseStore,
                                                              sales_log: tuple[str, Snapshot]) -> None:
    table, snapshot = sales_log
    lease = _sensor(table, operation="set_properties").execute(_context())
    next_job = store.acquire(LeaseRequest.of(pool="sales", table=f"file://{table}", owner="next",
                                             footprint=plan_footprint(snapshot, "UPDATE", "country = 'FR'"),
                                             table_state=TableState.of(snapshot), ttl=30.0))
    assert not next_job.granted  # a metadata change conflicts with every writer
    release = DeltaLeaseReleaseOperator(task_id="release", sensor_task_id="wait")
    assert release.execute(_context("release", xcom=lease)) is True
    assert store.poll(next_job.request_id, "next").status is LeaseStatus.GRANTED
    # Again (a retry of the release step): the lease is already gone, which is no error.
    assert release.execute(_context("release", xcom=lease)) is False


def test_the_release_step_without_a_lease_does_nothing_and_a_wrong_owner_fails(
        pools: Path, store: SqlLeaseStore, sales_log: tuple[str, Snapshot]) -> None:
    table, _ = sales_log
    release = DeltaLeaseReleaseOperator(task_id="release", sensor_task_id="wait")
    assert release.execute(_context("release", xcom=None)) is False
    lease = _sensor(table).execute(_context())
    with pytest.raises(LeaseOwnershipError):
        release.execute(_context("release", xcom={**lease, "owner": "someone-else"}))
    with pytest.raises(JobSpecError, match="not a lease handed over by DeltaConflictSensor"):
        release.execute(_context("release", xcom={"pool": "sales"}))
    assert [h.request_id for h in store.holders()] == [lease["request_id"]]


def test_a_table_outside_the_pool_or_without_a_log_fails_before_asking(pools: Path, store: SqlLeaseStore,
                                                                       tmp_path: Path) -> None:
    from airflow_delta_occ.engine.errors import TableNotFoundError

    with pytest.raises(PoolConfigError, match="is not in conflict pool 'sales'"):
        _sensor(str(tmp_path / "elsewhere"))   # a literal location: when the DAG is parsed
    sensor = _sensor("{{ params.table }}")
    sensor.render_template_fields({"params": {"table": str(tmp_path / "elsewhere")}})  # type: ignore[arg-type]
    with pytest.raises(PoolConfigError, match="is not in conflict pool 'sales'"):
        sensor.execute(_context())
    with pytest.raises(TableNotFoundError):
        _sensor(str(tmp_path / "sales")).execute(_context())
    assert store.records() == []


# -- hostile text ---------------------------------------------------------------------------------
def test_a_condition_cannot_escape_the_partition_filter(pools: Path, sales_log: tuple[str, Snapshot]) -> None:
    """``condition`` is ANDed as a parse tree: an OR inside it widens nothing beyond ``partitions=``."""
    table, snapshot = sales_log
    fp = _sensor(table, partitions={"date": "2024-01-01", "country": "DE"},
                 condition="country = 'FR' OR 1 = 1").footprint(snapshot)
    assert sorted(fp.removes) == ["DE-0.parquet", "DE-1.parquet"]
    with pytest.raises(UnsafeExpressionError):
        _sensor(table, condition="1 = 1) OR (1 = 1")


def test_a_hostile_partition_value_is_one_literal_value(pools: Path, sales_log: tuple[str, Snapshot]) -> None:
    """A quote in a partition value names a partition with that odd name; it never opens the filter."""
    table, snapshot = sales_log
    fp = _sensor(table, partitions={"date": "2024-01-01", "country": "DE' OR '1'='1"}).footprint(snapshot)
    assert dict(fp.removes) == {} and dict(fp.read_files) == {}


def test_a_hostile_lease_in_the_xcom_releases_nothing(pools: Path, store: SqlLeaseStore,
                                                      sales_log: tuple[str, Snapshot]) -> None:
    table, _ = sales_log
    lease = _sensor(table).execute(_context())
    release = DeltaLeaseReleaseOperator(task_id="release", sensor_task_id="wait")
    hostile = {**lease, "request_id": "x' OR '1'='1"}
    assert release.execute(_context("release", xcom=hostile)) is False
    assert [h.request_id for h in store.holders()] == [lease["request_id"]]


def test_the_sensor_names_each_job_operation_as_the_operators_plan_it() -> None:
    """Every job operation is a sensor operation, planned as the operators plan it, and every sensor
    operation is one of the planner's."""
    from airflow_delta_occ.engine.planner import Operation
    from airflow_delta_occ.jobs.footprint import engine_operation
    from airflow_delta_occ.jobs.operations import JobOperation
    from airflow_delta_occ.sensors.conflict import SENSOR_OPERATIONS

    assert {Operation(v) for v in SENSOR_OPERATIONS.values()} <= set(Operation)
    for operation in JobOperation:
        spec = type("Spec", (), {"operation": operation, "zorder_by": ()})()
        assert SENSOR_OPERATIONS[operation.value] == engine_operation(spec)  # type: ignore[arg-type]


def test_the_storage_connection_defaults_to_the_delta_occ_connections(tmp_path: Path, store: SqlLeaseStore,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The sensor reads an object-store table's log with the credentials its writer uses: its own
    ``storage_conn_id``, else the ``delta_occ`` connection's (here neither exists, so the error names
    the connection that was consulted, before anything is read or asked)."""
    from airflow_delta_occ.exceptions import StorageConnectionError

    path = tmp_path / "pools.toml"
    path.write_text('[pools.lake]\ntables = ["s3://lake/sales"]\n')
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(path))
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_DEFAULT", json.dumps(
        {"conn_type": "delta_occ", "extra": {"storage_conn_id": "platform_lake"}}))
    with pytest.raises(StorageConnectionError, match="'platform_lake' does not exist"):
        _sensor("s3a://lake/sales", conflict_pool="lake").execute(_context())
    with pytest.raises(StorageConnectionError, match="'own_lake' does not exist"):
        _sensor("s3a://lake/sales", conflict_pool="lake", storage_conn_id="own_lake").execute(_context())
    assert store.records() == []
