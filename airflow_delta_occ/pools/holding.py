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
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
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
    from airflow_delta_occ.pools.requests import Blocker, LeaseRequest, LeaseState


class Log(Protocol):
    """What is logged to: an operator's or trigger's logger (Airflow's, or ``logging``'s)."""

    def info(self, msg: str, /, *args: Any) -> Any: ...

    def warning(self, msg: str, /, *args: Any) -> Any: ...

    def error(self, msg: str, /, *args: Any) -> Any: ...


DEFERRED_POLL_SECONDS = 2.0   # the triggerer polls the store for every deferred task: not too often
WORKER_POLL_SECONDS = 0.5     # a waiting worker polls its own request: a grant is seen within this
MIN_POLL_SECONDS = 0.01       # a smaller interval would spin on the store
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


# -- the request ----------------------------------------------------------------------------------
def request_for(pool: Pool, *, table: str, owner: str, footprint: Footprint, snapshot: Snapshot,
                ttl: float | None = None) -> LeaseRequest:
    """The request for ``footprint`` on ``table`` (normalized, in ``pool``), with the pool's model,
    writer limit and TTL (or ``ttl``) copied in."""
    from airflow_delta_occ.engine.planner import TableState
    from airflow_delta_occ.pools.requests import LeaseRequest

    return LeaseRequest.of(pool=pool.name, table=table, owner=owner, footprint=footprint,
                           table_state=TableState.of(snapshot), model=pool.model, max_writers=pool.max_writers,
                           ttl=ttl or pool.lease_ttl)


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


# -- waiting: one loop, driven by a worker's thread or the triggerer's event loop ----------------------
class BlockersSeen:
    """The distinct leases and requests a wait was blocked by, and whether the current set changed."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str | None, str | None], dict[str, Any]] = {}
        self._current: tuple[tuple[str | None, str | None, str], ...] = ()

    def update(self, blockers: Iterable[Blocker]) -> list[Blocker]:
        """Record ``blockers``; returns them when they differ from the previous poll's (to log), else []."""
        now = list(blockers)
        for b in now:
            if (b.request_id, b.owner) not in self._seen and len(self._seen) < MAX_BLOCKERS_SEEN:
                self._seen[(b.request_id, b.owner)] = {"request_id": b.request_id, "owner": b.owner,
                                                       "reason": b.reason[:MAX_REASON_LENGTH]}
        current = tuple((b.request_id, b.owner, b.reason) for b in now)
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

    def __init__(self, request: LeaseRequest, request_id: str, interval: float, log: Log) -> None:
        self.request, self.request_id, self.log = request, request_id, log
        self.interval = max(min(interval, request.ttl / 3), MIN_POLL_SECONDS)
        self.blockers = BlockersSeen()
        self.failures = 0
        self.reacquired = 0

    def poll(self, store: LeaseStore) -> WaitStep:
        """Poll the store once (asking again for a dropped request); raises as the class says."""
        try:
            state = store.poll_or_ask_again(self.request_id, self.request)
        except LeaseStoreError as exc:
            return self.failed(exc)
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


def wait_in_worker(store: LeaseStore, request: LeaseRequest, state: LeaseState, interval: float, log: Log,
                   stopped: threading.Event) -> tuple[LeaseState, list[str]]:
    """Drive ``LeaseWait`` in this thread until ``state``'s request is granted; the granted state and
    who it waited for.

    Whatever ends the wait early cancels the request and propagates: ``stopped`` set (``on_kill``)
    raises ``JobKilledError``; a store that keeps failing (``LeaseWait``) fails the try (the
    task-level retry policy decides about the next); ``execution_timeout`` too.

    Raises:
        JobKilledError: ``stopped`` was set while the request waited.
    """
    wait = LeaseWait(request, state.request_id, interval, log)
    wait.blockers.update(state.blockers)   # the caller logged why it waits
    step = WaitStep(state, wait.interval)
    try:
        # A kill is checked before each poll and once more after the grant (it may land during a poll).
        while not step.granted and not stopped.wait(step.delay):
            step = wait.poll(store)
        if stopped.is_set():
            raise JobKilledError(f"the task was killed while its lease request {wait.request_id} on "
                                 f"{request.table} waited; the request is cancelled")
    except BaseException:
        cancel_requests(store, request.owner, {wait.request_id}, table=request.table, log=log)
        raise
    assert step.state is not None  # granted
    log.info("lease request %s granted after %.3f s in the worker", step.state.request_id, step.state.waited or 0.0)
    return step.state, wait.waited_for()


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
    """A granted lease while the job runs; ``lost`` is set by the heartbeat."""

    pool: str
    request_id: str
    owner: str
    waited: float
    waited_for: list[str] = field(default_factory=list)
    lost: bool = False


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
        release_quietly(store, lease.request_id, lease.owner, log)


def release_quietly(store: LeaseStore, request_id: str, owner: str, log: Log) -> bool:
    """Release a lease or request, logging (not raising) a failure: it expires after its TTL anyway.
    Whether a live lease or request was released."""
    try:
        released = store.release(request_id, owner)
        log.info("lease %s of %s %s", request_id, owner, "released" if released else "was already gone")
        return bool(released)
    except LeaseError as exc:
        log.error("could not release lease %s of %s (it expires after its TTL): %s", request_id, owner, exc)
        return False
