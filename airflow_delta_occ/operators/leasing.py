"""Conflict-pool leases for Delta operators: which pool, the request, and holding the lease while a job runs.

``DeltaBaseOperator`` (``conflict_pool=``) asks its pool's lease store for a lease on the job's
footprint before Spark starts, waits for it in the triggerer when told to, and holds it (renewed by a
heartbeat thread) while the job runs. The lease is a scheduling aid, not the guard: Delta's own
commit check still refuses a conflicting commit, so a lease lost mid-job is reported, not fatal.

The DAG processor imports this module with the operators, so it loads no pyarrow: the request
types (which import the engine) are imported inside the functions that build requests.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from airflow_delta_occ import config
from airflow_delta_occ.exceptions import JobKilledError, LeaseError, LeaseLostError, PoolConfigError

if TYPE_CHECKING:
    from airflow_delta_occ.pools.config import Pool
    from airflow_delta_occ.pools.leases.base import LeaseStore
    from airflow_delta_occ.pools.requests import Blocker, LeaseRequest, LeaseState

    from .delta import PreparedJob


class Log(Protocol):
    """What is logged to: the operator's logger (Airflow's structlog-backed one, or ``logging``'s)."""

    def info(self, msg: str, /, *args: Any) -> Any: ...

    def warning(self, msg: str, /, *args: Any) -> Any: ...

    def error(self, msg: str, /, *args: Any) -> Any: ...


# -- which pool -----------------------------------------------------------------------------------
def configured_pool(name: str) -> Pool | None:
    """The pool ``name`` of the pool file, or None when no pool file is configured here.

    Used at DAG parse time: a DAG processor without ``[delta_occ] pool_file`` cannot check the name,
    and the task still fails at run time (``required_pool``) if the worker has no pool file either.

    Raises:
        PoolConfigError: the pool file cannot be read, or has no pool ``name``; the message names it.
    """
    try:
        pools = config.pool_config()
        return None if pools is None else pools.get(name)
    except PoolConfigError as exc:
        raise PoolConfigError(f"conflict_pool={name!r}: {exc}") from exc


def required_pool(name: str) -> Pool:
    """The pool ``name``; at run time a pool file is needed (a task cannot be leased without one).

    Raises:
        PoolConfigError: no pool file is configured, it cannot be read, or it has no pool ``name``.
    """
    pool = configured_pool(name)
    if pool is None:
        raise PoolConfigError(f"conflict_pool={name!r}: no pool file is configured; set [delta_occ] pool_file "
                              "(see docs/pools.md)")
    return pool


def route_to_airflow_pool(kwargs: dict[str, Any], default_args: Mapping[str, Any] | None,
                          conflict_pool: str | None) -> None:
    """A task of a conflict pool runs in the pool's Airflow pool (so the scheduler caps its writers),
    unless the author (or the DAG's ``default_args``) chose a pool. The pool name is checked here, at
    parse time, when the pool file is configured. Used by every Delta operator and the sensor.

    Raises:
        PoolConfigError: the pool file cannot be read or has no such pool.
    """
    if conflict_pool is None:
        return
    pool = configured_pool(conflict_pool)
    if pool is not None and "pool" not in kwargs and "pool" not in (default_args or {}):
        kwargs["pool"] = pool.airflow_pool


def pooled_table(pool: Pool, location: str) -> str:
    """The table's normalized location, checked to belong to ``pool``.

    Raises:
        PoolConfigError: the table is not covered by the pool's patterns (leasing it there would not
            keep it apart from writers leased in its own pool, or in none).
    """
    from airflow_delta_occ.engine.object_store import redact_uri
    from airflow_delta_occ.hooks.storage import mask_uri_secrets
    from airflow_delta_occ.pools.config import normalize_table

    try:
        table = normalize_table(location)
    except ValueError as exc:
        mask_uri_secrets(location)  # credentials in the URI: shown as *** here, masked in the task's logs
        raise PoolConfigError(f"conflict_pool={pool.name!r}: table {redact_uri(location)!r}: {exc}") from exc
    if pool.matching_pattern(table) is None:
        raise PoolConfigError(f"table {table!r} is not in conflict pool {pool.name!r} (patterns: "
                              f"{', '.join(pool.tables)}); add it to the pool file or change conflict_pool")
    return table


# -- the request ----------------------------------------------------------------------------------
def lease_owner(context: Mapping[str, Any]) -> str:
    """One string per task try: the same before and after a deferral (the try number does not change)."""
    ti = context["ti"]
    return (f"{ti.dag_id}/{ti.task_id}/{context['run_id']}/{getattr(ti, 'map_index', -1)}/"
            f"{int(getattr(ti, 'try_number', 1) or 1)}")


def lease_request(pool: Pool, prepared: PreparedJob, owner: str) -> LeaseRequest:
    """The request for ``prepared``'s footprint, with the pool's model, limit and TTL copied in.

    Raises:
        PoolConfigError: the table is not in the pool.
    """
    from airflow_delta_occ.engine.planner import TableState
    from airflow_delta_occ.pools.requests import LeaseRequest

    return LeaseRequest.of(pool=pool.name, table=pooled_table(pool, prepared.location), owner=owner,
                           footprint=prepared.footprint, table_state=TableState.of(prepared.snapshot),
                           model=pool.model, max_writers=pool.max_writers, ttl=pool.lease_ttl)


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


# -- waiting in the worker (deferrable=False) -------------------------------------------------------
DEFERRED_POLL_SECONDS = 2.0   # the triggerer polls the store for every deferred task: not too often
WORKER_POLL_SECONDS = 0.5     # a waiting worker polls its own request: a grant is seen within this
MIN_POLL_SECONDS = 0.01       # a smaller interval would spin on the store


def check_poll_interval(value: object) -> None:
    """Raises ``PoolConfigError`` (at DAG parse time) unless ``value`` is ``None`` or a positive number of seconds."""
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


def wait_in_worker(store: LeaseStore, request: LeaseRequest, state: LeaseState, interval: float, log: Log,
                   stopped: threading.Event) -> tuple[LeaseState, list[str]]:
    """Poll until ``state``'s request is granted; the granted state and who it waited for.

    A request that was dropped meanwhile (abandoned, or released by someone who thought it dead) is
    asked for again (``LeaseStore.poll_or_ask_again``). Each poll is the waiter's heartbeat, so the
    interval is capped at a third of the request's TTL. Whatever ends the wait early cancels the
    request and propagates: ``stopped`` set (``on_kill``) raises ``JobKilledError``; a store error
    fails the try (the task-level retry policy decides about the next); ``execution_timeout`` too.

    Raises:
        JobKilledError: ``stopped`` was set while the request waited.
    """
    step = max(min(interval, request.ttl / 3), MIN_POLL_SECONDS)
    waited_for = blocker_names(state.blockers)
    try:
        # A kill is checked before each poll and once more after the grant (it may land during a poll).
        while not state.granted and not stopped.wait(step):
            before = state.request_id
            state = store.poll_or_ask_again(before, request)
            if state.request_id != before:
                log.info("lease request %s was gone; asked again: request %s is %s", before, state.request_id,
                         state.status.value)
            waited_for += [name for name in blocker_names(state.blockers) if name not in waited_for]
        if stopped.is_set():
            raise JobKilledError(f"the task was killed while its lease request {state.request_id} on "
                                 f"{request.table} waited; the request is cancelled")
    except BaseException:
        release_quietly(store, state.request_id, request.owner, log)
        raise
    log.info("lease request %s granted after %.3f s in the worker", state.request_id, state.waited or 0.0)
    return state, waited_for


# -- holding the lease ----------------------------------------------------------------------------
@dataclass
class HeldLease:
    """A granted lease while the job runs; ``lost`` is set by the heartbeat. ``to_json`` is the XCom part."""

    pool: str
    request_id: str
    owner: str
    waited: float
    waited_for: list[str] = field(default_factory=list)
    lost: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"pool": self.pool, "request_id": self.request_id, "waited": round(self.waited, 3),
                "waited_for": list(self.waited_for), "lost": self.lost}


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


def release_quietly(store: LeaseStore, request_id: str, owner: str, log: Log) -> None:
    """Release a lease or request, logging (not raising) a failure: it expires after its TTL anyway."""
    try:
        released = store.release(request_id, owner)
        log.info("lease %s of %s %s", request_id, owner, "released" if released else "was already gone")
    except LeaseError as exc:
        log.error("could not release lease %s of %s (it expires after its TTL): %s", request_id, owner, exc)
