"""Conflict pools at platform scale: thousand-task backfills and faults on a Celery deployment.

The deployment (``tests/deployment.py``): the CeleryExecutor with a Redis broker, Airflow's metadata on
one PostgreSQL server, two hosts each with a scheduler, a triggerer and a Celery worker, one DAG
processor and API server, every Delta job on one Spark Connect server, and the lease store on a
PostgreSQL server of its own (so its CPU and queries are the pool's alone; ``pg_stat_statements`` counts
the queries). The DAGs: ``tests/airflow/celery_dags/delta_occ_scale.py``.

1. **dated**: DAYS date-partition overwrites through the pool (no two conflict). Reported: makespan,
   tasks per minute, and the makespan the workers' slots allow for the same task durations
   (sum of task durations / slots).
2. **flat**: WRITERS MERGEs of one unpartitioned table through the pool (every pair conflicts: one runs,
   the rest wait, deferred). Reported: makespan against the serial bound (the writers' Spark seconds end
   to end: the table admits one writer at a time), the hand-over from one lease's release to the next
   holder's job reaching Spark (p50/p99; what Airflow adds between two writers), and while at least 90%
   of the most requests seen waiting wait: the triggerers' CPU, the lease store's server CPU and its
   queries per second.
3. **faults**, each in its own deployment with FAULT_DAYS and FAULT_WRITERS: a worker SIGKILLed while its
   MERGE holds a lease and commits, a triggerer SIGKILLed while both run waiters, a scheduler SIGKILLed,
   and the lease store's PostgreSQL crashed and restarted. Each must end with every task done once,
   exact tables, one commit per writer, no Delta conflict, and no two conflicting leases at once.

Run: ``make bench-scale`` (1,000 tasks each by default; ``SCALE_ARGS="--days 200 --writers 100"`` for a
shorter run); figures go to docs/benchmarks.md, section "scale", exactly as measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT_DIR))
sys.path.insert(0, str(ROOT_DIR / "benchmarks"))

from _report import machine, percentile, write_section  # noqa: E402

from airflow_delta_occ.pools.leases.base import LeaseStore  # noqa: E402
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore  # noqa: E402
from airflow_delta_occ.pools.requests import AuditKind  # noqa: E402
from airflow_delta_occ.spark.session import delta_submit_conf  # noqa: E402
from tests.airflow import scale  # noqa: E402
from tests.deployment import CeleryDeployment, descendants  # noqa: E402
from tests.pg import PostgresServer  # noqa: E402
from tests.servers import connect_server, partition_settings  # noqa: E402
from tests.spark.differential.harness import gate_session_conf  # noqa: E402

TICKS = 100.0   # clock ticks per second of /proc/PID/stat (os.sysconf("SC_CLK_TCK") on Linux)
FAULTS = {"worker": scale.kill_the_held_writer, "triggerer": scale.kill_a_triggerer,
          "scheduler": scale.kill_a_scheduler, "postgres": None}


def cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its children: its own and its reaped children's (``/proc/PID/stat``
    utime, stime, cutime, cstime), plus the running descendants' own."""
    def fields(p: int) -> list[int]:
        stat = Path(f"/proc/{p}/stat").read_text()
        return [int(x) for x in stat[stat.rindex(")") + 2:].split()[11:15]]

    total = sum(fields(pid))
    for child in descendants(pid):
        try:
            total += sum(fields(child)[:2])
        except (OSError, ValueError):
            pass
    return total / TICKS


@dataclass
class Sample:
    at: float
    waiting: int
    triggerer_cpu: float
    store_cpu: float
    queries: int


@dataclass
class Sampler:
    """Every 2 s while a run goes: how many flat requests wait, both triggerers' CPU seconds, the lease
    store server's CPU seconds and its statement count."""

    deployment: CeleryDeployment
    store: LeaseStore
    lease_server: PostgresServer
    samples: list[Sample] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)
    _conn: Any = None

    def _cursor(self) -> Any:
        import psycopg2

        if self._conn is None or self._conn.closed:
            self._conn = psycopg2.connect(host="127.0.0.1", port=self.lease_server.port, user="delta_occ",
                                          dbname="leases")
            self._conn.autocommit = True
        return self._conn.cursor()

    def queries(self) -> int:
        """Statements the store ran, less this sampler's own (its reads of the waiters and of this view)."""
        with self._cursor() as cur:
            cur.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query NOT LIKE "
                        "'%pg_stat_statements%'")
            return int(cur.fetchone()[0]) - len(self.samples)

    def top_statements(self, limit: int = 6) -> list[tuple[int, str]]:
        """The lease store's most frequent statements: (calls, text)."""
        with self._cursor() as cur:
            cur.execute("SELECT calls, left(regexp_replace(query, '\\s+', ' ', 'g'), 110) FROM "
                        "pg_stat_statements ORDER BY calls DESC LIMIT %s", (limit,))
            return [(int(c), str(q)) for c, q in cur.fetchall()]

    def run(self) -> None:
        while not self.stopped.wait(2.0):
            try:
                triggerers = [h.processes["triggerer"].pid for h in self.deployment.hosts
                              if "triggerer" not in h.killed]
                waiting = scale.flat_waiters(self.store)
                triggerer_cpu = sum(cpu_seconds(p) for p in triggerers)
                store_cpu = cpu_seconds(self.lease_server.postmaster_pid)
                queries = self.queries()
                self.samples.append(Sample(time.time(), waiting, triggerer_cpu, store_cpu, queries))
            except Exception as error:  # a sample lost is not a run lost
                print(f"sample failed: {error}", file=sys.stderr)

    def waiting_window(self) -> dict[str, float] | None:
        """Rates over the longest stretch in which at least 90% of the most requests seen waiting wait."""
        if len(self.samples) < 2:
            return None
        most = max(s.waiting for s in self.samples)
        best: list[Sample] = []
        current: list[Sample] = []
        for s in self.samples:
            current = [*current, s] if s.waiting >= 0.9 * most else []
            if len(current) > len(best):
                best = current
        if len(best) < 5:   # under 8 s of samples says nothing
            return None
        first, last = best[0], best[-1]
        seconds = last.at - first.at
        return {"seconds": round(seconds, 1), "most_waiting": most,
                "mean_waiting": round(statistics.mean(s.waiting for s in best), 1),
                "triggerer_cpu_pct": round(100 * (last.triggerer_cpu - first.triggerer_cpu) / seconds, 1),
                "store_cpu_pct": round(100 * (last.store_cpu - first.store_cpu) / seconds, 1),
                "store_qps": round((last.queries - first.queries) / seconds, 1)}


@contextmanager
def deployment_for(work: Path, *, days: int, writers: int, hold: str, concurrency: int, ttl: float,
                   heartbeat: float, faults: bool = False, extra: dict[str, str] | None = None,
                   ) -> Iterator[tuple[CeleryDeployment, LeaseStore, PostgresServer, Path]]:
    """Servers, tables, pool file and a started Celery deployment for one run of the backfills."""
    root = work / "lake"
    scale.write_tables(root)
    pools = scale.pool_file(root, work / "pools.toml", ttl=ttl, heartbeat=heartbeat)
    (work / "spark").mkdir()
    with ExitStack() as stack:
        metadata = stack.enter_context(PostgresServer())
        # Durable commits (the test servers' default is not), as a lease store runs and so a crash keeps them.
        # pg_stat_statements without BEGIN/COMMIT/ROLLBACK: queries are what the store asks.
        leases = stack.enter_context(PostgresServer(settings={"shared_preload_libraries": "pg_stat_statements",
                                                              "pg_stat_statements.track_utility": "off",
                                                              "synchronous_commit": "on"}))
        lease_url = leases.create_database("leases")
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=leases.port, user="delta_occ", dbname="leases")
        conn.autocommit = True
        conn.cursor().execute("CREATE EXTENSION pg_stat_statements")
        conn.close()
        spark = stack.enter_context(connect_server(work / "spark", {
            **delta_submit_conf(), **gate_session_conf(), "spark.hadoop.occ.armed.dir": str(root / "gate")}))
        settings = scale.airflow_settings(root, pools, spark_url=spark["url"], lease_url=lease_url, days=days,
                                          writers=writers, slots=concurrency, hold=hold,
                                          quick_failure_detection=faults) | (extra or {})
        deployment = stack.enter_context(CeleryDeployment(work / "airflow", metadata, scale.DAGS, settings=settings,
                                                          worker_concurrency=concurrency))
        store = stack.enter_context(SqlLeaseStore(lease_url))
        deployment.cli("delta-occ", "pools", "sync")
        deployment.wait_for_dags(scale.DATED, scale.FLAT, timeout=900)
        yield deployment, store, leases, root


def task_seconds(tis: list[dict[str, Any]]) -> float:
    return sum(float((ti["end_date"] - ti["start_date"]).total_seconds()) for ti in tis
               if ti["end_date"] and ti["start_date"])


def main_runs(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    report: dict[str, Any] = {}
    slots = 2 * args.concurrency
    with deployment_for(work, days=args.days, writers=args.writers, hold="", concurrency=args.concurrency,
                        ttl=args.ttl, heartbeat=args.heartbeat) as (deployment, store, leases, root):
        for dag_id in args.dags:
            sampler = Sampler(deployment, store, leases)
            thread = threading.Thread(target=sampler.run, daemon=True)
            thread.start()
            outcome = scale.run_backfills(deployment, store, root, "bench", dag_ids=(dag_id,), timeout=args.timeout)
            sampler.stopped.set()
            thread.join(10)
            broken = scale.problems(outcome, root, days=args.days if dag_id == scale.DATED else 0,
                                    writers=args.writers if dag_id == scale.FLAT else 0)
            start, end = outcome.run_times[dag_id]
            makespan = end - start
            tasks = len(outcome.tis[dag_id])
            figures: dict[str, Any] = {"tasks": tasks, "makespan_s": round(makespan, 1),
                                       "tasks_per_min": round(60 * tasks / makespan, 1), "problems": broken}
            events = [e for e in outcome.events if e.table.endswith("/dated" if dag_id == scale.DATED else "/flat")]
            story = scale.table_story(events, "/dated" if dag_id == scale.DATED else "/flat")
            if dag_id == scale.DATED:
                # The makespan the slots allow for these task durations: makespan / bound is how busy the
                # slots were (the durations themselves are measured under the run's own contention).
                bound = task_seconds(outcome.tis[dag_id]) / slots
                figures.update(slot_bound_s=round(bound, 1), makespan_over_bound=round(makespan / bound, 2),
                               most_leases_at_once=story.peak,
                               spark_seconds_mean=round(statistics.mean(
                                   float(r["run_seconds"]) for r in outcome.xcoms[dag_id].values() if r), 2))
            else:
                # The table takes one writer at a time: the bound is its writers' Spark time end to end.
                # A hand-over: from one lease's release to the next holder's job reaching Spark.
                results = [r for r in outcome.xcoms[dag_id].values() if r]
                serial = sum(float(r["run_seconds"]) for r in results)
                started = {r["lease"]["request_id"]: float(r["run_started_at"]) for r in results
                           if r.get("lease") and r.get("run_started_at")}
                held = sorted((s for s in story.spans if s.granted_at is not None), key=lambda s: s.granted_at or 0.0)
                gaps = [started[b.request_id] - a.ended_at for a, b in itertools.pairwise(held)
                        if b.request_id in started and a.ended_at is not None] or [float("nan")]
                figures.update(serial_bound_s=round(serial, 1), makespan_over_bound=round(makespan / serial, 2),
                               handover_p50_s=round(percentile(gaps, 0.5), 2),
                               handover_p99_s=round(percentile(gaps, 0.99), 2),
                               waiting=sampler.waiting_window(), top_statements=sampler.top_statements())
            figures["expired_or_abandoned"] = sum(1 for e in events if e.kind in (AuditKind.EXPIRE, AuditKind.ABANDON))
            figures["retried_tasks"] = sum(1 for ti in outcome.tis[dag_id] if ti["try_number"] > 1)
            report[dag_id] = figures
            print(dag_id, json.dumps(figures, default=str), flush=True)
    return report


def waiting_run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every flat MERGE waiting at once, deferred: the cost of WRITERS waiting requests to the triggerers and the
    lease store, measured over a window of ``--window`` seconds once they all wait.

    This process holds the flat table first (a whole-table OPTIMIZE's footprint) and renews it while the MERGEs
    arrive; nothing is written. Every wait defers at once (Airflow's ``[operators] default_deferrable``): with
    no completed hold on the table the adaptive rule would first wait ``worker_wait`` seconds in a worker's
    slot, reading the pool's revision every 50 ms, which slowed arrivals and filled the store's figures with
    workers' reads. The full flat run measures hand-overs; this one the waiting.
    """
    from airflow_delta_occ.engine import DeltaLog
    from airflow_delta_occ.engine.planner import TableState, plan_footprint
    from airflow_delta_occ.pools.config import normalize_table
    from airflow_delta_occ.pools.requests import LeaseRequest

    with deployment_for(work, days=1, writers=args.writers, hold="", concurrency=args.concurrency, ttl=args.ttl,
                        heartbeat=args.heartbeat, extra={"AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True"},
                        ) as (deployment, store, leases, root):
        snapshot = DeltaLog.for_table(str(root / "flat")).snapshot()
        holder = store.acquire(LeaseRequest.of(
            pool=scale.POOL, table=normalize_table(str(root / "flat")), owner="bench holder",
            footprint=plan_footprint(snapshot, "OPTIMIZE", None, label="bench holder"),
            table_state=TableState.of(snapshot), ttl=args.ttl, expected_hold=3600.0))
        assert holder.granted, holder
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(args.heartbeat):
                store.renew(holder.request_id, "bench holder")

        renewer = threading.Thread(target=renew, daemon=True)
        renewer.start()
        sampler = Sampler(deployment, store, leases)
        sampling = threading.Thread(target=sampler.run, daemon=True)
        sampling.start()
        started = time.time()
        deployment.trigger(scale.FLAT, "waiting")
        all_waiting = None
        while time.time() - started < args.timeout and renewer.is_alive():
            if scale.flat_waiters(store) >= args.writers:
                all_waiting = time.time()
                break
            time.sleep(5)
        time.sleep(args.window)
        sampler.stopped.set()
        sampling.join(10)
        held_throughout = renewer.is_alive()   # a failed renewal ends the thread (and the waiting)
        stop.set()
        states: dict[str, int] = {}
        for ti in deployment.task_instances(scale.FLAT, "waiting"):
            states[str(ti["state"])] = states.get(str(ti["state"]), 0) + 1
        figures = {"writers": args.writers, "states_at_end": states, "held_throughout": held_throughout,
                   "seconds_until_all_wait": None if all_waiting is None else round(all_waiting - started, 1),
                   "waiting": sampler.waiting_window(), "top_statements": sampler.top_statements()}
        print("waiting", json.dumps(figures, default=str), flush=True)
        return figures


def fault_run(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    hold = "flat:first" if name == "worker" else ""
    with deployment_for(work, days=args.fault_days, writers=args.fault_writers, hold=hold,
                        concurrency=args.concurrency, ttl=args.fault_ttl, heartbeat=args.heartbeat, faults=True) as (
            deployment, store, leases, root):
        fault = FAULTS[name] or scale.restart_postgres(leases)
        started = time.time()
        outcome = scale.run_backfills(deployment, store, root, "fault", fault=fault, timeout=args.timeout)
        broken = scale.problems(outcome, root, days=args.fault_days, writers=args.fault_writers)
        if "killed" not in outcome.fault and "stopped" not in outcome.fault:
            broken.append("the fault never happened")
        retried = sorted((d, ti["map_index"], ti["try_number"]) for d, tis in outcome.tis.items() for ti in tis
                         if ti["try_number"] > 1)
        figures = {"fault": outcome.fault, "seconds": round(time.time() - started, 1), "problems": broken,
                   "retried": retried,
                   "expired": sum(1 for e in outcome.events if e.kind is AuditKind.EXPIRE),
                   "abandoned": sum(1 for e in outcome.events if e.kind is AuditKind.ABANDON)}
        print(name, json.dumps(figures, default=str), flush=True)
        return figures


def render(args: argparse.Namespace, report: dict[str, Any]) -> str:
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {machine()}; `python benchmarks/scale.py "
             f"{' '.join(sys.argv[1:])}`. Deployment: CeleryExecutor, Redis broker, 2 hosts x (scheduler, triggerer, "
             f"Celery worker with {args.concurrency} slots), DAG processor, API server; metadata and lease store on "
             f"two PostgreSQL servers; one Spark Connect server (`local[2]`, "
             f"{partition_settings(gate_session_conf())}) for every job; pool TTL {args.ttl:g} s "
             f"(fault runs {args.fault_ttl:g} s), "
             f"heartbeat {args.heartbeat:g} s. Everything shares the machine's 2 cores.", ""]
    if dated := report.get(scale.DATED):
        lines += ["| date-partitioned backfill | makespan | tasks/min | mean Spark s per job | slot bound | "
                  "makespan / slot bound | most leases at once | retried | problems |",
                  "|---|---|---|---|---|---|---|---|---|",
                  f"| {dated['tasks']} overwrites, none conflict | {dated['makespan_s']} s | "
                  f"{dated['tasks_per_min']} | "
                  f"{dated['spark_seconds_mean']} | {dated['slot_bound_s']} s | {dated['makespan_over_bound']} | "
                  f"{dated['most_leases_at_once']} | {dated['retried_tasks']} | {len(dated['problems'])} |", "",
                  "*Slot bound*: the sum of the task durations over the workers' slots, the makespan these tasks "
                  "allow if no slot is ever idle (the durations are measured under the run's own load).", ""]
    if flat := report.get(scale.FLAT):
        w = flat.get("waiting") or {}
        lines += ["| unpartitioned, every pair conflicts | makespan | tasks/min | serial bound | makespan / bound | "
                  "hand-over p50 / p99 | retried | problems |", "|---|---|---|---|---|---|---|---|",
                  f"| {flat['tasks']} MERGEs | {flat['makespan_s']} s | {flat['tasks_per_min']} | "
                  f"{flat['serial_bound_s']} s | {flat['makespan_over_bound']} | {flat['handover_p50_s']} s / "
                  f"{flat['handover_p99_s']} s | {flat['retried_tasks']} | {len(flat['problems'])} |", "",
                  "*Serial bound*: the MERGEs' Spark seconds end to end (the table takes one writer at a time). "
                  "*Hand-over*: from one lease's release to the next holder's job reaching Spark (the trigger's "
                  "wake-up, the scheduler, Celery, a new task process, planning).", "",
                  f"While {w.get('mean_waiting')} requests waited on average (most {w.get('most_waiting')}; over "
                  f"{w.get('seconds')} s): both triggerers together used {w.get('triggerer_cpu_pct')}% of one core, "
                  f"the lease store's PostgreSQL server {w.get('store_cpu_pct')}% of one core for "
                  f"{w.get('store_qps')} queries/s (every process's, waiting tasks in workers included).", ""]
    if waiting := report.get("waiting"):
        w = waiting.get("waiting") or {}
        lines += [f"**{waiting['writers']} MERGEs waiting at once** behind one lease this benchmark holds on the "
                  f"unpartitioned table (an OPTIMIZE's footprint), every wait deferred at once (`[operators] "
                  f"default_deferrable = True`): "
                  + (f"all waited {waiting['seconds_until_all_wait']} s after the trigger. "
                     if waiting['seconds_until_all_wait'] is not None else
                     f"not all were waiting when the arrival cap (`--timeout`, {args.timeout:g} s) ran out. ")
                  + f"Over {w.get('seconds')} "
                  f"s with {w.get('mean_waiting')} waiting on average (most {w.get('most_waiting')}): both triggerers "
                  f"together used {w.get('triggerer_cpu_pct')}% of one core, the lease store's PostgreSQL server "
                  f"{w.get('store_cpu_pct')}% of one core for {w.get('store_qps')} queries/s. Task states at the "
                  f"end: {json.dumps(waiting['states_at_end'])}.", ""]
    if faults := report.get("faults"):
        lines += ["| fault | what happened | run | retried tries | leases expired | problems |",
                  "|---|---|---|---|---|---|"]
        for name, f in faults.items():
            shown = {k: v for k, v in f["fault"].items() if k not in ("killed", "stopped", "started")}
            lines.append(f"| {name} | {json.dumps(shown)} | {f['seconds']} s | {len(f['retried'])} | {f['expired']} | "
                         f"{'; '.join(f['problems']) or 'none'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=1000)
    parser.add_argument("--writers", type=int, default=1000)
    parser.add_argument("--faults", default="worker,triggerer,scheduler,postgres",
                        help="comma-separated, or 'none'")
    parser.add_argument("--fault-days", type=int, default=48)
    parser.add_argument("--fault-writers", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=4, help="slots per Celery worker")
    # The main runs' TTL: a deferred task must resume within it after its grant, and a 20 s TTL collapsed the
    # thousand conflicting MERGEs' hand-overs (docs/benchmarks.md); 120 s did not. The fault runs keep a short
    # one so that a dead holder's lease ends soon.
    parser.add_argument("--ttl", type=float, default=120.0)
    parser.add_argument("--fault-ttl", type=float, default=20.0)
    parser.add_argument("--heartbeat", type=float, default=4.0)
    parser.add_argument("--timeout", type=float, default=3 * 3600.0)
    parser.add_argument("--dags", type=lambda text: tuple(f"delta_occ_scale_{d}" for d in text.split(",")),
                        default=(scale.DATED, scale.FLAT), help="main runs: dated,flat (default), dated or flat")
    parser.add_argument("--no-main", action="store_true", help="only the fault runs")
    parser.add_argument("--waiting", action="store_true",
                        help="also run WRITERS MERGEs that all wait behind one held lease, and measure the waiting")
    parser.add_argument("--window", type=float, default=120.0, help="seconds measured once every MERGE waits")
    parser.add_argument("--no-write", action="store_true", help="print, do not write docs/benchmarks.md")
    parser.add_argument("--section", default="scale",
                        help="the docs/benchmarks.md section written (scale: the default run; scale-thousand: the "
                             "thousand-task runs, which take hours here and run apart)")
    args = parser.parse_args()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as tmp:
        if not args.no_main:
            report.update(main_runs(args, Path(tmp) / "main"))
            print(render(args, report), flush=True)   # the main figures, should a fault run break
        if args.waiting:
            report["waiting"] = waiting_run(args, Path(tmp) / "waiting")
        faults = [f for f in args.faults.split(",") if f and f != "none"]
        report["faults"] = {}
        for name in faults:
            try:
                report["faults"][name] = fault_run(name, args, Path(tmp) / f"fault_{name}")
            except Exception as error:   # one broken run must not lose the others' figures
                report["faults"][name] = {"fault": {}, "seconds": 0, "problems": [f"run failed: {error}"],
                                          "retried": [], "expired": 0, "abandoned": 0}
                print(name, "failed:", error, flush=True)
    text = render(args, report)
    print(text)
    if not args.no_write:
        write_section(args.section, "Scale: thousand-task backfills and faults on Celery", text)


if __name__ == "__main__":
    main()
