"""Holding a conflict pool's lease: ask for it, wait for it, keep it alive, give it back.

One module for every holder: the operators (a lease around their own job), ``DeltaConflictSensor``
(a lease handed to a writer the provider does not run) and ``DeltaLeaseTrigger`` (a deferred wait).
So there is one polling loop (``LeaseWait``: the interval clamp, asking again for a dropped request,
riding out store failures, the blockers seen) that a worker drives with a thread's wait and the
triggerer with ``asyncio``, and one cancel path (``cancel_requests``) for every holder that stops
waiting. A lease is a scheduling aid, not the guard: Delta's own commit check still refuses a
conflicting commit, so a lease lost mid-job is reported, not fatal.

Pure (no Airflow, no Spark). The DAG processor imports this module with the operators, so the
request types (which import the engine) are imported inside the functions that need them.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from airflow_delta_occ.exceptions import (
    JobKilledError,
    LeaseError,
    LeaseLostError,
    LeaseStoreError,
    PoolConfigError,
)

if TYPE_CHECKING:
    from airflow_delta_occ.engine.planner import Footprint
    from airflow_delta_occ.engine.snapshot import Snapshot
    from airflow_delta_occ.pools.config import Pool
    from airflow_delta_occ.pools.leases.base import LeaseStore
    from airflow_delta_occ.pools.requests import AuditEvent, Blocker, LeaseRequest, LeaseState


class Log(Protocol):
    """What is logged to: an operator's or trigger's logger (Airflow's, or ``logging``'s)."""

    def info(self, msg: str, /, *args: Any) -> Any: ...

    def warning(self, msg: str, /, *args: Any) -> Any: ...

    def error(self, msg: str, /, *args: Any) -> Any: ...


DEFERRED_POLL_SECONDS = 2.0   # a deferred waiter's full poll (its heartbeat) when nothing changed in the pool
WORKER_POLL_SECONDS = 0.5     # a waiting worker's full poll when nothing changed in the pool
WORKER_WAKE_SECONDS = 0.05    # a waiting worker reads the pool's revision this often: a grant is seen within it
DEFERRED_WAKE_SECONDS = 0.25  # the trigger reads it this often (one cheap read per deferred waiter)
MIN_POLL_SECONDS = 0.01       # a smaller interval would spin on the store
WORKER_WAIT_SECONDS = 30.0    # adaptive: wait in the worker while the expected wait is at most this
RESUME_AHEAD_SECONDS = 5.0    # adaptive: a deferred waiter comes back to a worker this long before its grant
HOLDS_REMEMBERED = 50         # the table's last completed holds that make its typical hold
HISTORY_READ = 500            # audit events read to find them
MAX_FAILURES = 10             # consecutive store failures before a wait gives up (its request is abandoned by then)
MAX_BLOCKERS_SEEN = 50        # the trigger's event is stored by Airflow: keep it small
MAX_REASON_LENGTH = 500
LOGGED_REASON_LENGTH = 200


# -- arguments, checked when the DAG file is parsed --------------------------------------------------
def check_poll_interval(value: object) -> None:
    """Raises ``PoolConfigError`` unless ``value`` is ``None`` or a positive number of seconds."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise PoolConfigError(f"lease_poll_interval must be a positive number of seconds, got {value!r}")


def check_worker_wait(pool: Pool, deferrable: bool) -> None:
    """Refuse ``deferrable=False`` in a pool that limits its writers.

    Such a pool's Airflow pool has ``max_writers`` slots, and a task waiting in the worker holds one:
    waiters could fill every slot while the writer the store granted (a deferred one, or one not yet
    started) needs a slot to run, and nothing would move until leases expire.

    Raises:
        PoolConfigError: ``deferrable=False`` and the pool sets ``max_writers``.
    """
    if not deferrable and pool.max_writers is not None:
        raise PoolConfigError(
            f"deferrable=False cannot be used with conflict pool {pool.name!r}: it limits writers (max_writers="
            f"{pool.max_writers}), and tasks waiting in the worker hold the slots of its Airflow pool "
            f"{pool.airflow_pool!r} that the writers granted a lease need to run; wait deferred instead")


# -- where a waiter waits: in the worker, deferred, or each as the expected wait says ------------------
class WaitWhere(StrEnum):
    ADAPTIVE = "adaptive"   # in the worker while the expected wait is short, deferred while it is long
    WORKER = "worker"       # always in the worker (``deferrable=False``)
    DEFERRED = "deferred"   # always in the triggerer (``deferrable=True``)


@dataclass(frozen=True)
class WaitRule:
    """Where a pooled task waits for its lease, and when an adaptive wait moves.

    A wait in the worker sees its grant within ``WORKER_WAKE_SECONDS`` and starts its Spark work at
    once, but holds an Airflow slot; a deferred wait holds none, but its hand-over costs a trigger
    event, the scheduler and a new task process (seconds). So an adaptive wait stays in the worker
    while the expected wait is at most ``worker_wait`` seconds (and for at most that long when nothing
    is known), defers when it is longer, and a deferred waiter comes back to a worker when its grant
    is expected within ``resume_ahead`` seconds, so the hand-over overlaps the holder's last seconds.
    A pool that limits its writers always defers: waiters in the worker would hold the slots of its
    Airflow pool that the granted writers need.
    """

    where: WaitWhere
    worker_wait: float = WORKER_WAIT_SECONDS
    resume_ahead: float = RESUME_AHEAD_SECONDS

    @classmethod
    def of(cls, deferrable: bool | None, pool: Pool, *, default_deferrable: bool | None = None,
           worker_wait: float = WORKER_WAIT_SECONDS) -> WaitRule:
        """The rule for a task: its ``deferrable`` when set, else Airflow's ``[operators]
        default_deferrable`` when it forces one (``config.default_deferrable``: True), else adaptive.

        Raises:
            PoolConfigError: a wait forced into the worker in a pool that limits its writers.
        """
        forced = deferrable if deferrable is not None else default_deferrable
        if forced is not None:
            check_worker_wait(pool, forced)
            return cls(WaitWhere.DEFERRED if forced else WaitWhere.WORKER, worker_wait)
        if pool.max_writers is not None or worker_wait <= 0:
            return cls(WaitWhere.DEFERRED, worker_wait)
        return cls(WaitWhere.ADAPTIVE, worker_wait, min(RESUME_AHEAD_SECONDS, worker_wait))

    def defers(self, expected: float | None, waited_in_worker: float) -> bool:
        """Whether a waiter in the worker should defer now: its wait is expected to last longer than
        ``worker_wait`` (``expected`` seconds, ``None``: unknown), or it already waited that long."""
        if self.where is not WaitWhere.ADAPTIVE:
            return self.where is WaitWhere.DEFERRED
        return (expected is not None and expected > self.worker_wait) or waited_in_worker >= self.worker_wait

    @property
    def comes_back(self) -> float | None:
        """How close (seconds) a deferred waiter's expected grant must be for it to resume in a worker;
        ``None``: it waits deferred until granted."""
        return self.resume_ahead if self.where is WaitWhere.ADAPTIVE else None


@dataclass(frozen=True)
class WaitEstimate:
    """How long a waiting request can expect to wait, from the store alone: how long this table's
    leases stayed held lately (the audit: each grant to its release), and when each lease that blocks
    the request was granted (the records). Also how long each kind of job held it (``hold_of``): what a
    new request says it expects to hold (``LeaseRequest.expected_hold``, for the arbiter's rule 2a)."""

    typical_hold: float | None   # median of the table's last completed holds; None: none seen yet
    holds_seen: int = 0
    by_operation: Mapping[str, float] = field(default_factory=dict)   # operation -> median of its last holds

    @classmethod
    def from_history(cls, events: Sequence[AuditEvent]) -> WaitEstimate:
        """From a table's audit events, oldest first."""
        from airflow_delta_occ.pools.requests import AuditKind, operation_of

        granted: dict[str, tuple[float, str]] = {}
        holds: list[tuple[str, float]] = []
        for event in events:
            if event.kind is AuditKind.GRANT:
                granted[event.request_id] = (event.at, operation_of(event.summary))
            elif event.kind is AuditKind.RELEASE and event.request_id in granted:
                at, operation = granted.pop(event.request_id)
                holds.append((operation, max(0.0, event.at - at)))
        kinds: dict[str, list[float]] = {}
        for operation, seconds in holds:
            if operation:
                kinds.setdefault(operation, []).append(seconds)
        recent = [seconds for _, seconds in holds[-HOLDS_REMEMBERED:]]
        return cls(statistics.median(recent) if recent else None, len(recent),
                   {op: statistics.median(seen[-HOLDS_REMEMBERED:]) for op, seen in kinds.items()})

    def hold_of(self, operation: str) -> float | None:
        """The median hold of this table's last leases of ``operation`` (``Operation`` value); ``None``
        when none was seen: another kind's holds say nothing about it (an OPTIMIZE is no append)."""
        return self.by_operation.get(operation)

    @classmethod
    def read(cls, store: LeaseStore, table: str, log: Log | None = None) -> WaitEstimate:
        """The estimate for ``table``; unknown when the audit cannot be read (the wait goes on regardless).

        Only grants and releases are read: renewals (a long hold writes many) would push a long hold's
        grant out of the window and bias the typical hold short.
        """
        from airflow_delta_occ.pools.requests import AuditKind

        try:
            return cls.from_history(store.history(table=table, limit=HISTORY_READ,
                                                  kinds=(AuditKind.GRANT, AuditKind.RELEASE)))
        except LeaseError as exc:
            if log is not None:
                log.warning("could not read the lease audit of %s to estimate the wait: %s", table, exc)
            return cls(None)

    def expected(self, state: LeaseState, granted_at: Mapping[str, float | None]) -> float | None:
        """Seconds until ``state``'s request is expected to be granted: the longest remaining hold of the
        leases that block it plus a typical hold for each earlier request it waits behind. ``None``
        when nothing is known: no hold seen yet, a blocker held longer than usual already, or the
        request waits for the pool's writer limit."""
        if state.granted or not state.blockers:
            return 0.0
        if self.typical_hold is None or any(b.request_id is None for b in state.blockers):
            return None
        holding_left = []
        for blocker in state.blockers:
            if blocker.granted:
                since = granted_at.get(str(blocker.request_id))
                left = self.typical_hold - (0.0 if since is None else state.checked_at - since)
                if left < 0:   # held longer than usual: how much longer is anybody's guess
                    return None
                holding_left.append(left)
        behind = sum(1 for b in state.blockers if not b.granted)
        return max(holding_left, default=0.0) + behind * self.typical_hold


def grant_is_near(state: LeaseState, expected: float | None, resume_ahead: float | None) -> bool:
    """Whether a deferred waiter should come back to a worker (``WaitRule.comes_back``): only leases
    already held block it (a request ahead waits on others the estimate does not see) and its grant is
    expected within ``resume_ahead`` seconds."""
    return (resume_ahead is not None and expected is not None and expected <= resume_ahead
            and not state.granted and all(b.granted for b in state.blockers))


def granted_times(store: LeaseStore, table: str) -> dict[str, float | None]:
    """When each live request on ``table`` was granted (``None``: still waiting)."""
    return {r.request_id: r.granted_at for r in store.records(table=table)}


# -- the request ----------------------------------------------------------------------------------
def request_for(pool: Pool, *, table: str, owner: str, footprint: Footprint, snapshot: Snapshot,
                ttl: float | None = None, estimate: WaitEstimate | None = None) -> LeaseRequest:
    """The request for ``footprint`` on ``table`` (normalized, in ``pool``), with the pool's model,
    writer limit and TTL (or ``ttl``) copied in, and the hold ``estimate`` expects of its kind of job."""
    from airflow_delta_occ.engine.planner import TableState
    from airflow_delta_occ.pools.requests import LeaseRequest

    return LeaseRequest.of(pool=pool.name, table=table, owner=owner, footprint=footprint,
                           table_state=TableState.of(snapshot), model=pool.model, max_writers=pool.max_writers,
                           ttl=ttl or pool.lease_ttl,
                           expected_hold=None if estimate is None else estimate.hold_of(footprint.operation.value))


def blocker_names(blockers: Iterable[Blocker | Mapping[str, Any]]) -> list[str]:
    """Who a request waited for: each blocker's owner, or its reason (the pool's writer limit), once each."""
    names: list[str] = []
    for b in blockers:
        owner, reason = (b.get("owner"), b.get("reason")) if isinstance(b, Mapping) else (b.owner, b.reason)
        name = str(owner or reason or "?")
        if name not in names:
            names.append(name)
    return names


def describe_wait(state: LeaseState) -> str:
    """One log line: why the request waits."""
    return "; ".join(f"{b.owner or 'the pool'}: {b.reason[:200]}" for b in state.blockers) or "(no blocker named)"


#: The XCom key of a task's lease wait (``wait_record``): the task instance's XCom tab (and the REST API's
#: ``xcomEntries``) shows whom a deferred task waits for and why; its state alone says only "deferred".
WAIT_XCOM_KEY = "delta_occ_wait"


def show_wait(ti: Any, record: dict[str, Any], log: Any) -> None:
    """Push ``record`` as the task's ``WAIT_XCOM_KEY`` XCom. Never raises: the request is already in line, and a
    failed push (the API server) must not fail the task and leave the request queued until its TTL."""
    try:
        ti.xcom_push(key=WAIT_XCOM_KEY, value=record)
    except Exception as exc:
        log.warning("could not show whom the task waits for (XCom %s): %s", WAIT_XCOM_KEY, exc)


def wait_record(pool: str, table: str, state: LeaseState) -> dict[str, Any]:
    """What a task shows of its wait when it starts waiting: its request, since when (UTC), and each blocker
    with its reason. Live state is ``airflow delta-occ leases``'s to show; the grant's is in the result."""
    from .requests import utc_text

    since = state.record.requested_at if state.record is not None else state.checked_at
    return {"pool": pool, "table": table, "request_id": state.request_id, "waiting_since": utc_text(since),
            "waits_for": [b.to_json() for b in state.blockers], "summary": describe_wait(state),
            "live": "airflow delta-occ leases --pool " + pool}


# -- waiting: one loop, driven by a worker's thread or the triggerer's event loop ----------------------
class BlockersSeen:
    """The distinct leases and requests a wait was blocked by, and whether the current set changed."""

    def __init__(self, earlier: Iterable[Mapping[str, Any]] = ()) -> None:
        """``earlier``: what ``seen()`` returned in an earlier part of the same wait (a wait that moves
        between the worker and the triggerer keeps one account of whom it waited for)."""
        self._seen: dict[tuple[str | None, str | None], dict[str, Any]] = {}
        self._current: tuple[tuple[str | None, str | None, str], ...] = ()
        for b in earlier:
            request_id, owner = b.get("request_id"), b.get("owner")
            self._add(None if request_id is None else str(request_id), None if owner is None else str(owner),
                      str(b.get("reason") or ""))

    def _add(self, request_id: str | None, owner: str | None, reason: str) -> None:
        if (request_id, owner) not in self._seen and len(self._seen) < MAX_BLOCKERS_SEEN:
            self._seen[(request_id, owner)] = {"request_id": request_id, "owner": owner,
                                               "reason": reason[:MAX_REASON_LENGTH]}

    def update(self, blockers: Iterable[Blocker]) -> list[Blocker]:
        """Record ``blockers``; returns them when they differ from the previous poll's (to log), else [].

        A request queued behind another is logged again only when the requests ahead of it change, not the
        held lease named beside them: in a line that passes a lease down, the holder changes at every hand-over,
        and every waiter in a triggerer logged a line each time (a thousand lines per hand-over)."""
        now = list(blockers)
        for b in now:
            self._add(b.request_id, b.owner, b.reason)
        ahead = [b for b in now if not b.granted and b.request_id is not None]   # not the writer limit
        current = tuple((b.request_id, b.owner, b.reason) for b in (ahead or now))
        changed, self._current = current != self._current, current
        return now if changed else []

    def seen(self) -> list[dict[str, Any]]:
        return list(self._seen.values())


@dataclass(frozen=True)
class WaitStep:
    """What one poll found: the request's state (None after a store failure) and how long to sleep."""

    state: LeaseState | None
    delay: float

    @property
    def granted(self) -> bool:
        return self.state is not None and self.state.granted


class LeaseWait:
    """One waiting request, polled until it is granted.

    Each poll is the request's heartbeat, so the interval is at most a third of its TTL (and never
    under ``MIN_POLL_SECONDS``). A request dropped meanwhile (abandoned while nobody polled it, or
    released by someone who took it for dead) is asked for again under the same owner, and
    ``request_id`` moves on. A store failure is retried with a doubling delay (bounded by the same
    third of the TTL); ``MAX_FAILURES`` in a row raise ``LeaseStoreError``. A request that belongs
    to another owner raises ``LeaseOwnershipError`` at once.
    """

    def __init__(self, request: LeaseRequest, request_id: str, interval: float, log: Log, *,
                 seen: Iterable[Mapping[str, Any]] = ()) -> None:
        self.request, self.request_id, self.log = request, request_id, log
        self.interval = max(min(interval, request.ttl / 3), MIN_POLL_SECONDS)
        self.blockers = BlockersSeen(seen)
        self.failures = 0
        self.reacquired = 0
        self.revision: int | None = None   # the pool's revision read before the last poll
        self._granted_at: dict[str, float | None] = {}

    def changed(self, store: LeaseStore) -> bool:
        """Whether the pool moved since the last poll (one cheap read, no lock): a release, a grant, a
        renewal. Polling only then lets a waiter check often. A failed read counts as a change, so the
        poll that follows meets the failure and counts it."""
        now = self._revision(store)
        return now is None or now != self.revision

    def _revision(self, store: LeaseStore) -> int | None:
        try:
            return store.revision(self.request.pool)
        except LeaseStoreError:
            return None

    def expected(self, store: LeaseStore, state: LeaseState, estimate: WaitEstimate) -> float | None:
        """``estimate.expected`` for ``state``, reading when its blockers were granted only for a blocker
        not seen before (a store failure leaves the estimate unknown)."""
        if estimate.typical_hold is None:
            return None
        # A blocker first seen waiting is known with no grant time: read again once it is granted.
        if any(b.granted and self._granted_at.get(str(b.request_id)) is None for b in state.blockers):
            try:
                self._granted_at = granted_times(store, self.request.table)
            except LeaseError:
                return None
        return estimate.expected(state, self._granted_at)

    def poll(self, store: LeaseStore) -> WaitStep:
        """Poll the store once (asking again for a dropped request); raises as the class says."""
        self.revision = self._revision(store)   # before the poll: a change after it is seen by ``changed``
        try:
            state = store.poll_or_ask_again(self.request_id, self.request)
        except LeaseStoreError as exc:
            return self.failed(exc)
        return self.answered(state)

    def answered(self, state: LeaseState) -> WaitStep:
        """Record what ``poll_or_ask_again`` (or ``poll_many``) answered for the request: a new request id when
        it was asked for again."""
        self.failures = 0
        if state.request_id != self.request_id:
            self.log.info("lease request %s of %s was gone (released, or abandoned while nobody polled it); asked "
                          "again for table %s: request %s is %s", self.request_id, self.request.owner,
                          self.request.table, state.request_id, state.status.value)
            self.request_id = state.request_id
            self.reacquired += 1
        return self.seen(state)

    def seen(self, state: LeaseState) -> WaitStep:
        """Record a state of the request (a poll's, or the first ``acquire``'s) and log what changed."""
        if state.granted:
            self.log.info("lease request %s of %s granted after %s s", state.request_id, self.request.owner,
                          "?" if state.waited is None else f"{state.waited:.3f}")
            return WaitStep(state, 0.0)
        for blocker in self.blockers.update(state.blockers):
            self.log.info("lease request %s waits for %s: %s", state.request_id,
                          blocker.owner or "the pool's writer limit", blocker.reason[:LOGGED_REASON_LENGTH])
        return WaitStep(state, self.interval)

    def failed(self, exc: LeaseStoreError) -> WaitStep:
        """Count a store failure (also one opening the store); the delay before the next try.

        Raises:
            LeaseStoreError: the ``MAX_FAILURES``-th failure in a row.
        """
        self.failures += 1
        if self.failures >= MAX_FAILURES:
            raise LeaseStoreError(f"the lease store failed {self.failures} times in a row; last: {exc}") from exc
        delay = min(self.interval * 2 ** (self.failures - 1), self.request.ttl / 3)
        self.log.warning("lease store failed (%d of %d), retrying in %.2f s: %s", self.failures, MAX_FAILURES,
                         delay, exc)
        return WaitStep(None, delay)

    def waited_for(self) -> list[str]:
        return blocker_names(self.blockers.seen())


@dataclass(frozen=True)
class WorkerWait:
    """How a wait in the worker ended: granted, or (adaptive) to be continued deferred."""

    state: LeaseState
    blockers_seen: list[dict[str, Any]]   # ``BlockersSeen.seen()``: handed on to the trigger when it defers
    expected: float | None = None   # seconds still expected when it stopped to defer

    @property
    def waited_for(self) -> list[str]:
        return blocker_names(self.blockers_seen)

    @property
    def granted(self) -> bool:
        return self.state.granted


def wait_in_worker(store: LeaseStore, request: LeaseRequest, state: LeaseState, interval: float, log: Log,
                   stopped: threading.Event, *, rule: WaitRule | None = None, estimate: WaitEstimate | None = None,
                   staying: Callable[[], None] | None = None, seen: Iterable[Mapping[str, Any]] = (),
                   clock: Callable[[], float] = time.monotonic) -> WorkerWait:
    """Drive ``LeaseWait`` in this thread until ``state``'s request is granted, or until ``rule`` (adaptive)
    says to defer: the request then stays in line and the caller hands it to the trigger. ``staying`` is
    called once, when the first poll finds the request waiting here (not deferring, not granted): the
    caller starts what the job will need while it waits. ``seen``: the blockers an earlier part of this
    wait saw (the trigger's, for a task it sent back), kept in the account of whom it waited for.

    Between full polls (every ``interval``, each the request's heartbeat) the pool's revision is read
    every ``WORKER_WAKE_SECONDS``; a change (a release, a grant) is polled at once, so a grant is seen
    within that time.

    Whatever ends the wait early cancels the request and propagates: ``stopped`` set (``on_kill``)
    raises ``JobKilledError``; a store that keeps failing (``LeaseWait``) fails the try (the
    task-level retry policy decides about the next); ``execution_timeout`` too.

    Raises:
        JobKilledError: ``stopped`` was set while the request waited.
    """
    rule = rule or WaitRule(WaitWhere.WORKER)
    estimate = estimate or WaitEstimate(None)
    wait = LeaseWait(request, state.request_id, interval, log, seen=seen)
    wait.blockers.update(state.blockers)   # the caller logged why it waits
    step = WaitStep(state, wait.interval)
    began = next_poll = clock()   # the first poll at once: a release since the caller's acquire is seen
    try:
        # A kill is checked before each poll and once more after the grant (it may land during a poll).
        while not step.granted:
            if stopped.wait(max(0.0, min(WORKER_WAKE_SECONDS, next_poll - clock()))):
                break
            if clock() < next_poll and (step.state is None or not wait.changed(store)):
                continue   # nothing moved (or a failure's back-off runs): sleep on
            step = wait.poll(store)
            next_poll = clock() + step.delay
            if step.state is not None and not step.granted and rule.where is not WaitWhere.WORKER:
                expected = wait.expected(store, step.state, estimate)
                if rule.defers(expected, clock() - began):
                    log.info("lease request %s: %s; waiting deferred from here", step.state.request_id,
                             f"about {expected:.1f} s more expected" if expected is not None
                             else f"waited {clock() - began:.1f} s in the worker")
                    return WorkerWait(step.state, wait.blockers.seen(), expected)
            if staying is not None and step.state is not None and not step.granted:
                staying()
                staying = None
        if stopped.is_set():
            raise JobKilledError(f"the task was killed while its lease request {wait.request_id} on "
                                 f"{request.table} waited; the request is cancelled")
    except BaseException:
        cancel_requests(store, request.owner, {wait.request_id}, table=request.table, log=log)
        raise
    assert step.state is not None  # granted
    log.info("lease request %s granted after %.3f s in the worker", step.state.request_id, step.state.waited or 0.0)
    return WorkerWait(step.state, wait.blockers.seen())


def cancel_requests(store: LeaseStore, owner: str, request_ids: Iterable[str], *, table: str | None,
                    log: Log) -> set[str]:
    """Release ``request_ids``, then every other live request of ``owner`` (one task try) on ``table``, so
    a holder that stops waiting keeps no place in line; the ids released.

    Never raises: it runs where another error is already on its way (a kill, a timeout, a store that
    kept failing). The requests it knows are released first, so a store that cannot list its records
    still loses them; each failure is logged, and what was not released is abandoned after its TTL.
    """
    known = sorted({i for i in request_ids if i})
    released = {i for i in known if release_quietly(store, i, owner, log)}
    if table is None:
        return released
    try:
        others = sorted({r.request_id for r in store.records(table=table) if r.owner == owner} - set(known))
    except LeaseError as exc:
        log.error("could not list the lease requests of %s on %s to cancel them (they are abandoned after their "
                  "TTL): %s", owner, table, exc)
        return released
    return released | {i for i in others if release_quietly(store, i, owner, log)}


# -- holding the lease while a job runs -------------------------------------------------------------
@dataclass
class HeldLease:
    """A granted lease while the job runs; ``lost`` is set by the heartbeat. ``release_note`` is what the job
    wants the release's audit line to say (an attempt stopped early, say)."""

    pool: str
    request_id: str
    owner: str
    waited: float
    waited_for: list[str] = field(default_factory=list)
    lost: bool = False
    release_note: str = ""


class _Heartbeat(threading.Thread):
    """Renews the lease every ``interval`` seconds until stopped or the lease is lost."""

    def __init__(self, store: LeaseStore, lease: HeldLease, interval: float, log: Log) -> None:
        super().__init__(name=f"delta-lease-heartbeat-{lease.request_id}", daemon=True)
        self.store, self.lease, self.interval, self.log = store, lease, interval, log
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.store.renew(self.lease.request_id, self.lease.owner)
            except LeaseLostError as exc:
                # The job goes on: Delta's commit check still refuses a conflicting commit.
                self.lease.lost = True
                self.log.error("conflict pool %s: lease %s lost while the job runs; the pool no longer keeps "
                               "conflicting writers away (Delta's commit check still guards the table): %s",
                               self.lease.pool, self.lease.request_id, exc)
                return
            except LeaseError as exc:  # a store hiccup: the next beat may succeed well within the TTL
                self.log.warning("conflict pool %s: renewing lease %s failed: %s", self.lease.pool,
                                 self.lease.request_id, exc)


@contextmanager
def holding(store: LeaseStore, lease: HeldLease, heartbeat: float, log: Log) -> Iterator[HeldLease]:
    """Keep ``lease`` renewed while the block runs; release it afterwards, whatever the block's outcome.

    A failed release is logged, never raised: it must not replace the job's own result or error (the
    lease then expires after its TTL).
    """
    beat = _Heartbeat(store, lease, heartbeat, log)
    beat.start()
    try:
        yield lease
    finally:
        beat.stopped.set()
        beat.join(heartbeat + 30)
        release_quietly(store, lease.request_id, lease.owner, log, note=lease.release_note)


def release_quietly(store: LeaseStore, request_id: str, owner: str, log: Log, *, note: str = "") -> bool:
    """Release a lease or request, logging (not raising) a failure: it expires after its TTL anyway.
    Whether a live lease or request was released. ``note`` goes into the release's audit line."""
    try:
        released = store.release(request_id, owner, note=note)
        log.info("lease %s of %s %s", request_id, owner, "released" if released else "was already gone")
        return bool(released)
    except LeaseError as exc:
        log.error("could not release lease %s of %s (it expires after its TTL): %s", request_id, owner, exc)
        return False
