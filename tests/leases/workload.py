"""Many processes hammering one SQL lease store, and the audit analyser that proves what the store promised.

The workers record nothing but counts and how long each store call took: the proof comes from the store's own
audit (``LeaseStore.history``), which holds every request with its footprint (``REQUEST``/``REPLAN`` detail),
every grant, renewal, release and expiry. ``analyse`` re-judges every pair of leases that were held together
with ``compare.lease_verdict``, independently of the store's arbiter, so a store that grants two conflicting
jobs together, overtakes a waiter, exceeds a writer limit, loses a lease or starves a request fails the test.

Processes are started with the ``spawn`` context: each one opens its own ``SqlLeaseStore`` (SQLAlchemy engines
must not cross ``fork``) and rebuilds the menu of footprints from the tables' paths, so no footprint, store or
connection is ever pickled; a worker only gets a ``WorkerSpec`` of plain values.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import queue
import random
import threading
import time
import traceback
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from airflow_delta_occ.engine import DeltaLog, Snapshot
from airflow_delta_occ.engine.planner import Footprint, Operation, TableState, Verdict, plan_footprint
from airflow_delta_occ.exceptions import LeaseLostError
from airflow_delta_occ.pools.compare import lease_verdict
from airflow_delta_occ.pools.leases.base import LeaseStore
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
from airflow_delta_occ.pools.requests import AuditEvent, AuditKind, LeaseRequest, LeaseRequestError, LeaseStatus

POOL = "contention"
HOLD = (0.005, 0.060)            # seconds a worker holds a granted lease (uniform)
POLL = (0.010, 0.020)            # seconds between two polls of a waiting request (uniform)
RENEW_PROBABILITY = 0.3          # share of leases renewed once, after the hold and before the release
TTL = 15.0                       # far above any hold: a lease only expires here when a worker stalls
OPS_PER_LINK = 3                 # store calls a waiter's predecessor makes between its grant and its release
WAIT_SLACK = 3.0                 # heavy-tailed call latency and scheduler noise (see WaitBound)

PARTITIONED = {"sales": (("2024-01-01", "2024-01-02", "2024-01-03"), ("DE", "FR", "IT", "ES")),
               "orders": (("2024-01-01", "2024-01-02"), ("DE", "FR", "US"))}
UNPARTITIONED = "customers"
# How often each table is picked: the unpartitioned table serializes nearly every job, so it gets a small share.
TABLE_WEIGHTS = {"sales": 0.5, "orders": 0.35, UNPARTITIONED: 0.15}
NEW_PARTITION = {"date": "2024-01-09", "country": "DE"}


# -- tables and the menu of footprints ---------------------------------------------------------------------------

def build_tables(root: Path) -> dict[str, str]:
    """Write the three tables' Delta logs under ``root``; returns table key -> path.

    ``sales`` and ``orders`` are partitioned by (date, country), two files (one in ``orders``) per partition;
    ``customers`` is unpartitioned with three files. Only logs exist: planning reads nothing else.
    """
    # Imported here: the log builder needs pyarrow, which the workers (that only read logs) need not load.
    from ..unit.engine.logbuilder import LogBuilder, add, commit_info, metadata, protocol

    paths = {}
    for name, (dates, countries) in PARTITIONED.items():
        builder = LogBuilder(root / name)
        builder.commit(commit_info("CREATE TABLE"), protocol(), metadata())
        per_partition = 2 if name == "sales" else 1
        builder.commit(commit_info(), *(add(f"{d}-{c}-{i}.parquet", {"date": d, "country": c})
                                        for d in dates for c in countries for i in range(per_partition)))
        paths[name] = builder.root
    builder = LogBuilder(root / UNPARTITIONED)
    builder.commit(commit_info("CREATE TABLE"), protocol(), metadata(partition_columns=()))
    builder.commit(commit_info(), *(add(f"part-{i}.parquet") for i in range(3)))
    paths[UNPARTITIONED] = builder.root
    return paths


@dataclass(frozen=True)
class MenuItem:
    """One job a worker may ask a lease for: a footprint planned on the table's snapshot, and how often."""

    table: str
    footprint: Footprint
    state: TableState
    weight: float


def build_menu(tables: Mapping[str, str]) -> dict[str, list[MenuItem]]:
    """Per table key, the footprints of the workload: disjoint and overlapping partitions, whole-table jobs.

    Partitioned tables get, for every partition, an UPDATE, a DELETE (same partition: overlaps the UPDATE)
    and a MERGE pinned to it, and a blind INSERT pinned to it; then a range UPDATE (``date >= '2024-01-02'``),
    OPTIMIZE of the whole table and of one partition, an INSERT into a new partition, a property change and
    an added column. The unpartitioned table gets a DML job of each kind, OPTIMIZE, INSERT and both metadata
    changes. Labels name the job, so a failure report says which two jobs overlapped.
    """
    return {table: _menu_for(table, DeltaLog.for_table(path).snapshot()) for table, path in sorted(tables.items())}


def _menu_for(table: str, snapshot: Snapshot) -> list[MenuItem]:
    state = TableState.of(snapshot)
    items: list[MenuItem] = []

    def item(operation: Operation, predicate: str | None, label: str, weight: float, **planner: Any) -> None:
        footprint = plan_footprint(snapshot, operation, predicate, label=f"{table}: {label}", **planner)
        items.append(MenuItem(table, footprint, state, weight))

    if snapshot.partition_columns:
        partitions = sorted({(f.partition_values["date"], f.partition_values["country"])
                             for f in snapshot.files()}, key=repr)
        for date, country in partitions:
            where = f"date = '{date}' AND country = '{country}'"
            pinned = [{"date": date, "country": country}]
            item(Operation.UPDATE, where, f"UPDATE {date}/{country}", 1.0)
            item(Operation.DELETE, f"{where} AND id = 7", f"DELETE {date}/{country}", 1.0)
            item(Operation.MERGE, where, f"MERGE {date}/{country}", 1.0, write_partitions=pinned)
            item(Operation.INSERT, None, f"INSERT into {date}/{country}", 0.5, write_partitions=pinned)
        first_date, first_country = partitions[0]
        item(Operation.UPDATE, "date >= '2024-01-02'", "UPDATE date >= 2024-01-02", 1.0)
        item(Operation.OPTIMIZE, None, "OPTIMIZE whole table", 0.4)
        item(Operation.OPTIMIZE, f"date = '{first_date}' AND country = '{first_country}'",
             f"OPTIMIZE {first_date}/{first_country}", 1.0)
        item(Operation.INSERT, None, "INSERT into a new partition", 1.0, write_partitions=[NEW_PARTITION])
        item(Operation.SET_PROPERTIES, None, "SET TBLPROPERTIES", 0.3, properties={"owner.team": "lake"})
        item(Operation.SCHEMA_CHANGE, None, "ADD COLUMN", 0.3)
    else:
        item(Operation.UPDATE, "id = 1", "UPDATE id = 1", 1.0)
        item(Operation.DELETE, "id = 2", "DELETE id = 2", 1.0)
        item(Operation.MERGE, "id = 3", "MERGE id = 3", 1.0)
        item(Operation.OPTIMIZE, None, "OPTIMIZE", 0.5)
        item(Operation.INSERT, None, "INSERT", 2.0)
        item(Operation.SET_PROPERTIES, None, "SET TBLPROPERTIES", 0.3, properties={"owner.team": "lake"})
        item(Operation.SCHEMA_CHANGE, None, "ADD COLUMN", 0.3)
    return items


def find_item(menu: Mapping[str, Sequence[MenuItem]], table: str, label: str) -> MenuItem:
    """The menu's job on ``table`` labelled ``label`` (the text after ``"<table>: "``)."""
    return next(i for i in menu[table] if i.footprint.label == f"{table}: {label}")


def request_for(item: MenuItem, owner: str, *, pool: str = POOL, max_writers: int | None = None,
                ttl: float = TTL, expected_hold: float | None = None) -> LeaseRequest:
    return LeaseRequest.of(pool=pool, table=item.table, owner=owner, footprint=item.footprint,
                           table_state=item.state, max_writers=max_writers, ttl=ttl, expected_hold=expected_hold)


# -- the worker ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs, as plain values (the only thing that crosses the process boundary)."""

    url: str
    tables: dict[str, str]
    worker: int
    duration: float
    seed: int
    # The load runs ``duration`` seconds, and on until the workers together have had ``min_grants`` grants (a
    # slow machine then proves as much as a fast one, only later), but never past ``max_duration``.
    min_grants: int = 0
    max_duration: float = math.inf
    pool: str = POOL
    max_writers: int | None = None
    ttl: float = TTL
    hold: tuple[float, float] = HOLD
    poll: tuple[float, float] = POLL
    renew_probability: float = RENEW_PROBABILITY
    give_up_after: float = 60.0   # a request still waiting this long after the load ends is cancelled and counted


def run_worker(spec: WorkerSpec, barrier: Any, results: Any, grants: Any) -> None:
    """Process entry point: run the load, put ``{"worker", "counts", "latencies"}`` (or ``"error"``) on ``results``.

    ``grants`` is the count of grants of every worker (a ``multiprocessing.Value``), for ``spec.min_grants``.
    """
    try:
        results.put(_work(spec, barrier, grants))
    except BaseException:
        barrier.abort()  # a worker that dies before the start must not leave the others waiting for it
        results.put({"worker": spec.worker, "error": traceback.format_exc()})


def _work(spec: WorkerSpec, barrier: Any, grants: Any) -> dict[str, Any]:
    store = SqlLeaseStore(spec.url)
    menu = build_menu(spec.tables)
    templates = {table: [request_for(i, f"w{spec.worker}", pool=spec.pool, max_writers=spec.max_writers, ttl=spec.ttl)
                         for i in items] for table, items in menu.items()}
    weights = {table: [i.weight for i in items] for table, items in menu.items()}
    tables = sorted(menu)
    rng = random.Random(spec.seed)
    counts: Counter[str] = Counter()
    latencies: list[float] = []

    def timed(call: Any, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return call(*args)
        finally:
            latencies.append(time.perf_counter() - started)

    barrier.wait(timeout=300)
    started = time.monotonic()
    deadline, cap = started + spec.duration, started + spec.max_duration
    ended: list[float] = []   # when this worker first saw the load over

    def loading() -> bool:
        now = time.monotonic()
        if now < cap and (now < deadline or grants.value < spec.min_grants):
            return True
        ended[:] = ended or [now]
        return False

    n = 0
    while loading():
        table = rng.choices(tables, [TABLE_WEIGHTS.get(t, 1.0) for t in tables])[0]
        owner = f"w{spec.worker}-{n}"
        n += 1
        # Each request says what it expects to hold (drawn from the hold range: estimates that are wrong both
        # ways, as the operators' medians are), so the arbiter's rule 2a (going ahead in the holders' shadow)
        # runs under this load, at every distance from a holder's expected end, and ``analyse`` judges it.
        request = replace(rng.choices(templates[table], weights[table])[0], owner=owner,
                          expected_hold=rng.uniform(*spec.hold))
        state = timed(store.acquire, request)
        counts["requests"] += 1
        if not state.granted:
            counts["waited"] += 1
        while not state.granted:
            if state.status is LeaseStatus.GONE:
                counts["gone_while_waiting"] += 1
                break
            if not loading() and time.monotonic() > ended[0] + spec.give_up_after:
                timed(store.release, state.request_id, owner)
                counts["gave_up"] += 1
                break
            time.sleep(rng.uniform(*spec.poll))
            state = timed(store.poll, state.request_id, owner)
        if not state.granted:
            continue
        counts["granted"] += 1
        with grants.get_lock():
            grants.value += 1
        time.sleep(rng.uniform(*spec.hold))
        if rng.random() < spec.renew_probability:
            timed(store.renew, state.request_id, owner)
            counts["renewed"] += 1
        counts["released" if timed(store.release, state.request_id, owner) else "release_found_nothing"] += 1
    counts.update({f"writes_{kind}": n for kind, n in store.writes.items()})   # PostgreSQL: how writes landed
    store.close()
    return {"worker": spec.worker, "counts": dict(counts), "latencies": latencies}


CRASH_HOLDER_JOB = ("sales", "OPTIMIZE whole table")
CRASH_WAITER_JOB = ("sales", "UPDATE 2024-01-01/DE")   # can conflict with the compaction: it must wait for it


def hold_and_heartbeat(url: str, tables: dict[str, str], ttl: float, heartbeat: float, out: Any) -> None:
    """Process entry point: take a lease on ``CRASH_HOLDER_JOB`` and renew it every ``heartbeat`` s until killed.

    Puts ``{"request_id", "owner"}`` on ``out`` once granted (or ``{"error"}``); a renewal that fails ends the
    process with the error on ``out``, so a holder that lost its lease while alive is reported, not hidden.
    """
    try:
        store = SqlLeaseStore(url)
        owner = "crash-holder"
        state = store.acquire(request_for(find_item(build_menu(tables), *CRASH_HOLDER_JOB), owner, ttl=ttl))
        if not state.granted:
            raise AssertionError(f"the holder was not granted at once on an empty pool: {state}")
        out.put({"request_id": state.request_id, "owner": owner})
        while True:
            time.sleep(heartbeat)
            store.renew(state.request_id, owner)
    except BaseException:
        out.put({"error": traceback.format_exc()})


HEARTBEAT_POOL = "heartbeat"
HEARTBEAT_JOB = ("orders", "INSERT into a new partition")


def heartbeat_probe(url: str, tables: dict[str, str], ttl: float, heartbeat: float, stop: Any, out: Any) -> None:
    """Process entry point: hold a lease in its own pool and renew it every ``heartbeat`` s until ``stop`` is set.

    Puts ``{"started": True}`` on ``out`` once granted, then ``{"renewals", "max_renew", "lost"}`` (``lost``: the
    ``LeaseLostError`` text, or ``None``), or ``{"error"}``. A live holder whose renewals keep coming must never
    lose its lease, whatever other pools are doing.
    """
    try:
        store = SqlLeaseStore(url)
        owner = "heartbeat-probe"
        state = store.acquire(request_for(find_item(build_menu(tables), *HEARTBEAT_JOB), owner,
                                          pool=HEARTBEAT_POOL, ttl=ttl))
        if not state.granted:
            raise AssertionError(f"the probe was not granted at once in its own pool: {state}")
        out.put({"started": True})
        renewals: list[float] = []
        lost = None
        while not stop.wait(heartbeat):
            started = time.perf_counter()
            try:
                store.renew(state.request_id, owner)
            except LeaseLostError as exc:
                lost = f"{exc} (renewal {len(renewals) + 1}, after {heartbeat} s of sleep and a call of " \
                       f"{time.perf_counter() - started:.2f} s)"
                break
            renewals.append(time.perf_counter() - started)
        store.release(state.request_id, owner)
        store.close()
        out.put({"renewals": len(renewals), "max_renew": max(renewals, default=0.0), "lost": lost})
    except BaseException:
        out.put({"error": traceback.format_exc()})


# -- the harness --------------------------------------------------------------------------------------------------

@dataclass
class ContentionRun:
    """What a run left behind: the pool's audit, the workers' counts, and the latency of each store call."""

    events: list[AuditEvent]
    counts: Counter[str]
    latencies: list[float]
    load_seconds: float
    leftovers: int            # live requests found after every worker stopped (the cleanup expired them)

    @property
    def mean_latency(self) -> float:
        return sum(self.latencies) / len(self.latencies) if self.latencies else 0.0

    def latency_quantile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] if ordered else 0.0


def run_contention(url: str, tables: Mapping[str, str], *, workers: int, duration: float, pool: str = POOL,
                   max_writers: int | None = None, seed: int = 0, ttl: float = TTL, min_grants: int = 0,
                   max_duration: float | None = None) -> ContentionRun:
    """Start ``workers`` spawned processes on the store at ``url``, release them together, and collect the audit.

    The load lasts ``duration`` seconds, longer if the workers have had fewer than ``min_grants`` grants by then,
    up to ``max_duration`` (ten times ``duration`` by default: only a store that hangs gets that far).

    Raises:
        AssertionError: a worker failed (its traceback is in the message) or did not finish in time.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers + 1)
    results = ctx.Queue()
    grants = ctx.Value("q", 0)
    max_duration = 10 * duration if max_duration is None else max_duration
    specs = [WorkerSpec(url=url, tables=dict(tables), worker=i, duration=duration, seed=seed * 1000 + i, pool=pool,
                        max_writers=max_writers, ttl=ttl, min_grants=min_grants, max_duration=max_duration)
             for i in range(workers)]
    processes = [ctx.Process(target=run_worker, args=(s, barrier, results, grants), name=f"lease-worker-{s.worker}")
                 for s in specs]
    SqlLeaseStore(url).close()  # creates the schema before the workers race to
    outputs: list[dict[str, Any]] = []
    try:
        for process in processes:
            process.start()
        try:
            barrier.wait(timeout=300)
        except threading.BrokenBarrierError:
            outputs = _drain(results, workers, timeout=10)
            raise AssertionError("a worker failed before the load started:\n"
                                 + "\n".join(o.get("error", "") for o in outputs)) from None
        started = time.monotonic()
        outputs = _drain(results, workers, timeout=max_duration + specs[0].give_up_after + 120)
        load_seconds = time.monotonic() - started
        for process in processes:
            process.join(timeout=30)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    errors = [o["error"] for o in outputs if "error" in o]
    assert not errors, f"{len(errors)} worker(s) failed:\n" + "\n".join(errors)
    assert len(outputs) == workers, f"only {len(outputs)} of {workers} workers reported"
    counts: Counter[str] = Counter()
    latencies: list[float] = []
    for output in outputs:
        counts.update(output["counts"])
        latencies.extend(output["latencies"])
    with SqlLeaseStore(url) as store:
        leftovers = expire_leftovers(store, pool, timeout=3 * ttl)
        events = store.history(pool=pool, limit=10**9)
    return ContentionRun(events, counts, latencies, load_seconds, leftovers)


def _drain(results: Any, n: int, *, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    found: list[dict[str, Any]] = []
    while len(found) < n and time.monotonic() < deadline:
        try:
            found.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            break
    return found


def expire_leftovers(store: LeaseStore, pool: str, *, timeout: float) -> int:
    """Poll every live request left in ``pool`` until the store expires it; returns how many there were.

    Workers release what they hold, so this finds nothing unless one stalled or died. A poll renews only a
    waiter, never a holder, so a dead holder's lease expires at its TTL, the waiters behind it are granted
    and then expire too; every grant then ends with a RELEASE or an EXPIRE in the audit.

    Raises:
        AssertionError: requests were still live after ``timeout`` seconds.
    """
    left = store.records(pool=pool)
    deadline = time.monotonic() + timeout
    while store.records(pool=pool):
        assert time.monotonic() < deadline, f"requests still live in {pool!r} after {timeout} s of cleanup"
        for record in store.records(pool=pool):
            store.poll(record.request_id, record.owner)
        time.sleep(0.2)
    return len(left)


# -- the analyser -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WaitBound:
    """How long a request may wait for its grant, from the hold times of the workload.

    Each worker has at most one live request, so a request R finds at most ``workers - 1`` requests ahead of it.
    Only those can delay it: a later request that can conflict with R never overtakes it (the fairness rule),
    and one that cannot conflict never blocks it. In the worst case they hold one after another, and each link
    of that chain costs its worker at most one poll interval to notice its grant, its hold, and ``OPS_PER_LINK``
    store calls (the poll that sees the grant, a renewal, the release: ``per_op_overhead`` in total). R's
    grant is recorded in the transaction that releases the last of them, so::

        bound = (workers - 1) * (max_hold + poll_interval + per_op_overhead) * slack

    ``per_op_overhead`` is what a store call costs *under this load*, lock queueing included: on a saturated
    store (every poll takes the pool's lock) it dwarfs the hold times, so it is measured in the same run (the
    workers time every call; ``for_run`` takes the mean) rather than assumed. ``slack`` (``WAIT_SLACK``) covers
    the spread of a chain's sum around that mean: call latency is heavy-tailed (SQLite's busy handler sleeps
    and retries instead of queueing, so an unlucky call waits seconds) and many processes share few cores. A
    waiter that is starved (overtaken again and again) waits as long as the load lasts, beyond the bound; this
    is the one timing-based property, so ``analyse`` also checks the ordering argument itself exactly
    (property e), which no timing noise can blur.
    """

    workers: int
    max_hold: float
    poll_interval: float
    per_op_overhead: float
    slack: float = WAIT_SLACK

    @property
    def seconds(self) -> float:
        return (self.workers - 1) * (self.max_hold + self.poll_interval + self.per_op_overhead) * self.slack

    @classmethod
    def for_run(cls, workers: int, op_latency: float) -> WaitBound:
        """The bound for this module's workload, ``op_latency`` being the mean of one store call in the run."""
        return cls(workers, HOLD[1], POLL[1], OPS_PER_LINK * op_latency)


@dataclass
class Grant:
    """One granted request, rebuilt from the audit. Positions are indices in the audit's commit order."""

    request_id: str
    pool: str
    table: str
    owner: str
    request: LeaseRequest
    requested_at: float
    granted_at: float
    grant_position: int
    ended_at: float | None = None
    end: AuditKind | None = None
    blocked_by: str | None = None   # a live request it could conflict with when it arrived (so it had to wait)
    went_ahead: bool = False        # granted ahead of an earlier request it can conflict with (rule 2a)

    @property
    def wait(self) -> float:
        return self.granted_at - self.requested_at


@dataclass
class Analysis:
    """The properties the audit proves or breaks; ``problems`` is empty when every one holds."""

    grants: list[Grant] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)
    max_holders: dict[str, int] = field(default_factory=dict)
    bound: WaitBound | None = None

    @property
    def waited_for_conflict(self) -> int:
        """Grants that waited because a request they can conflict with was live when they arrived (one that
        went ahead of it by rule 2a in its arrival's transaction did not wait)."""
        return sum(1 for g in self.grants if g.blocked_by is not None
                   and not (g.went_ahead and g.granted_at == g.requested_at))

    @property
    def went_ahead(self) -> int:
        return sum(1 for g in self.grants if g.went_ahead)

    @property
    def went_ahead_at_once(self) -> int:
        """Grants that went ahead on the store's clock tick of their arrival: most in their arrival's transaction
        (they never waited), but one that waited and went ahead within the same millisecond looks the same."""
        return sum(1 for g in self.grants if g.blocked_by is not None and g.went_ahead
                   and g.granted_at == g.requested_at)

    @property
    def max_wait(self) -> float:
        return max((g.wait for g in self.grants), default=0.0)

    def report(self, limit: int = 20) -> str:
        bound = f"{self.bound.seconds:.2f} s" if self.bound is not None else "not checked"
        lines = [f"{len(self.grants)} grants, {self.waited_for_conflict} waited for a conflict, {self.went_ahead} "
                 f"went ahead in the holders' shadow; max wait "
                 f"{self.max_wait:.3f} s (bound {bound}); most holders at once per pool {self.max_holders}; "
                 f"events {dict(sorted(self.kinds.items()))}"]
        lines += self.problems[:limit]
        if len(self.problems) > limit:
            lines.append(f"... and {len(self.problems) - limit} more problems")
        return "\n".join(lines)


class _Judge:
    """``lease_verdict`` memoized on the requests' footprints and table states (a workload repeats a small menu)."""

    def __init__(self) -> None:
        self._keys: dict[int, str] = {}
        self._memo: dict[tuple[str, str, str], Verdict] = {}

    def _key(self, request: LeaseRequest) -> str:
        found = self._keys.get(id(request))
        if found is None:
            found = json.dumps([request.footprint.to_json(), request.table_state.to_json()], sort_keys=True)
            self._keys[id(request)] = found
        return found

    def conflict(self, a: LeaseRequest, b: LeaseRequest) -> Verdict | None:
        """The first model (of either request) under which they can conflict; the arbiter judges the same way."""
        key_a, key_b = sorted((self._key(a), self._key(b)))
        for model in sorted({a.model, b.model}):
            memo_key = (key_a, key_b, model)
            verdict = self._memo.get(memo_key)
            if verdict is None:
                verdict = self._memo[memo_key] = lease_verdict(a.planned, b.planned, model)
            if verdict.conflict:
                return verdict
        return None


def _describe(request: LeaseRequest) -> str:
    return f"{request.owner} [{request.footprint.label}]"


def _in_shadow(granted: LeaseRequest, at: float, holders: Sequence[Grant]) -> bool:
    """Whether a grant at ``at`` may go ahead of a waiter that waits for ``holders`` (the arbiter's rule 2a)."""
    if granted.expected_hold is None or not holders or any(h.request.expected_hold is None for h in holders):
        return False
    return at + granted.expected_hold <= max(h.granted_at + (h.request.expected_hold or 0.0) for h in holders)


def analyse(events: Sequence[AuditEvent], *, bound: WaitBound | None = None) -> Analysis:
    """Re-judge a pool's audit (``history``, oldest first) and list every broken property.

    Checks, per pool and table, in the audit's commit order (``event_id``; within a pool the store's lock
    makes it the order of the transactions, so clock ticks that tie cannot hide an overlap):

    a. no two leases held at the same time can conflict (``lease_verdict`` on the requests rebuilt from their
       REQUEST or latest REPLAN detail before the grant), and no request is granted while an earlier waiter
       it can conflict with still waits (the fairness rule), unless it went ahead in the shadow of the
       holders (``arbiter`` rule 2a, judged here on the audit's own times): it and every lease held then that
       arrived before the waiter and can conflict with it carry an expected hold, there is at least one, and
       its grant plus its expected hold is no later than the last of those leases' grant plus expected hold;
    b. every GRANT ends with a RELEASE or an EXPIRE, and nothing ends or renews a lease that was not held;
    c. a pool never holds more leases than a granted request's ``max_writers``;
    d. with ``bound``, every wait (GRANT.at - REQUEST.at, the store's clock) is within ``bound.seconds``;
    e. no request waits longer than the requests that were live on its table when it arrived: fairness means
       only those can delay it, so it is granted at the latest in the transaction that releases or cancels
       the last of them (same store time), or of the requests that went ahead of it by rule 2a. Not checked
       for a pool with a writer limit (a later request that
       cannot conflict may take the free slot) nor when that last one expired or was abandoned (an expiry
       noticed by ``renew`` grants nobody until the next operation).
    """
    ordered = sorted(events, key=lambda e: e.event_id or 0) if all(e.event_id is not None for e in events) \
        else list(events)
    analysis = Analysis(bound=bound)
    judge = _Judge()
    requests: dict[str, LeaseRequest] = {}
    arrival: dict[str, tuple[int, float]] = {}                 # request id -> (position, time) of its REQUEST
    blocked_by: dict[str, str] = {}
    ahead: dict[str, list[str]] = {}                           # request id -> live on its table at its arrival
    ended: dict[str, tuple[float, AuditKind]] = {}             # request id -> when and how it stopped being live
    live: dict[tuple[str, str], dict[str, None]] = {}          # requested, not yet ended, in arrival order
    held: dict[tuple[str, str], dict[str, Grant]] = {}
    held_in_pool: Counter[str] = Counter()
    grants: dict[str, Grant] = {}
    overtaken_by: dict[str, list[str]] = {}                    # request id -> requests granted ahead of it (2a)
    problems = analysis.problems
    for position, event in enumerate(ordered):
        analysis.kinds[event.kind.value] += 1
        key = (event.pool, event.table)
        rid = event.request_id
        if event.kind in (AuditKind.REQUEST, AuditKind.REPLAN):
            try:
                request = LeaseRequest.from_json(json.loads(event.detail))
            except (ValueError, LeaseRequestError) as exc:
                problems.append(f"{event.kind.value} of {event.owner} ({rid}) has no readable request: {exc}")
                continue
            if rid in grants:
                problems.append(f"{event.owner} re-planned {rid} after its grant")
            requests[rid] = request
            if event.kind is AuditKind.REQUEST:
                arrival[rid] = (position, event.at)
                others = live.setdefault(key, {})
                ahead[rid] = list(others)
                for other_id in others:
                    verdict = judge.conflict(request, requests[other_id])
                    if verdict is not None:
                        blocked_by[rid] = f"{_describe(requests[other_id])}: {verdict.reason}"
                        break
                others[rid] = None
        elif event.kind is AuditKind.GRANT:
            granted = requests.get(rid)
            if granted is None or rid not in arrival:
                problems.append(f"GRANT of {event.owner} ({rid}) without a REQUEST before it")
                continue
            if rid in grants:
                problems.append(f"{event.owner} ({rid}) granted twice")
                continue
            for holder in held.get(key, {}).values():
                verdict = judge.conflict(granted, holder.request)
                if verdict is not None:
                    problems.append(
                        f"(a) conflicting leases held together on {event.pool}/{event.table}: "
                        f"{_describe(holder.request)} held since {holder.granted_at:.3f} and {_describe(granted)} "
                        f"granted at {event.at:.3f} before it ended; lease_verdict: {verdict.reason}")
            mine, went_ahead = arrival[rid][0], False
            for other_id in live.get(key, {}):
                if other_id != rid and other_id not in grants and arrival[other_id][0] < mine:
                    verdict = judge.conflict(granted, requests[other_id])
                    if verdict is not None and _in_shadow(granted, event.at, [
                            h for h in held.get(key, {}).values() if arrival[h.request_id][0] < arrival[other_id][0]
                            and judge.conflict(requests[other_id], h.request)]):
                        overtaken_by.setdefault(other_id, []).append(rid)
                        went_ahead = True
                    elif verdict is not None:
                        problems.append(
                            f"(a) fairness: {_describe(granted)} granted at {event.at:.3f} over the earlier waiter "
                            f"{_describe(requests[other_id])} it can conflict with: {verdict.reason}")
            held_in_pool[event.pool] += 1
            count = held_in_pool[event.pool]
            analysis.max_holders[event.pool] = max(analysis.max_holders.get(event.pool, 0), count)
            if granted.max_writers is not None and count > granted.max_writers:
                problems.append(f"(c) {count} leases held in pool {event.pool!r} at {event.at:.3f} after granting "
                                f"{_describe(granted)}, over its writer limit of {granted.max_writers}")
            grant = Grant(rid, event.pool, event.table, event.owner, granted, arrival[rid][1], event.at, position,
                          blocked_by=blocked_by.get(rid), went_ahead=went_ahead)
            grants[rid] = grant
            held.setdefault(key, {})[rid] = grant
        elif event.kind in (AuditKind.RELEASE, AuditKind.EXPIRE):
            stopped = held.get(key, {}).pop(rid, None)
            if stopped is None:
                problems.append(f"(b) {event.kind.value} of {event.owner} ({rid}) at {event.at:.3f}, which held "
                                "nothing")
                continue
            stopped.ended_at, stopped.end = event.at, event.kind
            held_in_pool[event.pool] -= 1
            live.get(key, {}).pop(rid, None)
            ended[rid] = (event.at, event.kind)
        elif event.kind in (AuditKind.CANCEL, AuditKind.ABANDON):
            if rid in held.get(key, {}):
                problems.append(f"(b) {event.kind.value} of {event.owner} ({rid}), a held lease: only waiters cancel")
            live.get(key, {}).pop(rid, None)
            ended[rid] = (event.at, event.kind)
        elif event.kind is AuditKind.RENEW and rid not in held.get(key, {}):
            problems.append(f"(b) renewal of {event.owner} ({rid}) at {event.at:.3f}, which held nothing")
    analysis.grants = list(grants.values())
    for grant in analysis.grants:
        if grant.end is None:
            problems.append(f"(b) {_describe(grant.request)} granted at {grant.granted_at:.3f} on "
                            f"{grant.pool}/{grant.table} never released nor expired")
    for grant in analysis.grants:
        if grant.request.max_writers is not None:
            continue
        delaying = [*ahead.get(grant.request_id, ()), *overtaken_by.get(grant.request_id, ())]
        before = [ended[r] for r in delaying if r in ended]
        if len(before) < len(delaying):
            continue  # one ahead of it never ended: reported under (b)
        last_at, last_kind = max(before, default=(grant.requested_at, AuditKind.REQUEST))
        if last_kind in (AuditKind.EXPIRE, AuditKind.ABANDON):
            continue
        if grant.granted_at > max(last_at, grant.requested_at):
            problems.append(f"(e) {_describe(grant.request)} on {grant.table} was granted at {grant.granted_at:.3f}, "
                            f"after the last of the {len(before)} requests ahead of it ended at {last_at:.3f}: "
                            "something that arrived later delayed it, or a release granted nobody")
    if bound is not None:
        late = sorted((g for g in analysis.grants if g.wait > bound.seconds), key=lambda g: -g.wait)
        if late:
            worst = late[0]
            problems.append(f"(d) {len(late)} grants waited longer than the bound of {bound.seconds:.2f} s; worst "
                            f"{_describe(worst.request)} on {worst.table} waited {worst.wait:.3f} s")
    return analysis
