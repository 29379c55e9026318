"""The grant rule at scale: how a decision's cost grows with the waiting requests, up to 1,000.

Issue #23 measured the rule as quadratic: every waiter was compared with every earlier one and every
blocker was collected, so a store opened in a fresh process (every new task) paid n^2/2 comparisons
inside the pool's lock. Measured here, in one process, for two workloads:

* **disjoint**: a table with one partition per date; a whole-table OPTIMIZE holds its lease and N
  UPDATEs of N different dates wait for it (a backfill behind a compaction). When it is released, all N
  are granted.
* **chain**: an unpartitioned table; one UPDATE of the whole table holds, N more wait (every pair
  conflicts). When it is released, the first waiter is granted and the other N-1 wait for it.
* **shared** (answers only): a table of three dates; a whole-table OPTIMIZE holds and N UPDATEs wait,
  each of one of the three dates (a third of them share each partition, and each waits for the one before
  it on its date).

For each N: the time of one decision (``arbiter.decide`` on every live request) with nothing judged yet
(**cold**: a task process that just opened the store), with the pairs already judged (**warm**: the
triggerer, a long-lived worker), and cold but with the blockers the stored requests remember (what a
store gives a fresh process now); then the decision after the holder's release, cold. The **baseline**
is the rule as it was before (``airflow_delta_occ/pools/arbiter.py`` at ``BASELINE_COMMIT``, loaded from
git), timed in the same run on the same requests where it finishes within ``--baseline-budget`` seconds.

Then the answers a batched poll gives (a triggerer's): every waiter explained (``arbiter.Explainer``: the
held leases it waits for and the first earlier request it conflicts with) from one read, the pairs already
judged, against the explainer at ``EXPLAIN_BASELINE_COMMIT`` (which compared a request with every earlier one
sharing its partitions before it took the first).

Then the stores: acquire of one more request by a store opened anew (memory: a fresh judge; SQLite and
PostgreSQL: a new ``SqlLeaseStore``) with N waiting, and the release that grants them.

Run: ``python benchmarks/arbiter_scale.py [--sizes 100,250,500,1000]``; writes its section of
``docs/benchmarks.md`` with the figures exactly as measured.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _report import write_section  # noqa: E402
from leases import stores  # noqa: E402

from airflow_delta_occ.engine import DeltaLog, Snapshot  # noqa: E402
from airflow_delta_occ.engine.planner import TableState, plan_footprint  # noqa: E402
from airflow_delta_occ.pools import arbiter  # noqa: E402
from airflow_delta_occ.pools.arbiter import Candidate, decide  # noqa: E402
from airflow_delta_occ.pools.compare import PairJudge, PlannedJob, reach  # noqa: E402
from airflow_delta_occ.pools.leases.base import LeaseStore  # noqa: E402
from airflow_delta_occ.pools.leases.memory import MemoryLeaseStore  # noqa: E402
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore  # noqa: E402
from airflow_delta_occ.pools.requests import LeaseRequest  # noqa: E402

BASELINE_COMMIT = "ec3bed2"
EXPLAIN_BASELINE_COMMIT = "a15a236"   # before the index merged its lists lazily


def baseline_rule(commit: str = BASELINE_COMMIT) -> ModuleType | None:
    """The arbiter module as it was at ``commit``, imported beside today's (``None`` without git)."""
    try:
        source = subprocess.run(["git", "show", f"{commit}:airflow_delta_occ/pools/arbiter.py"], cwd=ROOT,
                                check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(tempfile.mkdtemp(prefix="delta_occ_baseline_")) / f"arbiter_{commit}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"airflow_delta_occ.pools._arbiter_{commit}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def build(root: Path, dates: int) -> Snapshot:
    from tests.unit.engine.logbuilder import LogBuilder, add, commit_info, metadata, protocol

    builder = LogBuilder(root)
    if dates:
        builder.commit(commit_info("CREATE TABLE"), protocol(), metadata(("date",)))
        builder.commit(commit_info(), *(add(f"{d}.parquet", {"date": d}) for d in day_list(dates)))
    else:
        builder.commit(commit_info("CREATE TABLE"), protocol(), metadata(()))
        builder.commit(commit_info(), add("part-0.parquet"))
    return DeltaLog.for_table(builder.root).snapshot()


def day_list(n: int) -> list[str]:
    return [str(datetime.date(2020, 1, 1) + datetime.timedelta(days=i)) for i in range(n)]


@dataclass(frozen=True)
class Workload:
    name: str
    holder: LeaseRequest
    waiters: list[LeaseRequest]


def workload(kind: str, n: int, workdir: Path) -> Workload:
    snapshot = build(workdir / f"{kind}-{n}", {"disjoint": n, "shared": 3}.get(kind, 0))
    state = TableState.of(snapshot)

    def request(owner: str, op: str, predicate: str | None) -> LeaseRequest:
        return LeaseRequest.of(pool="bench", table="t", owner=owner, footprint=plan_footprint(
            snapshot, op, predicate, label=owner), table_state=state, ttl=3600.0)

    if kind == "disjoint":
        return Workload(kind, request("optimize", "OPTIMIZE", None),
                        [request(f"update {d}", "UPDATE", f"date = '{d}'") for d in day_list(n)])
    if kind == "shared":
        days = day_list(3)
        return Workload(kind, request("optimize", "OPTIMIZE", None),
                        [request(f"update {i}", "UPDATE", f"date = '{days[i % 3]}'") for i in range(n)])
    return Workload(kind, request("holder", "UPDATE", "id > 0"),
                    [request(f"update {i}", "UPDATE", f"id > {i}") for i in range(n)])


def candidates(w: Workload) -> tuple[Candidate, list[Candidate]]:
    def of(r: LeaseRequest, seq: int, granted: bool) -> Candidate:
        job = PlannedJob(r.footprint, r.table_state)
        spanned = reach(job, r.model)
        return Candidate(request_id=r.owner, key=(r.owner, 0), table=r.table, owner=r.owner, load=lambda: job,
                         model=r.model, max_writers=None, granted_at=0.0 if granted else None, seq=seq,
                         span=lambda: spanned)
    return of(w.holder, 0, True), [of(r, i + 1, False) for i, r in enumerate(w.waiters)]


def timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def rule_rows(sizes: list[int], workdir: Path, budget: float) -> list[str]:
    old = baseline_rule()
    rows = []
    for kind in ("disjoint", "chain"):
        old_alive = old is not None
        for n in sizes:
            holder, waiters = candidates(workload(kind, n, workdir))
            judge = PairJudge()
            cold = timed(lambda: decide([holder], waiters, judge))           # noqa: B023
            warm = timed(lambda: decide([holder], waiters, judge))           # noqa: B023
            first = decide([holder], waiters, PairJudge())
            kept = [replace(c, remembered=first.remember[c.request_id]) for c in waiters]
            remembered = timed(lambda: decide([holder], kept, PairJudge()))  # noqa: B023
            released = timed(lambda: decide([], kept, PairJudge()))          # noqa: B023
            base_cold = base_warm = None
            if old_alive and old is not None:
                base_judge = PairJudge()
                base_cold = timed(lambda: old.decide([holder], waiters, base_judge))   # noqa: B023
                base_warm = timed(lambda: old.decide([holder], waiters, base_judge))   # noqa: B023
                old_alive = base_cold < budget / 4   # the next size would take about 4x as long
            rows.append(f"| {kind} | {n} | {cold * 1000:.1f} | {warm * 1000:.1f} | {remembered * 1000:.1f} | "
                        f"{released * 1000:.1f} | {_ms(base_cold)} | {_ms(base_warm)} | "
                        f"{_ratio(base_cold, cold)} | {_ratio(base_warm, warm)} |")
            print(rows[-1], file=sys.stderr)
    return rows


def answer_all(rule: ModuleType, holder: Candidate, waiters: list[Candidate], judge: PairJudge) -> list[Any]:
    """What a batched poll of every waiter answers: one explainer (one index) for all of them."""
    explainer = rule.Explainer([holder], waiters, judge)
    return [explainer.explain(c) for c in waiters]


def explain_rows(sizes: list[int], workdir: Path) -> list[str]:
    """Every waiter explained from one read (a batched poll's answers), today and at ``EXPLAIN_BASELINE_COMMIT``."""
    old = baseline_rule(EXPLAIN_BASELINE_COMMIT)
    rows = []
    for kind in ("disjoint", "chain", "shared"):
        for n in sizes:
            holder, waiters = candidates(workload(kind, n, workdir))
            judge = PairJudge()
            answer_all(arbiter, holder, waiters, judge)   # every pair the answers need, judged (a triggerer's)
            now = timed(lambda: answer_all(arbiter, holder, waiters, judge))   # noqa: B023
            before = None
            if old is not None:
                old_judge = PairJudge()
                answer_all(old, holder, waiters, old_judge)
                before = timed(lambda: answer_all(old, holder, waiters, old_judge))   # noqa: B023
            rows.append(f"| {kind} | {n} | {now * 1000:.1f} | {_ms(before)} | {_ratio(before, now)} |")
            print(rows[-1], file=sys.stderr)
    return rows


def store_rows(sizes: list[int], workdir: Path, backends: list[str]) -> list[str]:
    rows = []
    with stores(workdir, backends) as found:
        for name, url, _, _ in [("memory", "", None, ""), *found]:
            for kind in ("disjoint", "chain"):
                for n in sizes:
                    w = workload(kind, n, workdir)
                    pool = f"{kind}-{n}-{name}"
                    w = Workload(kind, replace(w.holder, pool=pool), [replace(r, pool=pool) for r in w.waiters])
                    store: LeaseStore = MemoryLeaseStore() if name == "memory" else SqlLeaseStore(url)
                    holder = store if name == "memory" else SqlLeaseStore(url)   # the holder's own process
                    held = holder.acquire(w.holder)
                    fill = timed(lambda: [store.acquire(r) for r in w.waiters[:-1]])   # noqa: B023
                    fresh = _reopened(store, url)
                    last = timed(lambda: fresh.acquire(w.waiters[-1]))                 # noqa: B023
                    holder.renew(held.request_id, w.holder.owner)   # its heartbeat, while the others wait
                    holder.judge = PairJudge()                      # it judged none of the waiters' pairs
                    locked = lock_timer(holder)
                    release = timed(lambda: holder.release(held.request_id, w.holder.owner))  # noqa: B023
                    granted = len(fresh.holders(pool=pool))
                    rows.append(f"| {name} | {kind} | {n} | {fill / max(1, n - 1) * 1000:.1f} | {last * 1000:.1f} | "
                                f"{release * 1000:.1f} | {locked[-1] * 1000:.1f} | {granted} |")
                    print(rows[-1], file=sys.stderr)
                    for opened in {id(s): s for s in (store, holder, fresh)}.values():
                        opened.close()
    return rows


def lock_timer(store: LeaseStore) -> list[float]:
    """Seconds each of ``store``'s transactions took, from now on: from the pool's read to its write landing. On
    memory and SQLite the pool's lock is held all that time; on PostgreSQL an optimistic operation holds it only
    inside its write statement, a locked one (after a missed write) from its read to its write."""
    held: list[float] = []
    transact = store._transact

    def timed(pool: str, body: Callable[[Any], Any]) -> Any:
        started = time.perf_counter()
        try:
            return transact(pool, body)
        finally:
            held.append(time.perf_counter() - started)
    store._transact = timed  # type: ignore[method-assign]
    return held


def _reopened(store: LeaseStore, url: str) -> LeaseStore:
    """The store as a new task process sees it: nothing judged, nothing decoded."""
    if isinstance(store, SqlLeaseStore):
        return SqlLeaseStore(url)
    store.judge = PairJudge()
    return store


def _ms(seconds: float | None) -> str:
    return "not run" if seconds is None else f"{seconds * 1000:.1f}"


def _ratio(baseline: float | None, now: float) -> str:
    return "" if baseline is None else f"{baseline / now:.0f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,250,500,1000")
    parser.add_argument("--store-sizes", default="100,1000")
    parser.add_argument("--backends", default="postgresql,sqlite")
    parser.add_argument("--baseline-budget", type=float, default=120.0,
                        help="stop timing the baseline once a size would take longer than this (seconds)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="delta_occ_arbiter_bench_"))
    rules = rule_rows(sizes, workdir, args.baseline_budget)
    answers = explain_rows(sizes, workdir)
    store_sizes = [int(s) for s in args.store_sizes.split(",")]
    stored = store_rows(store_sizes, workdir, args.backends.split(","))
    from _report import machine

    report = "\n".join([
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}; `python benchmarks/arbiter_scale.py "
        f"--sizes {args.sizes} --store-sizes {args.store_sizes}`. Workloads: *disjoint* = a whole-table OPTIMIZE "
        "holds and N UPDATEs of N different dates wait (one partition per date); *chain* = an unpartitioned "
        "table, one UPDATE holds and N more wait (every pair conflicts); *shared* = a table of three dates, a "
        "whole-table OPTIMIZE holds and N UPDATEs wait, a third on each date.",
        "",
        "One decision (`arbiter.decide` on every live request), milliseconds. *cold*: nothing judged yet (a task "
        "process that just opened the store); *warm*: every pair judged before (a long-lived triggerer); "
        "*remembered*: cold, with the blocker each stored request remembers; *released*: the holder gone, cold "
        f"with remembered blockers. Baseline: the rule at `{BASELINE_COMMIT}` (before this change) on the same "
        "requests in the same run, timed while one decision took under a quarter of "
        f"{args.baseline_budget:g} s.",
        "",
        "| workload | N waiting | cold | warm | remembered | released | baseline cold | baseline warm | "
        "cold speed-up | warm speed-up |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rules,
        "",
        "A batched poll's answers: every waiter explained from one read (`arbiter.Explainer`, pairs judged "
        f"before), milliseconds for all N. Baseline: the explainer at `{EXPLAIN_BASELINE_COMMIT}` (before the "
        "index merged its per-partition lists lazily) on the same requests in the same run.",
        "",
        "| workload | N waiting | all answers | baseline | speed-up |",
        "|---|---:|---:|---:|---:|",
        *answers,
        "",
        "Stores: N-1 requests acquired in one store (mean acquire, ms), then one more acquired by a store opened "
        "anew (a new `SqlLeaseStore`, as a new task process has; memory: a fresh judge), then the holder released "
        "by its own store (its process renewed the lease once meanwhile and judged none of the waiters' pairs): "
        "the release's time and its transaction's (read to write: the pool's lock is held all of it on memory and "
        "SQLite, on PostgreSQL at most that long); *granted*: holders after the release.",
        "",
        "| store | workload | N | mean acquire while filling | acquire, fresh store | release | release: transaction | "
        "granted |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        *stored,
    ])
    print(report)
    if not args.no_write:
        write_section("arbiter-scale", "The grant rule at scale (issue #23)", report)


if __name__ == "__main__":
    _ = arbiter  # the module under test, imported for its rule
    main()
