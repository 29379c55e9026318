"""``conflict_pool=`` on the Delta operators: checked at parse time, routed to the pool's Airflow pool, and
leased at run time from a real SQLite lease store on a hand-written Delta log (only Spark is left out:
the jobs run through a ``MemoryTransport``; the hook, the footprint, the request and the store are the
real ones).

No test here waits a fixed time for another thread or asserts how long something took: threads wait
for what they need to see in the store (with a deadline that fails the test, never a hang), and the
store's audit gives the order of events."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_delta_occ.engine import Snapshot
from airflow_delta_occ.engine.planner import TableState, plan_footprint
from airflow_delta_occ.exceptions import JobKilledError, LeaseStoreError, PoolConfigError, ProviderConfigError
from airflow_delta_occ.hooks.leases import configured_pool
from airflow_delta_occ.hooks.transports import MemoryTransport
from airflow_delta_occ.jobs.result import JobResult
from airflow_delta_occ.operators.delta import DeltaDeleteOperator, DeltaOptimizeOperator, DeltaUpdateOperator
from airflow_delta_occ.pools.holding import WaitWhere
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
from airflow_delta_occ.pools.requests import AuditKind, LeaseRequest
from airflow_delta_occ.triggers.lease import DeltaLeaseTrigger

pytestmark = pytest.mark.unit


def _pool_file(monkeypatch: pytest.MonkeyPatch, path: Path, body: str) -> Path:
    path.write_text(body)
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(path))
    return path


@pytest.fixture
def pools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return _pool_file(monkeypatch, tmp_path / "pools.toml",
                      f'[pools.sales]\ntables = ["{tmp_path}/sales"]\nairflow_pool = "delta_sales"\n'
                      'lease_ttl = "30s"\nheartbeat = "0.2s"\n'
                      '[pools.other]\ntables = ["s3://lake/other/**"]\n')


def _update(**kwargs: Any) -> DeltaUpdateOperator:
    return DeltaUpdateOperator(task_id="u", table=kwargs.pop("table", "/lake/t"), set={"name": "'x'"}, **kwargs)


# -- parse time -----------------------------------------------------------------------------------
def test_unknown_pool_fails_at_parse_time_naming_it(pools: Path) -> None:
    with pytest.raises(PoolConfigError, match=r"conflict_pool='nope'.*unknown pool 'nope'; known pools: other, sales"):
        _update(conflict_pool="nope")


def test_missing_pool_file_fails_at_parse_time_naming_the_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(tmp_path / "missing.toml"))
    with pytest.raises(PoolConfigError, match=r"conflict_pool='sales'.*missing.toml: cannot be read"):
        _update(conflict_pool="sales")


def test_the_task_runs_in_the_pools_airflow_pool_unless_the_author_chose_one(pools: Path) -> None:
    sales = str(pools.parent / "sales")
    assert _update(table=sales, conflict_pool="sales").pool == "delta_sales"
    assert _update(table="s3://lake/other/t", conflict_pool="other").pool == "delta_occ_other"
    assert _update(table=sales, conflict_pool="sales", pool="mine").pool == "mine"
    assert _update(table=sales, conflict_pool="sales", default_args={"pool": "dag_wide"}).pool == "dag_wide"


def test_mapped_tasks_are_routed_too(pools: Path) -> None:
    from airflow.sdk import DAG

    with DAG("d", schedule=None):
        mapped = DeltaUpdateOperator.partial(task_id="u", table=str(pools.parent / "sales"),
                                             conflict_pool="sales").expand(set=[{"name": "'x'"}])
        assert mapped.partial_kwargs["pool"] == "delta_sales"
        with pytest.raises(PoolConfigError, match="is not in conflict pool 'sales'"):
            DeltaUpdateOperator.partial(task_id="v", table="/lake/t", conflict_pool="sales")


def test_without_conflict_pool_nothing_changes(pools: Path) -> None:
    from airflow.sdk import BaseOperator

    op = _update()
    assert (op.conflict_pool, op.pool) == (None, BaseOperator(task_id="plain").pool)


def test_without_a_pool_file_the_name_is_checked_only_at_run_time(sales_log: tuple[str, Snapshot],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", "")
    op = _update(table=sales_log[0], conflict_pool="sales")
    with pytest.raises(PoolConfigError, match="conflict_pool='sales': no pool file is configured"):
        op.execute(_context())


# -- run time, against a real lease store ---------------------------------------------------------
def _context(try_number: int = 1, task_id: str = "u") -> dict[str, Any]:
    xcoms: dict[str, Any] = {}   # what the task pushed, by key
    ti = SimpleNamespace(dag_id="d", task_id=task_id, map_index=-1, try_number=try_number, max_tries=try_number + 1,
                         xcoms=xcoms, xcom_push=lambda key, value: xcoms.__setitem__(key, value))
    return {"ti": ti, "run_id": "manual__1"}


T = TypeVar("T")
DEADLINE = 60.0
"""How long a helper waits for something it must see before it fails the test (never reached when all is well)."""


def _eventually(what: str, probe: Callable[[], T | None]) -> T:
    """``probe()``'s first truthy answer; fails the test naming ``what`` after ``DEADLINE`` seconds."""
    deadline = time.monotonic() + DEADLINE
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {DEADLINE} s waiting for {what}")
        time.sleep(0.01)


def _waiting_request(store: SqlLeaseStore) -> Any:
    """The operator's lease request, once it exists (the blocker's is not it)."""
    return _eventually("the operator's lease request", lambda: next(
        (r for r in store.records() if r.owner != "blocker"), None))


class _Background:
    """Runs ``body`` in a thread; ``join`` re-raises what it raised, so a failed helper fails the test."""

    def __init__(self, body: Callable[[], None]) -> None:
        self.error: BaseException | None = None

        def run() -> None:
            try:
                body()
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive(), "the helper thread did not finish"
        if self.error is not None:
            raise self.error


class _Spark:
    """What Spark is replaced with: a ``MemoryTransport`` whose job records who held a lease while it
    ran and commits nothing (``version=None``: an UPDATE that matched nothing)."""

    def __init__(self, store: SqlLeaseStore, *, until_renewed: bool = False) -> None:
        self.store, self.until_renewed = store, until_renewed
        self.holders_during: list[str] = []
        self.transport = MemoryTransport(self._job)

    @property
    def runs(self) -> int:
        return len(self.transport.specs)

    def _job(self, spec: Any) -> JobResult:
        self.holders_during = [r.owner for r in self.store.holders()]
        if self.until_renewed:  # the job lasts until the heartbeat has renewed the lease once
            _eventually("the heartbeat's renewal", lambda: any(
                e.kind is AuditKind.RENEW for e in self.store.history(pool="sales")))
        return MemoryTransport.success()


@pytest.fixture
def spark(store: SqlLeaseStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Spark]:
    """Every hook built on ``delta_occ_default`` runs its jobs through the test's ``MemoryTransport``."""
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_DEFAULT",
                       json.dumps({"conn_type": "delta_occ", "extra": {"mode": "memory"}}))
    fake = _Spark(store)
    with fake.transport.registered("memory"):
        yield fake


def _leased_update(path: str, deferrable: bool | None = True) -> DeltaUpdateOperator:
    """A pooled UPDATE of one partition; it waits deferred unless told otherwise."""
    return _update(table=path, conflict_pool="sales", partitions={"date": "2024-01-01", "country": "DE"},
                   deferrable=deferrable)


def _block(store: SqlLeaseStore, path: str, snapshot: Snapshot) -> str:
    """A held OPTIMIZE of the whole table by "blocker": every UPDATE of the table conflicts with it."""
    from airflow_delta_occ.pools.config import normalize_table

    request = LeaseRequest.of(pool="sales", table=normalize_table(path), owner="blocker",
                              footprint=plan_footprint(snapshot, "OPTIMIZE"), table_state=TableState.of(snapshot),
                              ttl=30.0)
    state = store.acquire(request)
    assert state.granted
    return state.request_id


def test_granted_at_once_runs_with_the_lease_renewed_and_releases_it(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark) -> None:
    spark.until_renewed = True
    result = _leased_update(sales_log[0]).execute(_context())
    assert spark.holders_during == ["d/u/manual__1/-1/1"]
    lease = result["lease"]
    assert (lease["pool"], lease["waited_for"], lease["lost"]) == ("sales", [], False)
    kinds = [e.kind for e in store.history(pool="sales")]
    # Granted in the request's own transaction: nothing was waited for.
    assert kinds[:2] == [AuditKind.REQUEST, AuditKind.GRANT] and kinds[-1] is AuditKind.RELEASE
    assert AuditKind.RENEW in kinds  # the heartbeat (0.2 s) beat while the job ran
    assert store.records() == []


def test_a_conflicting_holder_defers_then_resume_runs_and_releases(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark) -> None:
    path, snapshot = sales_log
    blocker = _block(store, path, snapshot)
    context = _context()
    with pytest.raises(TaskDeferred) as deferred:
        _leased_update(path).execute(context)
    trigger = deferred.value.trigger
    assert isinstance(trigger, DeltaLeaseTrigger) and deferred.value.method_name == "execute_complete"
    # Issue #24: the UI showed only "deferred"; the task's XCom tab now says on whom it waits and why.
    wait = context["ti"].xcoms["delta_occ_wait"]
    assert wait["request_id"] == trigger.request_id and wait["pool"] == "sales"
    assert [b["owner"] for b in wait["waits_for"]] == ["blocker"] and "partition" in wait["waits_for"][0]["reason"]
    assert wait["waiting_since"].endswith("+00:00") and wait["summary"].startswith("blocker: ")
    assert spark.runs == 0
    assert store.release(blocker, "blocker")   # the waiter is granted in the release's transaction
    event = {"status": "granted", "request_id": trigger.request_id, "waited": 4.5,
             "blockers_seen": [{"request_id": blocker, "owner": "blocker", "reason": "conflicts"}]}
    result = _leased_update(path).execute_complete(_context(), event=event)
    assert result["lease"] == {"pool": "sales", "request_id": trigger.request_id, "waited": 4.5,
                               "waited_for": ["blocker"], "lost": False}
    assert spark.runs == 1 and store.records() == []


def test_a_lease_that_expired_before_resuming_is_asked_for_again(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark) -> None:
    event = {"status": "granted", "request_id": "gone", "waited": 1.0, "blockers_seen": []}
    result = _leased_update(sales_log[0]).execute_complete(_context(), event=event)
    assert result["lease"]["request_id"] != "gone" and store.records() == []


def test_a_trigger_error_is_a_lease_store_error(pools: Path, sales_log: tuple[str, Snapshot]) -> None:
    with pytest.raises(LeaseStoreError, match="no usable store"):
        _leased_update(sales_log[0]).execute_complete(_context(),
                                                      event={"status": "error", "message": "no usable store"})


def test_a_table_outside_the_pool_is_refused_at_parse_time_when_it_is_a_literal(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore) -> None:
    with pytest.raises(PoolConfigError, match=r"table 'file://.*/sales' is not in conflict pool 'other'"):
        DeltaDeleteOperator(task_id="d", table=sales_log[0], where="id = 1", conflict_pool="other")
    # A templated location is checked once rendered, before any lease is asked for.
    op = DeltaDeleteOperator(task_id="d", table="{{ params.table }}", where="id = 1", conflict_pool="other")
    op.render_template_fields({"params": {"table": sales_log[0]}})  # type: ignore[arg-type]
    with pytest.raises(PoolConfigError, match=r"table 'file://.*/sales' is not in conflict pool 'other'"):
        op.execute(_context())
    assert store.records() == []


def test_the_lease_is_released_when_the_job_fails(pools: Path, sales_log: tuple[str, Snapshot],
                                                  store: SqlLeaseStore, spark: _Spark) -> None:
    spark.transport = MemoryTransport([RuntimeError("spark died")])
    with spark.transport.registered("memory"), pytest.raises(RuntimeError, match="spark died"):
        _leased_update(sales_log[0]).execute(_context())
    assert store.records() == [] and store.history()[-1].kind is AuditKind.RELEASE


def test_an_early_stop_is_in_the_audit_when_the_job_ends_in_an_error(pools: Path, sales_log: tuple[str, Snapshot],
                                                                     store: SqlLeaseStore, spark: _Spark) -> None:
    """A compaction stopped early is skipped by its default policy (its files are gone), and any job may fail once
    its attempts run out: the lease's release line still names the commit that stopped it. The runner reports
    such an ending as a result (its status and conflicts, across the process or JSON boundary), which the hook
    turns back into the exception."""
    from airflow.sdk.exceptions import AirflowSkipException

    from airflow_delta_occ.engine.errors import ConflictKind
    from airflow_delta_occ.exceptions import ConflictFailure
    from airflow_delta_occ.jobs.result import JobStatus
    from airflow_delta_occ.retry.policy import ConflictRecord

    def ended(status: JobStatus, action: str) -> JobResult:
        early = ConflictRecord(1, ConflictKind.DELETE_READ, "ConcurrentDeleteReadException foreseen", action,
                               winning_version=7, early=True, winning_operation="DELETE")
        result = MemoryTransport.success(status=status, conflict=ConflictKind.DELETE_READ, attempts=1,
                                         conflicts=(early,), error="ConcurrentDeleteReadException: ...")
        return JobResult.from_json(result.to_json())   # as a spark-submit driver's result arrives

    for result, raised in ((ended(JobStatus.SKIPPED, "skip"), AirflowSkipException),
                           (ended(JobStatus.CONFLICT, "gave up"), ConflictFailure)):
        spark.transport = MemoryTransport([result])
        with spark.transport.registered("memory"), pytest.raises(raised):
            _leased_update(sales_log[0]).execute(_context())
        release = store.history()[-1]
        assert release.kind is AuditKind.RELEASE
        assert release.detail.endswith("; stopped early by version 7 (DELETE): ConcurrentDeleteReadException"), \
            release.detail


# -- deferrable=False: the wait stays in the worker -------------------------------------------------
def test_bad_lease_poll_interval_fails_at_parse_time(pools: Path) -> None:
    for bad in (0, -1, float("nan"), "1", True):
        with pytest.raises(PoolConfigError, match="lease_poll_interval must be a positive number of seconds"):
            _update(conflict_pool="sales", lease_poll_interval=bad)


def test_in_the_worker_a_waiter_starts_its_job_as_soon_as_the_holder_releases(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark) -> None:
    path, snapshot = sales_log
    blocker = _block(store, path, snapshot)
    op = _update(table=path, conflict_pool="sales", partitions={"date": "2024-01-01", "country": "DE"},
                 deferrable=False, lease_poll_interval=0.05)

    def release_once_it_waits() -> None:
        _waiting_request(store)
        store.release(blocker, "blocker")

    helper = _Background(release_once_it_waits)
    result = op.execute(_context())   # no TaskDeferred: it waited here
    helper.join()
    assert spark.holders_during == ["d/u/manual__1/-1/1"]   # the blocker was gone when the job ran
    lease = result["lease"]
    assert lease["waited_for"] == ["blocker"] and lease["waited"] > 0
    assert store.records() == []
    events = [(e.owner, e.kind) for e in store.history(pool="sales")]
    waiter = "d/u/manual__1/-1/1"
    # The waiter asked, the blocker released, and the waiter was granted (in the release's transaction).
    assert events.index((waiter, AuditKind.REQUEST)) < events.index(("blocker", AuditKind.RELEASE)) \
        < events.index((waiter, AuditKind.GRANT))
    kinds = [kind for owner, kind in events if owner != "blocker"]
    assert kinds[0] is AuditKind.REQUEST and kinds[1] is AuditKind.GRANT and kinds[-1] is AuditKind.RELEASE


def _worker_update(path: str) -> DeltaUpdateOperator:
    """A pooled UPDATE that waits for its lease in the worker, polling every 50 ms."""
    return _update(table=path, conflict_pool="sales", deferrable=False, lease_poll_interval=0.05)


def test_in_the_worker_a_killed_waiter_cancels_its_request_and_never_runs(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark) -> None:
    path, snapshot = sales_log
    blocker = _block(store, path, snapshot)
    op = _worker_update(path)

    def kill_once_it_waits() -> None:
        _waiting_request(store)
        op.on_kill()   # as the Task SDK's SIGTERM handler would

    helper = _Background(kill_once_it_waits)
    try:
        with pytest.raises(JobKilledError, match=r"killed while its lease request .* waited"):
            op.execute(_context())
        helper.join()
        assert spark.runs == 0
        assert [r.owner for r in store.records()] == ["blocker"]   # the waiter's request is gone
        assert store.history()[-1].kind is AuditKind.CANCEL
    finally:
        store.release(blocker, "blocker")


def test_in_the_worker_a_request_dropped_while_waiting_is_asked_for_again(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark) -> None:
    path, snapshot = sales_log
    blocker = _block(store, path, snapshot)
    op = _worker_update(path)

    def requests() -> list[Any]:
        return [e for e in store.history(pool="sales") if e.kind is AuditKind.REQUEST and e.owner != "blocker"]

    def drop_then_release() -> None:
        try:
            waiting = _waiting_request(store)
            store.release(waiting.request_id, waiting.owner)   # as an operator cleaning up a "dead" waiter would
            _eventually("the operator's second request", lambda: len(requests()) == 2)
        finally:   # whatever happened, the operator is never left waiting for the blocker
            store.release(blocker, "blocker")

    helper = _Background(drop_then_release)
    result = op.execute(_context())
    helper.join()
    asked = requests()
    assert len(asked) == 2 and result["lease"]["request_id"] == asked[1].request_id
    assert store.records() == []


def test_the_deferred_wait_polls_at_the_given_interval(pools: Path, sales_log: tuple[str, Snapshot],
                                                      store: SqlLeaseStore, spark: _Spark) -> None:
    path, snapshot = sales_log
    blocker = _block(store, path, snapshot)
    for interval, expected in ((None, 2.0), (0.25, 0.25)):
        op = _update(table=path, conflict_pool="sales", lease_poll_interval=interval, deferrable=True)
        with pytest.raises(TaskDeferred) as deferred:
            op.execute(_context())
        assert deferred.value.trigger.poll_interval == expected
        for record in store.records():
            if record.owner != "blocker":
                store.release(record.request_id, record.owner)
    store.release(blocker, "blocker")
    assert spark.runs == 0


def test_a_resumed_task_whose_plan_fails_gives_the_granted_lease_back(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark) -> None:
    """A lease granted in the triggerer and a re-plan that fails (here: the table is gone) must not keep
    the lease until its TTL: the next writer would wait for nothing."""
    import shutil

    from airflow_delta_occ.engine.errors import TableNotFoundError

    path, snapshot = sales_log
    blocker = _block(store, path, snapshot)
    with pytest.raises(TaskDeferred) as deferred:
        _leased_update(path).execute(_context())
    store.release(blocker, "blocker")   # grants the waiter
    shutil.rmtree(path)
    event = {"status": "granted", "request_id": deferred.value.trigger.request_id, "waited": 1.0, "blockers_seen": []}
    with pytest.raises(TableNotFoundError):
        _leased_update(path).execute_complete(_context(), event=event)
    assert store.records() == [] and store.history()[-1].kind is AuditKind.RELEASE
    assert spark.runs == 0


def test_in_the_worker_a_kill_between_the_grant_and_the_job_releases_the_lease_and_runs_nothing(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path, snapshot = sales_log
    blocker = _block(store, path, snapshot)
    op = _worker_update(path)
    plans = 0
    prepare = op.prepare

    def prepare_then_kill(context: Any, **kwargs: Any) -> Any:
        nonlocal plans
        plans += 1
        if plans == 2:   # the re-plan after the grant: SIGTERM arrives meanwhile
            op.on_kill()
        return prepare(context, **kwargs)

    monkeypatch.setattr(op, "prepare", prepare_then_kill)

    def release_once_it_waits() -> None:
        try:
            _waiting_request(store)
        finally:
            store.release(blocker, "blocker")

    helper = _Background(release_once_it_waits)
    with pytest.raises(JobKilledError, match=r"killed after its lease .* was granted"):
        op.execute(_context())
    helper.join()
    assert spark.runs == 0 and store.records() == []


def test_deferrable_false_is_refused_in_a_pool_that_limits_writers(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _pool_file(monkeypatch, tmp_path / "pools.toml", '[pools.capped]\ntables = ["/lake/**"]\nmax_writers = 2\n')
    with pytest.raises(PoolConfigError, match=r"deferrable=False cannot be used with conflict pool 'capped'.*"
                                              r"max_writers=2"):
        _update(conflict_pool="capped", deferrable=False)
    assert _update(conflict_pool="capped", deferrable=True).deferrable   # deferred waits are fine
    # Left adaptive, a task of such a pool always defers.
    op = _update(conflict_pool="capped")
    assert op.deferrable is None and op._wait_rule(configured_pool("capped")).where is WaitWhere.DEFERRED


# -- the default: an adaptive wait ---------------------------------------------------------------------
def _history_of_holds(store: SqlLeaseStore, path: str, snapshot: Snapshot, seconds: float) -> None:
    """Two earlier leases on the table, each held ``seconds``, written on a store whose clock is set back."""
    from airflow_delta_occ.pools.config import normalize_table

    moment = [time.time() - 1000.0]
    for n in range(2):
        clocked = SqlLeaseStore(str(store.engine.url), clock=lambda: moment[0])
        try:
            request = LeaseRequest.of(pool="sales", table=normalize_table(path), owner=f"old{n}",
                                      footprint=plan_footprint(snapshot, "OPTIMIZE"),
                                      table_state=TableState.of(snapshot), ttl=1e6)
            state = clocked.acquire(request)
            moment[0] += seconds
            clocked.release(state.request_id, f"old{n}")
            moment[0] += 1.0
        finally:
            clocked.close()


def test_the_request_says_how_long_leases_of_its_kind_were_held_on_the_table(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore) -> None:
    """The arbiter may grant a request ahead of an earlier one only when it knows how long it will hold
    (rule 2a): the operator reads it from the table's audit, from holds of its own kind only."""
    path, snapshot = sales_log
    _history_of_holds(store, path, snapshot, 40.0)   # two OPTIMIZE holds of 40 s; no UPDATE held yet
    _block(store, path, snapshot)
    with pytest.raises(TaskDeferred):
        _leased_update(path).execute(_context())
    update = LeaseRequest.from_json(_stored_request(store, "d/u/manual__1/-1/1"))
    assert update.expected_hold is None   # an UPDATE: no hold of its kind seen
    optimize = DeltaOptimizeOperator(task_id="o", table=path, conflict_pool="sales", deferrable=True)
    with pytest.raises(TaskDeferred):
        optimize.execute(_context(task_id="o"))
    assert LeaseRequest.from_json(_stored_request(store, "d/o/manual__1/-1/1")).expected_hold == pytest.approx(40.0)


def _stored_request(store: SqlLeaseStore, owner: str) -> dict[str, Any]:
    """The request ``owner`` stored, as its audit REQUEST event quotes it."""
    event = next(e for e in store.history(pool="sales") if e.owner == owner and e.kind is AuditKind.REQUEST)
    return dict(json.loads(event.detail))


def test_by_default_a_short_wait_stays_in_the_worker_and_sees_the_release_at_once(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark) -> None:
    """Nothing known about the table's holds: the task waits in the worker (up to ``worker_wait``).
    Full polls are 20 s apart here; the release reaches it through the pool's revision."""
    path, snapshot = sales_log
    blocker = _block(store, path, snapshot)
    op = _leased_update(path, deferrable=None)
    op.lease_poll_interval = 20.0

    def release_once_it_waits() -> None:
        _waiting_request(store)
        time.sleep(0.2)
        store.release(blocker, "blocker")

    helper = _Background(release_once_it_waits)
    started = time.monotonic()
    result = op.execute(_context())   # no TaskDeferred
    helper.join()
    # The next full poll was 10 s away (20 s asked, a third of the pool's 30 s TTL used).
    assert time.monotonic() - started < 5.0
    assert spark.holders_during == ["d/u/manual__1/-1/1"] and result["lease"]["waited_for"] == ["blocker"]
    assert result["run_started_at"] is not None and store.records() == []


def test_by_default_a_wait_expected_to_be_long_defers_and_comes_back_when_near(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark) -> None:
    path, snapshot = sales_log
    _history_of_holds(store, path, snapshot, seconds=100.0)   # this table's leases are held 100 s
    blocker = _block(store, path, snapshot)
    with pytest.raises(TaskDeferred) as deferred:
        _leased_update(path, deferrable=None).execute(_context())
    trigger = deferred.value.trigger
    assert trigger.resume_ahead == 5.0 and trigger.poll_interval == 2.0
    waiting = _waiting_request(store)
    assert waiting.request_id == trigger.request_id and spark.runs == 0   # deferred at once, still in line

    # The trigger finds the grant near: the task comes back and waits the rest in the worker.
    helper = _Background(lambda: (time.sleep(0.3), store.release(blocker, "blocker")))
    event = {"status": "near", "request_id": trigger.request_id, "expected": 0.3, "blockers_seen": []}
    result = _leased_update(path, deferrable=None).execute_complete(_context(), event=event)
    helper.join()
    assert result["lease"]["request_id"] == trigger.request_id   # the same request, its place kept
    assert spark.runs == 1 and spark.holders_during == ["d/u/manual__1/-1/1"] and store.records() == []


def test_by_default_a_worker_wait_defers_after_worker_wait_seconds(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__WORKER_WAIT", "0.3")
    path, snapshot = sales_log
    blocker = _block(store, path, snapshot)
    started = time.monotonic()
    with pytest.raises(TaskDeferred) as deferred:
        _leased_update(path, deferrable=None).execute(_context())
    assert time.monotonic() - started >= 0.3
    trigger = deferred.value.trigger
    assert _waiting_request(store).request_id == trigger.request_id   # not cancelled
    # The trigger carries whom the worker saw block the request, so the task's result names them.
    assert [b["owner"] for b in trigger.blockers_seen] == ["blocker"]
    assert DeltaLeaseTrigger(**trigger.serialize()[1]).blockers_seen == trigger.blockers_seen
    store.release(blocker, "blocker")


def test_airflows_default_deferrable_is_respected_when_set(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    path, snapshot = sales_log
    blocker = _block(store, path, snapshot)
    with pytest.raises(TaskDeferred) as deferred:
        _leased_update(path, deferrable=None).execute(_context())
    assert deferred.value.trigger.resume_ahead is None   # forced deferred: only the grant ends the wait
    store.release(blocker, "blocker")
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "perhaps")
    with pytest.raises(ProviderConfigError, match=r"\[operators\] default_deferrable is 'perhaps'"):
        _leased_update(path, deferrable=None)


def test_a_bad_worker_wait_or_deferrable_is_refused(pools: Path, sales_log: tuple[str, Snapshot],
                                                    store: SqlLeaseStore, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PoolConfigError, match="deferrable must be True, False or None"):
        _update(conflict_pool="sales", deferrable="yes")
    path, snapshot = sales_log
    blocker = _block(store, path, snapshot)
    for bad in ("-1", "soon", "nan"):
        monkeypatch.setenv("AIRFLOW__DELTA_OCC__WORKER_WAIT", bad)
        with pytest.raises(ProviderConfigError, match=rf"\[delta_occ\] worker_wait is '{bad}'"):
            _leased_update(path, deferrable=None).execute(_context())
    assert [r.owner for r in store.records()] == ["blocker"]   # refused before asking for a lease
    store.release(blocker, "blocker")


def test_the_lease_is_released_when_spark_is_done_before_the_commit_is_confirmed(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark,
        monkeypatch: pytest.MonkeyPatch) -> None:
    op = _leased_update(sales_log[0])
    held_while_confirming: list[list[str]] = []
    confirm = op.confirm

    def watched(prepared: Any, result: JobResult) -> JobResult:
        held_while_confirming.append([r.owner for r in store.holders()])
        return confirm(prepared, result)

    monkeypatch.setattr(op, "confirm", watched)
    op.execute(_context())
    assert spark.holders_during == ["d/u/manual__1/-1/1"] and held_while_confirming == [[]]


def _deferred_behind_a_blocker(store: SqlLeaseStore, path: str, snapshot: Snapshot) -> tuple[str, str]:
    """A blocker's lease and, behind it, a pooled UPDATE that deferred: (the blocker's id, the UPDATE's
    request id, which its trigger carries)."""
    blocker = _block(store, path, snapshot)
    with pytest.raises(TaskDeferred) as deferred:
        _leased_update(path, deferrable=True).execute(_context())
    return blocker, deferred.value.trigger.request_id


def test_a_task_sent_back_whose_request_was_granted_meanwhile_renews_and_runs(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark) -> None:
    path, snapshot = sales_log
    blocker, request_id = _deferred_behind_a_blocker(store, path, snapshot)
    store.release(blocker, "blocker")   # granted while the task comes back
    seen = [{"request_id": blocker, "owner": "blocker", "reason": "both rewrite partition DE"}]
    event = {"status": "near", "request_id": request_id, "expected": 1.0, "blockers_seen": seen}
    result = _leased_update(path, deferrable=None).execute_complete(_context(), event=event)
    assert result["lease"]["request_id"] == request_id and spark.runs == 1 and store.records() == []
    # Whom it waited for before it came back is still known (the grant came before this try polled).
    assert result["lease"]["waited_for"] == ["blocker"], result["lease"]
    kinds = [e.kind for e in store.history(pool="sales") if e.request_id == request_id]
    assert kinds == [AuditKind.REQUEST, AuditKind.GRANT, AuditKind.RENEW, AuditKind.RELEASE], kinds


def test_a_task_sent_back_whose_plan_fails_gives_its_place_back(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark) -> None:
    import shutil

    from airflow_delta_occ.engine.errors import TableNotFoundError

    path, snapshot = sales_log
    blocker, request_id = _deferred_behind_a_blocker(store, path, snapshot)
    shutil.rmtree(path)
    event = {"status": "near", "request_id": request_id, "expected": 1.0, "blockers_seen": []}
    with pytest.raises(TableNotFoundError):
        _leased_update(path, deferrable=None).execute_complete(_context(), event=event)
    assert [r.owner for r in store.records()] == ["blocker"]   # the waiter's request is gone, not left to its TTL
    assert [e.kind for e in store.history(pool="sales") if e.request_id == request_id][-1] is AuditKind.CANCEL
    store.release(blocker, "blocker")


def test_a_trigger_error_cancels_the_request_it_reports(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark) -> None:
    path, snapshot = sales_log
    blocker, request_id = _deferred_behind_a_blocker(store, path, snapshot)
    with pytest.raises(LeaseStoreError, match="kept failing"):
        _leased_update(path).execute_complete(_context(), event={"status": "error", "request_id": request_id,
                                                                 "message": "the store kept failing"})
    assert [r.owner for r in store.records()] == ["blocker"]
    store.release(blocker, "blocker")


def test_a_light_warm_up_starts_with_the_task_and_a_heavy_one_only_when_it_waits_in_the_worker(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark) -> None:
    """Spark Connect's client loads while the job is planned, even when the lease is granted at once
    (it was loaded inside the granted job before); a JVM (embedded) starts only once the task waits."""
    path, snapshot = sales_log
    _leased_update(path, deferrable=None).execute(_context())
    _eventually("the warm-up", lambda: spark.transport.warm_ups == 1)   # it runs in a thread
    assert spark.runs == 1
    spark.transport.light_warm_up = False   # as the embedded mode's
    _leased_update(path, deferrable=None).execute(_context())
    assert spark.transport.warm_ups == 1 and spark.runs == 2   # granted at once: nothing started early
    blocker = _block(store, path, snapshot)

    def release_once_warmed_up() -> None:
        _waiting_request(store)
        _eventually("the warm-up of a wait in the worker", lambda: spark.transport.warm_ups == 2)
        store.release(blocker, "blocker")

    helper = _Background(release_once_warmed_up)
    _leased_update(path, deferrable=None).execute(_context())
    helper.join()
    assert spark.transport.warm_ups == 2 and spark.runs == 3


def test_a_resumed_task_whose_hook_cannot_be_built_still_gives_its_lease_back(
        pools: Path, sales_log: tuple[str, Snapshot], store: SqlLeaseStore, spark: _Spark) -> None:
    """The early warm-up builds the hook before anything else; a connection that is gone must fail the
    try where the lease is given back, not before."""
    path, snapshot = sales_log
    blocker, request_id = _deferred_behind_a_blocker(store, path, snapshot)
    store.release(blocker, "blocker")   # granted in the triggerer
    event = {"status": "granted", "request_id": request_id, "waited": 1.0, "blockers_seen": []}
    op = _leased_update(path)
    op.delta_conn_id = "no_such_connection"
    with pytest.raises(Exception, match="no_such_connection"):
        op.execute_complete(_context(), event=event)
    assert store.records() == [] and spark.runs == 0
