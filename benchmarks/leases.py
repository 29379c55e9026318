"""Lease store: grants per second and acquire latency with 16 competing processes, on PostgreSQL and SQLite.

A conflict pool asks its lease store before every job, so the store must not become the bottleneck of a
busy Airflow deployment. Measured here, for each store (a throwaway PostgreSQL on loopback started with
``tests/pg.py``, and a SQLite file):

* **disjoint**: ``--processes`` spawned processes loop acquire -> release for ``--seconds`` on one pool.
  Process ``i`` asks for an UPDATE of its own partition of table ``t{i % 8}``, so two processes share each
  table but never conflict: every acquire should be granted at once, and the figures measure the store
  (its lock, its round trips, its judge), not conflicts. Acquire latency is the time from the ``acquire()``
  call to its granted answer; grants per second is total grants / wall time of the load.
* **mixed**: the same, but ``--conflict-share`` of the requests are an OPTIMIZE of the whole table, which
  conflicts with the other process on that table. A request not granted at once polls every 10 ms; its
  latency is left out of the acquire figures and its wait (call to grant) is reported apart.
* **disjoint, one pool per process** (PostgreSQL only): the disjoint load with a pool each, so no two
  processes share a pool lock: what remains is the cost of the operations themselves on this machine.

What limits it is measured in one process alone (acquire then release, another lease held on the same
table so every acquire judges one new pair): time in SQL round trips (statements, commits, rollbacks and
pings, timed at the DBAPI), in the judge (``PairJudge.verdict``), in decoding stored requests, and the rest
(Python: SQLAlchemy, the store's logic, JSON); the DBAPI calls of each operation; how long each holds the
pool's lock. Under load, the CPU a grant costs (the workers' and, for PostgreSQL, the server processes'
``/proc`` counters) and how busy that kept the cores: the machine is shared, so this shows how much of it a
run got.

Run: ``python benchmarks/leases.py [--processes 16] [--seconds 15]``; writes its section of
``docs/benchmarks.md`` with the figures exactly as measured.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import random
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # tests/pg.py and the log builder live in the repository's tests folder
    sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402
from _report import write_section  # noqa: E402 (run as a script: benchmarks/ is on sys.path)

from airflow_delta_occ.engine import DeltaLog, Snapshot  # noqa: E402
from airflow_delta_occ.engine.planner import TableState, plan_footprint  # noqa: E402
from airflow_delta_occ.pools.leases import sql  # noqa: E402
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore  # noqa: E402
from airflow_delta_occ.pools.requests import LeaseRequest, LeaseStatus  # noqa: E402

TABLES = 8
DATES = ("2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04")
COUNTRIES = ("DE", "FR", "IT", "ES")
POLL_SECONDS = 0.010
BEFORE = "no one-step calls (before)"   # the baseline rows: ``sql.AT_ONCE`` off, as the release before decided
P99_GOAL_MS = 20.0
GRANTS_GOAL = 500.0
PROFILE_OPS = 300


# -- the table and the requests ---------------------------------------------------------------------------------

def build_table(root: Path) -> str:
    """One hand-written Delta log partitioned by (date, country), one file per partition: planning needs no data."""
    from tests.unit.engine.logbuilder import LogBuilder, add, commit_info, metadata, protocol

    builder = LogBuilder(root / "bench")
    builder.commit(commit_info("CREATE TABLE"), protocol(), metadata())
    builder.commit(commit_info(), *(add(f"{d}-{c}.parquet", {"date": d, "country": c})
                                    for d in DATES for c in COUNTRIES))
    return builder.root


def partition_of(index: int) -> tuple[str, str]:
    """Process ``index``'s own partition: distinct for every process (processes share tables, never partitions)."""
    slot = index // TABLES
    return DATES[slot // len(COUNTRIES) % len(DATES)], COUNTRIES[slot % len(COUNTRIES)]


def update_request(snapshot: Snapshot, index: int, pool: str, owner: str) -> LeaseRequest:
    date, country = partition_of(index)
    footprint = plan_footprint(snapshot, "UPDATE", f"date = '{date}' AND country = '{country}'",
                               label=f"UPDATE {date}/{country}")
    return LeaseRequest.of(pool=pool, table=f"t{index % TABLES}", owner=owner, footprint=footprint,
                           table_state=TableState.of(snapshot), ttl=60.0)


# -- the load ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadSpec:
    """What one worker process runs (plain values: the only thing that crosses the process boundary)."""

    url: str
    table: str
    index: int
    seconds: float
    conflict_share: float
    pool_per_process: bool
    interval: float | None = None   # paced: seconds from one pair's start to the next (None: as fast as it can)
    queued: bool = True   # tables' queues on (off: how a release before decided, ``sql.QUEUED``)
    at_once: bool = True   # one-step acquire and release on (off: how the release before decided, ``sql.AT_ONCE``)


def load_worker(spec: LoadSpec, barrier: Any, done: Any, out: Any) -> None:
    """Process entry point: acquire -> release until the time is up; puts its figures (or ``"error"``) on ``out``.

    Its store (and so its server process, on PostgreSQL) stays open until every worker has reported and the
    parent has read the server's CPU counters (``done``): a server process that has exited takes its CPU
    time with it, and the figures would leave out the server's share.
    """
    try:
        _load(spec, barrier, done, out)
    except BaseException:
        import traceback

        barrier.abort()
        done.abort()
        out.put({"error": traceback.format_exc()})


def _load(spec: LoadSpec, barrier: Any, done: Any, out: Any) -> None:
    sql.QUEUED = spec.queued   # this worker process's own module
    sql.AT_ONCE = spec.at_once
    store = SqlLeaseStore(spec.url)
    snapshot = DeltaLog.for_table(spec.table).snapshot()
    pool = f"bench-{spec.index}" if spec.pool_per_process else "bench"
    mine = update_request(snapshot, spec.index, pool, "template")
    optimize = replace(mine, footprint=plan_footprint(snapshot, "OPTIMIZE", None, label="OPTIMIZE"))
    rng = random.Random(spec.index)
    immediate: list[float] = []
    waits: list[float] = []
    barrier.wait(timeout=300)
    started, cpu = time.monotonic(), time.process_time()
    deadline = started + spec.seconds
    due = started + random.Random(-spec.index).random() * (spec.interval or 0.0)   # paced starts spread out
    n = 0
    while time.monotonic() < deadline:
        if spec.interval is not None:
            time.sleep(max(0.0, due - time.monotonic()))   # behind schedule: no sleep, it catches up
            due += spec.interval
        template = optimize if rng.random() < spec.conflict_share else mine
        owner = f"b{spec.index}-{n}"
        n += 1
        request = replace(template, owner=owner)
        t0 = time.perf_counter()
        state = store.acquire(request)
        t1 = time.perf_counter()
        if state.granted:
            immediate.append(t1 - t0)
        else:
            while not state.granted:
                if state.status is LeaseStatus.GONE:
                    raise RuntimeError(f"request {state.request_id} vanished while waiting")
                time.sleep(POLL_SECONDS)
                state = store.poll(state.request_id, owner)
            waits.append(time.perf_counter() - t0)
        if not store.release(state.request_id, owner):
            raise RuntimeError(f"lease {state.request_id} was gone before its release")
    finished, cpu = time.monotonic(), time.process_time() - cpu
    out.put({"immediate": immediate, "waits": waits, "started": started, "finished": finished, "cpu": cpu,
             "writes": dict(store.writes)})
    done.wait(timeout=300)
    store.close()


@dataclass
class LoadResult:
    store: str
    workload: str
    processes: int
    offered: float | None               # paced: the grants/s all processes together were asked for
    immediate: list[float]
    waits: list[float]
    wall: float
    client_cpu: float                  # CPU seconds of every worker during its load
    server_cpu: float | None           # CPU seconds of the PostgreSQL cluster during the load
    writes: Counter[str] = field(default_factory=Counter)   # PostgreSQL: optimistic writes landed, missed; locked

    @property
    def missed_share(self) -> str:
        """Operations decided in one step (and one-step calls declined), optimistic writes that missed (the pool
        moved between read and write), reads made in a table's queue, operations that fell back to the pool's
        lock, and optimistic writes that landed on a pool that had moved on other tables only, as shares of the
        operations."""
        ops = self.writes["at_once"] + self.writes["landed"] + self.writes["locked"]
        if not ops:
            return "-"
        return (f"{self.writes['at_once'] / ops:.0%} ({self.writes['at_once_declined'] / ops:.0%}) / "
                + " / ".join(f"{self.writes[kind] / ops:.0%}"
                             for kind in ("missed", "queued", "locked", "landed_moved")))

    @property
    def cpu_per_grant_ms(self) -> float:
        return (self.client_cpu + (self.server_cpu or 0.0)) / self.grants * 1000

    @property
    def cpu_split(self) -> str:
        """`` (clients a + server b)`` in ms per grant, when the server's share was measured (PostgreSQL)."""
        if self.server_cpu is None:
            return ""
        return (f" ({self.client_cpu / self.grants * 1000:.1f} clients + "
                f"{self.server_cpu / self.grants * 1000:.1f} server)")

    @property
    def cpu_busy(self) -> float:
        """Share of the machine's cores the clients (and the server) kept busy during the load."""
        return (self.client_cpu + (self.server_cpu or 0.0)) / (self.wall * (os.cpu_count() or 1))

    @property
    def grants(self) -> int:
        return len(self.immediate) + len(self.waits)

    @property
    def per_second(self) -> float:
        return self.grants / self.wall


def run_load(url: str, table: str, *, processes: int, seconds: float, conflict_share: float,
             pool_per_process: bool, store: str, workload: str, data_dir: Path | None,
             offered: float | None = None, queued: bool = True, at_once: bool = True) -> LoadResult:
    """Spawn the workers (each opens its own store: SQLAlchemy engines must not cross fork), start them together."""
    ctx = multiprocessing.get_context("spawn")
    barrier, done = ctx.Barrier(processes + 1), ctx.Barrier(processes + 1)
    out = ctx.Queue()
    workers = [ctx.Process(target=load_worker, args=(LoadSpec(url, table, i, seconds, conflict_share,
                                                              pool_per_process,
                                                              None if offered is None else processes / offered,
                                                              queued, at_once),
                                                     barrier, done, out))
               for i in range(processes)]
    SqlLeaseStore(url).close()  # the schema exists before the workers race to create it
    for worker in workers:
        worker.start()
    results: list[dict[str, Any]] = []
    try:
        try:
            barrier.wait(timeout=300)
        except threading.BrokenBarrierError:
            pass  # a worker failed before the start: its error is on the queue
        server_before = server_cpu(data_dir)
        for _ in workers:
            results.append(out.get(timeout=seconds + 300))
            if "error" in results[-1]:
                raise RuntimeError(f"a worker failed:\n{results[-1]['error']}")
        server_after = server_cpu(data_dir)   # before the workers close their connections (``load_worker``)
        done.wait(timeout=300)
    except BaseException:
        done.abort()   # a failed run: no worker waits for the parent's reading any longer
        raise
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
    wall = max(r["finished"] for r in results) - min(r["started"] for r in results)
    return LoadResult(store, workload, processes, offered, [x for r in results for x in r["immediate"]],
                      [x for r in results for x in r["waits"]], wall, sum(r["cpu"] for r in results),
                      None if server_before is None or server_after is None else server_after - server_before,
                      sum((Counter(r["writes"]) for r in results), Counter()))


# -- one process alone: where the time goes ---------------------------------------------------------------------

@dataclass
class Meter:
    """Time per bucket and the round trips of the current operation, filled by ``instrument``'s hooks."""

    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    counts: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    trips: list[tuple[str, float, float]] = field(default_factory=list)   # (what, started, ended), perf_counter

    def record(self, what: str, started: float) -> None:
        ended = time.perf_counter()
        self.seconds["sql"] += ended - started
        self.counts["sql"] += 1
        self.trips.append((what, started, ended))


def statement_label(statement: str) -> str:
    """``conditional write``, ``SELECT pools FOR UPDATE``, ``INSERT audit``...: the verb and the store's table a
    statement touches."""
    if statement.lstrip().startswith("WITH bump") or "delta_occ_lease_write_" in statement.split("(", 1)[0]:
        return "conditional write"
    for kind in ("acquire", "release"):
        if f"delta_occ_lease_{kind}_" in statement.split("(", 1)[0]:
            return f"one-step {kind}"
    words = statement.split()
    tables = re.findall(r"delta_occ_(?:lease_)?(\w+)", statement)
    label = f"{words[0]} {tables[0] if tables else ' '.join(words[1:2])}".strip()
    return label + (" FOR UPDATE" if "FOR UPDATE" in statement.upper() else "")


def _timed(meter: Meter, bucket: str, call: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            meter.seconds[bucket] += time.perf_counter() - started
            meter.counts[bucket] += 1
    return wrapper


def _round_trip(meter: Meter, what: str, call: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            meter.record(what, started)
    return wrapper


def instrument(store: SqlLeaseStore) -> Meter:
    """Hook the store's engine and judge: every DBAPI call that may reach the database, every verdict, every decode."""
    meter = Meter()

    def before(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        conn.info["delta_occ_bench_started"] = time.perf_counter()

    def after(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        meter.record(statement_label(statement), conn.info.pop("delta_occ_bench_started"))

    sa.event.listen(store.engine, "before_cursor_execute", before)
    sa.event.listen(store.engine, "after_cursor_execute", after)
    dialect = store.engine.dialect
    for name in ("do_commit", "do_rollback", "do_ping"):  # calls to the DBAPI that are not cursor executions
        setattr(dialect, name, _round_trip(meter, name.removeprefix("do_").upper(), getattr(dialect, name)))
    store.judge.verdict = _timed(meter, "judge", store.judge.verdict)  # type: ignore[method-assign]
    store.request_of = _timed(meter, "decode", store.request_of)  # type: ignore[method-assign]
    return meter


def lock_held(trips: list[tuple[str, float, float]]) -> float:
    """Seconds the pool's lock was held: from the statement that takes it returning (SQLite's ``BEGIN
    IMMEDIATE``, PostgreSQL's ``... FOR UPDATE`` on the locked path) to the one that commits returning (``COMMIT``,
    or PostgreSQL's write that ends with it); on PostgreSQL's optimistic path, its write statement's round trip
    (the row lock lives inside that statement, so this bounds it)."""
    taken = next((end for what, _, end in trips if what == "BEGIN IMMEDIATE" or what.endswith("FOR UPDATE")), None)
    if taken is None:
        return sum(end - start for what, start, end in trips
                   if what in ("conditional write", "one-step acquire", "one-step release"))
    released = next((end for what, _, end in trips if what in ("COMMIT", "conditional write") and end > taken), None)
    return 0.0 if released is None else released - taken


def server_cpu(data_dir: Path | None) -> float | None:
    """CPU seconds used so far by a PostgreSQL cluster's processes (postmaster and its children), or ``None``."""
    if data_dir is None:
        return None
    try:
        postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(entry) == postmaster or int(fields[1]) == postmaster:
                total += (int(fields[11]) + int(fields[12])) / tick
        return total
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Profile:
    store: str
    ops: int
    plain: dict[str, dict[str, float]]             # "acquire"/"release" -> total, client_cpu (ms), no hooks
    hooked: dict[str, dict[str, float]]            # "acquire"/"release" -> bucket -> ms (round_trips: count)
    trips: dict[str, list[str]]                    # one operation's DBAPI calls, in order, with mean ms each


def _pairs(store: SqlLeaseStore, snapshot: Snapshot, ops: int, tag: str, each: Callable[[str, float, float], None],
           before: Callable[[], None] = lambda: None) -> None:
    """``ops`` acquire -> release pairs after 20 that warm the pool and caches.

    ``before()`` runs before every call, ``each(op, wall seconds, CPU seconds)`` after every measured one.
    """
    for i in range(ops + 20):
        request = update_request(snapshot, 0, "profile", f"{tag}{i}")
        for op in ("acquire", "release"):
            before()
            cpu, wall = time.process_time(), time.perf_counter()
            if op == "acquire":
                state = store.acquire(request)
                assert state.granted, state
            else:
                assert store.release(state.request_id, request.owner)
            if i >= 20:
                each(op, time.perf_counter() - wall, time.process_time() - cpu)


def profile(url: str, table: str, store_name: str, ops: int) -> Profile:
    """Acquire then release ``ops`` times in this process alone, with a resident lease on the same table.

    Once without hooks (totals and client CPU), then with them (the breakdown; hooks add their own
    overhead, which lands in the Python column).
    """
    snapshot = DeltaLog.for_table(table).snapshot()
    plain: dict[str, defaultdict[str, float]] = {"acquire": defaultdict(float), "release": defaultdict(float)}
    hooked: dict[str, defaultdict[str, float]] = {"acquire": defaultdict(float), "release": defaultdict(float)}
    trips: dict[str, list[list[tuple[str, float, float]]]] = {"acquire": [], "release": []}
    store = SqlLeaseStore(url)
    try:
        resident = store.acquire(update_request(snapshot, TABLES, "profile", "resident"))  # table t0, as index 0
        assert resident.granted

        def count_plain(op: str, wall: float, cpu: float) -> None:
            plain[op]["total"] += wall
            plain[op]["client_cpu"] += cpu

        _pairs(store, snapshot, ops, "plain", count_plain)

        meter = instrument(store)
        start: dict[str, float] = {}

        def mark() -> None:
            start.clear()
            start.update({f"s:{k}": v for k, v in meter.seconds.items()})
            start.update({f"n:{k}": v for k, v in meter.counts.items()})
            meter.trips.clear()

        def count_hooked(op: str, wall: float, cpu: float) -> None:
            buckets = hooked[op]
            buckets["total"] += wall
            for name in ("sql", "judge", "decode"):
                buckets[name] += meter.seconds[name] - start.get(f"s:{name}", 0.0)
            buckets["round_trips"] += meter.counts["sql"] - start.get("n:sql", 0)
            buckets["verdicts"] += meter.counts["judge"] - start.get("n:judge", 0)
            buckets["lock"] += lock_held(meter.trips)
            trips[op].append(list(meter.trips))

        _pairs(store, snapshot, ops, "hooked", count_hooked, mark)
        store.release(resident.request_id, "resident")
    finally:
        store.close()
    per_op = {op: {k: v / ops * (1 if k in ("round_trips", "verdicts") else 1000) for k, v in c.items()}
              for op, c in hooked.items()}
    for buckets in per_op.values():
        buckets["python"] = buckets["total"] - buckets["sql"] - buckets["judge"] - buckets["decode"]
    sequences = {}
    for op, runs in trips.items():
        shapes = Counter(tuple(what for what, _, _ in run) for run in runs)
        shape = shapes.most_common(1)[0][0]
        same = [run for run in runs if tuple(what for what, _, _ in run) == shape]
        sequences[op] = [f"{what} {statistics.mean((r[k][2] - r[k][1]) for r in same) * 1000:.2f}"
                         for k, what in enumerate(shape)]
    return Profile(store_name, ops, {op: {k: v / ops * 1000 for k, v in c.items()} for op, c in plain.items()},
                   per_op, sequences)


# -- the report -------------------------------------------------------------------------------------------------

def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def load_row(r: LoadResult) -> str:
    ms = [x * 1000 for x in r.immediate]
    waits = [x * 1000 for x in r.waits]
    wait_p50 = f"{quantile(waits, 0.5):.1f}" if waits else "-"
    return (f"| {r.store} | {r.workload} | {r.grants:,} | {r.per_second:,.0f} | {len(r.immediate):,} | "
            f"{quantile(ms, 0.5):.1f} | {quantile(ms, 0.99):.1f} | {max(ms, default=float('nan')):.1f} | "
            f"{len(r.waits):,} | {wait_p50} | {r.cpu_per_grant_ms:.1f}{r.cpu_split} | {r.cpu_busy:.0%} | "
            f"{r.missed_share} |")


def profile_rows(p: Profile) -> list[str]:
    rows = []
    for op in ("acquire", "release"):
        plain, b = p.plain[op], p.hooked[op]
        rows.append(f"| {p.store} | {op} | {plain['total']:.2f} | {plain['client_cpu']:.2f} | "
                    f"{b['round_trips']:.0f} | {b['sql']:.2f} | {b['judge']:.2f} ({b['verdicts']:.0f}) | "
                    f"{b['decode']:.2f} | {b['python']:.2f} | {b['lock']:.2f} |")
    return rows


def limits(p: Profile, loads: list[LoadResult]) -> str:
    """What caps one pool (its lock, from the profile) and the machine (CPU, from the loads)."""
    lock = p.hooked["acquire"]["lock"] + p.hooked["release"]["lock"]
    scope = ("the database's one write lock, shared by every pool" if p.store == "SQLite" else
             "its pool's row lock (inside its one write statement)")
    mine = [r for r in loads if r.store == p.store]
    busiest = max(mine, key=lambda r: r.per_second, default=None)
    cpu = "" if busiest is None else (
        f" Under load ({busiest.workload}) a grant cost {busiest.cpu_per_grant_ms:.1f} ms of CPU "
        f"({'clients and server' if busiest.server_cpu is not None else 'the clients, database included'}) with "
        f"the cores {busiest.cpu_busy:.0%} busy; {GRANTS_GOAL:g} grants/s on {os.cpu_count()} cores needs at most "
        f"{(os.cpu_count() or 1) * 1000 / GRANTS_GOAL:.1f} ms.")
    return (f"- {p.store}: an acquire makes these DBAPI calls (mean ms each): {', '.join(p.trips['acquire'])}; "
            f"a release: {', '.join(p.trips['release'])}. Every transaction queues for {scope}, held "
            f"{lock:.2f} ms per acquire + release even alone, so one pool tops out near {1000 / lock:,.0f} "
            f"grants/s before any contention; {GRANTS_GOAL:g} grants/s needs at most {1000 / GRANTS_GOAL:.1f} ms."
            + cpu)


def verdict(met: bool) -> str:
    return "**MET**" if met else "**NOT MET**"


@contextmanager
def stores(workdir: Path, backends: list[str]) -> Iterator[list[tuple[str, str, Path | None, str]]]:
    """(name, url, PostgreSQL data dir, version) per backend; the PostgreSQL server is stopped on exit."""
    from tests.pg import PostgresServer

    found: list[tuple[str, str, Path | None, str]] = []
    server = None
    try:
        if "postgresql" in backends:
            server = PostgresServer().start()
            engine = sa.create_engine(server.url)
            with engine.connect() as conn:
                version = str(conn.execute(sa.text("SHOW server_version")).scalar())
            engine.dispose()
            found.append(("PostgreSQL", server.url, server.data_dir, f"PostgreSQL {version}"))
        if "sqlite" in backends:
            found.append(("SQLite", f"sqlite:///{workdir / 'leases.db'}", None, f"SQLite {sqlite3.sqlite_version}"))
        yield found
    finally:
        if server is not None:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--conflict-share", type=float, default=0.2)
    parser.add_argument("--profile-ops", type=int, default=PROFILE_OPS)
    parser.add_argument("--backends", default="postgresql,sqlite")
    parser.add_argument("--offered", type=float, nargs="*", default=[250.0],
                        help="PostgreSQL: also run the disjoint loads paced at these grants/s (all processes)")
    parser.add_argument("--no-write", action="store_true", help="print the report without writing docs/benchmarks.md")
    args = parser.parse_args()
    args.load_average = os.getloadavg()[0]
    if args.processes > TABLES * len(DATES) * len(COUNTRIES):
        parser.error("more processes than distinct (table, partition) slots")
    workdir = Path(tempfile.mkdtemp(prefix="delta_occ_lease_bench_"))
    loads: list[LoadResult] = []
    profiles: list[Profile] = []
    try:
        table = build_table(workdir)
        with stores(workdir, args.backends.split(",")) as backends:
            versions = [v for _, _, _, v in backends]
            for name, url, data_dir, _ in backends:
                profiles.append(profile(url, table, name, args.profile_ops))
                mixed = f"mixed ({args.conflict_share:.0%} OPTIMIZE)"
                scenarios: list[tuple[str, float, bool, float | None, bool]] = [
                    ("disjoint", 0.0, False, None, True), (mixed, args.conflict_share, False, None, True)]
                if name == "PostgreSQL":
                    scenarios += [(f"disjoint, {BEFORE}", 0.0, False, None, False),
                                  (f"{mixed}, {BEFORE}", args.conflict_share, False, None, False),
                                  ("disjoint, one pool per process", 0.0, True, None, True)]
                    for offered in args.offered:
                        scenarios += [(f"disjoint, paced at {offered:g} grants/s", 0.0, False, offered, True),
                                      (f"disjoint, {BEFORE}, paced at {offered:g} grants/s", 0.0,
                                       False, offered, False),
                                      (f"disjoint, one pool per process, paced at {offered:g} grants/s", 0.0, True,
                                       offered, True)]
                for workload, share, per_process, offered, at_once in scenarios:
                    print(f"{name}: {workload} ...", file=sys.stderr)
                    loads.append(run_load(url, table, processes=args.processes, seconds=args.seconds,
                                          conflict_share=share, pool_per_process=per_process, store=name,
                                          workload=workload, data_dir=data_dir, offered=offered, at_once=at_once))
                    print(load_row(loads[-1]), file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = render(args, loads, profiles, versions)
    print(report)
    if not args.no_write:
        write_section("leases", "Lease store: grants per second and acquire latency", report)


def render(args: argparse.Namespace, loads: list[LoadResult], profiles: list[Profile], versions: list[str]) -> str:
    import psycopg2

    lines = [
        f"Load: {args.processes} processes (spawned, one `SqlLeaseStore` each) loop acquire -> release for "
        f"{args.seconds:g} s on one pool; process i updates its own partition of table `t{{i % {TABLES}}}` (two "
        f"processes per table, never the same partition). *mixed*: {args.conflict_share:.0%} of requests are an "
        "OPTIMIZE of the whole table instead, which conflicts with the other process on the table; a request not "
        f"granted at once polls every {POLL_SECONDS * 1000:.0f} ms. *paced*: each process starts its pairs on a "
        "fixed schedule, so that all of them together ask for the given grants/s (a process behind schedule does "
        "not pause); the other loads loop without a pause, so their latency includes waiting for the CPU the "
        "other processes hold. Acquire latency: `acquire()` call to its "
        "granted answer, requests granted at once only; waits (call to grant) apart. grants/s: grants / wall time. "
        "CPU per grant: the workers' CPU and the PostgreSQL server's (all its processes, read from `/proc` "
        "before the workers close their connections) over the grants.",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, {', '.join(versions)}, "
        f"SQLAlchemy {sa.__version__}, psycopg2 {psycopg2.__version__.split()[0]}. PostgreSQL on loopback with "
        f"fsync off (tests/pg.py); SQLite in WAL mode, synchronous=NORMAL. Load average when the run started: "
        f"{args.load_average:.2f} (the machine is shared: other work there takes cores from this run).",
        "",
        "| store | workload | grants | grants/s | granted at once | p50 acquire (ms) | p99 acquire (ms) | "
        "max acquire (ms) | waited | p50 wait (ms) | CPU per grant (ms) | CPU busy | one step (declined) / missed / "
        "queued / locked / landed past others |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(load_row(r) for r in loads),
    ]
    lines.append("")
    for goal in (r for r in loads if r.store == "PostgreSQL" and r.workload.startswith("disjoint")
                 and "(before)" not in r.workload):
        p99 = quantile([x * 1000 for x in goal.immediate], 0.99)
        line = (f"- Goal \"p99 acquire under {P99_GOAL_MS:g} ms\" (PostgreSQL, {goal.workload}): {p99:.1f} ms: "
                f"{verdict(p99 < P99_GOAL_MS)}")
        if goal.offered is None:
            line += (f"; goal \"at least {GRANTS_GOAL:g} grants/s\": {goal.per_second:,.0f}/s: "
                     f"{verdict(goal.per_second >= GRANTS_GOAL)}.")
        else:
            line += f" ({goal.per_second:,.0f} grants/s achieved of {goal.offered:g} offered)."
        lines.append(line)
    lines.append("*one step (declined) / missed / queued / locked / landed past others* (PostgreSQL), per operation: "
                 "operations decided by one call of the store's acquire or release function (`pg_at_once`), and "
                 "such calls that declined (the operation then went the usual way); optimistic writes that found "
                 "their tables changed since the read they decided on; reads made in a table's queue; operations "
                 "that took the pool's row lock (three misses in the queue); optimistic writes that landed "
                 f"although the pool had moved, on other tables only. *{BEFORE}*: the same load with `sql.AT_ONCE` "
                 "off in the workers, as the release before decided, in the same run.")
    lines += [
        "",
        f"Where the time goes: one process alone, {args.profile_ops} acquire -> release pairs on one pool with another "
        "lease held on the same table (other partition), so every acquire judges one new pair. Total and client "
        "CPU: without hooks. The rest with hooks on the DBAPI: in SQL, every call that may reach the database "
        "(statements, commits, rollbacks, pool pings); judge: `PairJudge.verdict`; decode: stored requests parsed "
        "from JSON; Python: what remains of the hooked total (SQLAlchemy, the store's logic, JSON encoding, the "
        "hooks); pool lock held: SQLite, from `BEGIN IMMEDIATE` returning to the commit returning; PostgreSQL, "
        "the conditional write's round trip (the row lock lives inside that one statement, so this bounds it). "
        "Mean ms per operation.",
        "",
        "| store | operation | total (ms) | client CPU (ms) | DBAPI calls | in SQL (ms) | judge (ms, verdicts) | "
        "decode (ms) | Python (ms) | pool lock held (ms) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in profiles:
        lines += profile_rows(p)
    lines.append("")
    lines += [limits(p, loads) for p in profiles]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
