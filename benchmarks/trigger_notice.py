"""The triggerer's notice of a grant: how long a deferred waiter's trigger takes to fire once its lease is
granted, with N requests waiting deferred at once.

In the thousand-MERGE run on Celery (docs/benchmarks.md) a granted MERGE's triggerer saw the grant 4.9 s
after it was made, the largest part of a hand-over, on a machine loaded by Spark, Airflow and tests. This
benchmark measures the provider's own part of that delay apart from Airflow and Spark, with the real
parts the triggerer runs: ``DeltaLeaseTrigger`` (its connection from the environment, as in a
triggerer), the poller its waits share (``triggers.poller``), ``SqlLeaseStore`` on a throwaway
PostgreSQL (``tests/pg.py``).

* N UPDATEs of one unpartitioned table wait behind one held lease (every pair conflicts: the table takes
  one writer at a time, as in the thousand-MERGE backfill).
* Their triggers run in ``--triggerers`` processes, each an ``asyncio`` event loop as a triggerer's
  runner is, with the provider's default deferred poll interval.
* **Quiet**: for ``--quiet`` seconds nothing changes; the CPU of the trigger processes and of the
  PostgreSQL server (all its processes, from ``/proc``) is what N waiters cost while they wait.
* **Hand-overs**: the held lease is released; when a trigger fires, this process releases its lease at
  once (a task that resumed and finished in no time, in a process of its own), which grants the next
  waiter. ``--hops`` hand-overs are timed: *notice* is from the grant (its audit event's time)
  to the moment the trigger yielded its event; *hop* is from one release to the next one.

What is left out, on purpose: the triggerer's own process (its supervisor, the database write of the
event), the scheduler and the executor that resume the task, and Spark. Those are Airflow's and Spark's
parts of a hand-over; the Celery benchmark (``benchmarks/scale.py``) measures the whole of it.

Run: ``python benchmarks/trigger_notice.py [--sizes 100,1000]``; writes its section of
``docs/benchmarks.md`` with the figures exactly as measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _report import machine, percentile, write_section  # noqa: E402
from arbiter_scale import build  # noqa: E402
from leases import server_cpu, stores  # noqa: E402
from scale import cpu_seconds  # noqa: E402

from airflow_delta_occ.engine.planner import TableState, plan_footprint  # noqa: E402
from airflow_delta_occ.pools.holding import DEFERRED_POLL_SECONDS, DEFERRED_WAKE_SECONDS  # noqa: E402
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore  # noqa: E402
from airflow_delta_occ.pools.requests import AuditKind, LeaseRequest, LeaseStatus  # noqa: E402

CONN_ID = "delta_occ_leases"
BASELINE_COMMIT = "a10c71d"   # before the explanations stayed the same pairs while a line moves
TTL = 60.0   # long enough that no waiter is abandoned on a loaded machine; heartbeats every TTL / 3 at most


def requests(n: int, workdir: Path, pool: str) -> tuple[LeaseRequest, list[LeaseRequest]]:
    snapshot = build(workdir / f"table-{pool}", 0)
    state = TableState.of(snapshot)

    def request(owner: str) -> LeaseRequest:
        return LeaseRequest.of(pool=pool, table="t", owner=owner, table_state=state, ttl=TTL,
                               footprint=plan_footprint(snapshot, "UPDATE", "id > 0", label=owner))
    return request("holder"), [request(f"waiter {i}") for i in range(n)]


# -- the trigger processes ----------------------------------------------------------------------------------------

def baseline_tree(commit: str, workdir: Path) -> Path:
    """The package at ``commit``, unpacked from git into ``workdir`` (for the trigger processes' ``PYTHONPATH``)."""
    tree = workdir / f"baseline-{commit}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "airflow_delta_occ"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


class Triggerer:
    """One stand-in triggerer process (``trigger_notice_worker.py``) on the package in ``tree``; its events
    arrive on ``events`` as ``(request_id, fired_at, payload)``."""

    def __init__(self, tree: Path, url: str, waits: list[tuple[str, dict[str, Any], float]], workdir: Path,
                 events: queue.Queue[tuple[str, float, dict[str, Any]]]) -> None:
        spec = workdir / f"waits-{id(self)}.json"
        spec.write_text(json.dumps(waits))
        env = {**os.environ, "PYTHONPATH": str(tree),
               f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps({"conn_type": "delta_occ_leases", "extra": {"url": url}})}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("trigger_notice_worker.py")),
                                      str(spec)], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, cwd=workdir)
        self.started = threading.Event()
        self._events = events
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.startswith("{"):
                continue
            message = json.loads(line)
            if "started" in message:
                self.started.set()
            else:
                self._events.put((message["request_id"], message["fired"], message["payload"]))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


# -- one size ---------------------------------------------------------------------------------------------------------

def measure(url: str, data_dir: Path | None, n: int, args: argparse.Namespace, workdir: Path, tree: Path,
            label: str, round_: int) -> dict[str, Any]:
    pool = f"notice-{label.replace(' ', '-')}-{n}-{round_}"
    holder, waiters = requests(n, workdir, pool)
    store = SqlLeaseStore(url)
    try:
        held = store.acquire(holder)
        assert held.status is LeaseStatus.GRANTED, held
        ids = []
        for w in waiters:
            state = store.acquire(w)
            assert state.status is LeaseStatus.WAITING, state
            ids.append(state.request_id)
        events: queue.Queue[tuple[str, float, dict[str, Any]]] = queue.Queue()
        procs = [Triggerer(tree, url, [(ids[i], waiters[i].to_json(), DEFERRED_POLL_SECONDS)
                                       for i in range(k, n, args.triggerers)], workdir, events)
                 for k in range(args.triggerers)]
        for proc in procs:
            if not proc.started.wait(180):
                raise RuntimeError("a trigger process did not start its waits")
        time.sleep(args.warmup)   # every trigger has read its connection and polled once
        alive = [p.proc for p in procs if p.proc.poll() is None]
        assert len(alive) == args.triggerers, "a trigger process died while its waits started"
        cpu0, server0, t0 = sum(cpu_seconds(p.pid) for p in alive), server_cpu(data_dir), time.monotonic()
        time.sleep(args.quiet)
        elapsed = time.monotonic() - t0
        quiet_cpu = (sum(cpu_seconds(p.pid) for p in alive) - cpu0) / elapsed
        server1 = server_cpu(data_dir)
        quiet_server = None if server0 is None or server1 is None else (server1 - server0) / elapsed
        early = []
        while not events.empty():   # nothing may fire before the holder leaves
            early.append(events.get())
        cpu0, hop_start = sum(cpu_seconds(p.pid) for p in alive), time.monotonic()
        store.release(held.request_id, holder.owner)
        fired: dict[str, float] = {}
        statuses: list[str] = []
        deadline = time.monotonic() + args.hops * 30
        while len(fired) < args.hops and time.monotonic() < deadline:
            try:
                request_id, at, payload = events.get(timeout=max(1.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            statuses.append(payload["status"])
            if payload["status"] != "granted":   # counted (the report's "not granted"); nothing to hand over
                continue
            fired[request_id] = at
            store.release(payload["request_id"], waiters[ids.index(request_id)].owner)
        hops_wall = time.monotonic() - hop_start
        hops_cpu_seconds = sum(cpu_seconds(p.pid) for p in alive) - cpu0
        hops_cpu = hops_cpu_seconds / hops_wall
        for proc in procs:
            proc.stop()
        events = store.history(pool=pool, limit=1_000_000)
    finally:
        store.close()
    granted = {e.request_id: e.at for e in events if e.kind is AuditKind.GRANT}
    released = sorted(e.at for e in events if e.kind is AuditKind.RELEASE)
    notices = [fired[r] - granted[r] for r in fired if r in granted]
    hops = [b - a for a, b in itertools.pairwise(released)]
    return {"label": label, "n": n, "quiet_cpu": quiet_cpu, "quiet_server": quiet_server, "early": early,
            "statuses": statuses, "notices": notices, "hops": hops, "hops_cpu": hops_cpu,
            "cpu_per_hop": hops_cpu_seconds / max(1, len(fired)),
            "expired": sum(1 for e in events if e.kind is AuditKind.EXPIRE),
            "abandoned": sum(1 for e in events if e.kind is AuditKind.ABANDON)}


def row(r: dict[str, Any]) -> str:
    ms = [x * 1000 for x in r["notices"]]
    hops = [x * 1000 for x in r["hops"]]
    server = "-" if r["quiet_server"] is None else f"{r['quiet_server']:.1%}"
    other = [s for s in r["statuses"] if s != "granted"]
    if not ms:
        return (f"| {r['label']} | {r['n']:,} | no hand-over was seen | {len(r['early'])} early, "
                f"{len(other)} not granted |")
    return (f"| {r['label']} | {r['n']:,} | {r['quiet_cpu']:.1%} | {server} | {len(ms)} | {percentile(ms, 0.5):.0f} | "
            f"{percentile(ms, 0.9):.0f} | {max(ms):.0f} | {statistics.median(hops):.0f} | {r['hops_cpu']:.1%} | "
            f"{r['cpu_per_hop'] * 1000:.0f} | {len(r['early'])} / {len(other)} / {r['expired']} / {r['abandoned']} |")


def ratios(results: list[dict[str, Any]], n: int) -> str:
    """Baseline over this release for size ``n``: the trigger processes' CPU per hand-over and the notice p50
    (rounds pooled: CPU averaged, notices put together)."""
    def pooled(label: str) -> tuple[float, float]:
        mine = [r for r in results if r["n"] == n and r["label"] == label]
        return (statistics.mean(r["cpu_per_hop"] for r in mine),
                percentile([x for r in mine for x in r["notices"]], 0.5))
    (cpu_b, notice_b), (cpu_t, notice_t) = pooled("baseline"), pooled("this release")
    return (f"- N = {n:,}: the trigger processes' CPU per hand-over {cpu_b * 1000:.0f} -> {cpu_t * 1000:.0f} ms "
            f"({cpu_b / cpu_t:.2f}x less); notice p50 {notice_b * 1000:.0f} -> {notice_t * 1000:.0f} ms "
            f"({notice_b / notice_t:.2f}x).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000", help="waiting requests per run, comma-separated")
    parser.add_argument("--triggerers", type=int, default=2)
    parser.add_argument("--hops", type=int, default=40)
    parser.add_argument("--quiet", type=float, default=20.0, help="seconds measured with nothing changing")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each tree per size, alternating")
    parser.add_argument("--baseline", default=BASELINE_COMMIT, help="the commit whose triggers are the baseline")
    parser.add_argument("--no-write", action="store_true", help="print the report without writing docs/benchmarks.md")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp, stores(Path(tmp), ["postgresql"]) as found:
        [(_, url, data_dir, version)] = found
        workdir = Path(tmp)
        trees = [("baseline", baseline_tree(args.baseline, workdir)), ("this release", ROOT)]
        results = []
        for n in sizes:
            for k in range(args.rounds):
                for label, tree in trees if k % 2 == 0 else trees[::-1]:
                    results.append(measure(url, data_dir, n, args, workdir, tree, label, k))
                    print(row(results[-1]), flush=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    report = "\n".join([
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}; {version} (tests/pg.py); at {head}, "
        f"`python benchmarks/trigger_notice.py --sizes {args.sizes} --triggerers {args.triggerers} "
        f"--hops {args.hops} --quiet {args.quiet:g} --rounds {args.rounds}`. *Baseline*: the trigger processes run "
        f"the package at `{args.baseline}` (before the explanations a batched poll gives kept their pairs, and "
        f"before decoded rows were reused: the figures are of both changes together), in the same run, "
        f"alternating with this release. "
        f"Each trigger process is one event loop running `DeltaLeaseTrigger` for its share of the waiters, polling "
        f"every {DEFERRED_POLL_SECONDS:g} s and reading the pool's revision every {DEFERRED_WAKE_SECONDS:g} s (the "
        f"provider's defaults); request TTL {TTL:g} s.",
        "",
        "| code | N waiting | trigger processes, % of one core (quiet) | PostgreSQL server, % of one core (quiet) | "
        "hand-overs | notice p50 ms | p90 ms | max ms | hop p50 ms | trigger processes during hand-overs, % of one "
        "core | their CPU per hand-over, ms | fired early / not granted / expired / abandoned |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        *(row(r) for r in sorted(results, key=lambda r: (r["n"], r["label"] != "baseline"))),
        "",
        *(ratios(results, n) for n in sizes),
        "",
        "*Notice*: from a grant (the time of its audit event) to the trigger yielding its event. *Hop*: from one "
        "release to the next (the next waiter's notice, then the release of its lease by this process).",
    ])
    print(report)
    if not args.no_write:
        write_section("trigger-notice", "The triggerer's notice of a grant (issue #23)", report)


if __name__ == "__main__":
    main()
