"""Headline benchmark: K concurrent writers to one Delta table through Airflow, several ways.

    .venv/bin/python benchmarks/headline.py                       # K = 4, 8, 16; both tables; 3 repetitions
    .venv/bin/python benchmarks/headline.py --writers 4 --reps 1  # a quick look

What runs (all on this machine, started and stopped by the benchmark): one Spark Connect server
(``local[2]``, delta-spark) that every job runs on, as a platform runs a standing Spark; ``airflow
standalone`` (LocalExecutor with ``--parallelism`` slots, triggerer, SQLite metadata database); a SQLite
lease store. The DAGs are ``headline_dags/headline.py``, the writers ``headline_workload.py``.

Per table (partitioned / unpartitioned with deletion vectors), K and repetition, the same K writers
run once in each mode, each on a fresh copy of the table: (d) serial first (the reference table the
others must equal, and each job's times alone, for the bounds), then, in an order that rotates with the repetition
(so that no mode always runs on a warmer or a busier server, the bound's own run included), (e)
disjoint (the same writers, none conflicting: the achievable bound's run), (a) naive, (b) injection
only, (c) the provider with its default settings, (c'') the provider forced to wait deferred and (c')
forced to wait in the worker. Measured from what the parts recorded:

* failed tasks: writers whose run ended in a state other than success (Airflow's metadata database);
* Delta conflicts: every conflict the provider logged (one line each, in-job retries included) and,
  for a failed try that logged none, one when its log names a Delta conflict exception;
* Spark work re-run: the seconds of every try that failed plus the seconds of every in-job attempt a
  conflict ended (``seconds`` of each conflict in the job's result);
* makespan: first writer start to last writer end, over all tries;
* achievable bound, per repetition, every term measured in that repetition: the largest of its
  disjoint run's makespan, the heaviest chain of mutually conflicting writers (they can only run one
  after another) adding up the members' Spark time read to commit (``run_seconds``) in its serial run
  (each job alone: the disjoint run's jobs ran beside each other, and times that overlapped do not add
  up to a bound), and the longest task of its serial run (``headline_workload.achievable_bound``);
  each mode's makespan / bound is taken against the bound of its own repetition;
* old ideal (kept beside it): the largest of total work / slots, the heaviest conflicting chain and the
  longest job, with each job's times from the serial runs (their fastest repetition);
* hand-over, for every pooled writer whose lease waited (``lease.waited > 0`` in its result, or a gap
  between its request and its grant in the pool's audit): the job's ``run_started_at`` (when it went
  to Spark) minus the audit's GRANT of the result's ``lease.request_id`` (made in the transaction that
  released the blocker); a wait counts as in the worker when the task's log has
  ``holding.wait_in_worker``'s line ``lease request <id> granted after ... s in the worker``, as
  deferred when it has the task runner's ``Pausing task as DEFERRED`` instead;
* correct: the final table has exactly the expected rows: ``(m, u)`` groups with their counts and id
  sums against the closed form, and no row differs from the serial run's table (``EXCEPT ALL``); in
  the disjoint mode each writer's copy holds the seed plus that writer's change.

The figures go to docs/benchmarks.md (section ``headline``) and docs/headline.png, as measured.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the repository root: tests.servers starts the Spark Connect server

import headline_workload as wl  # noqa: E402
from _report import machine, percentile, write_section  # noqa: E402

from airflow_delta_occ.demo import airflow_env, standalone  # noqa: E402
from airflow_delta_occ.demo.metadata import query, xcom  # noqa: E402
from airflow_delta_occ.retry.classify import ConflictKind  # noqa: E402
from airflow_delta_occ.spark.session import delta_submit_conf  # noqa: E402
from tests.servers import connect_server, partition_settings  # noqa: E402

DAGS = HERE / "headline_dags"
CHART = HERE.parent / "docs" / "headline.png"
RUN_TIMEOUT = 3600.0
#: The order modes are listed in (the chart's bars, the list of modes).
CHART_ORDER = ("naive", "inject", "provider", "deferred", "worker", "serial", "disjoint")
DONE = {"success", "skipped"}   # a skipped OPTIMIZE found its work done by another (its policy)
#: What names a Delta conflict in a plain PySpark job's traceback: the exception classes, or Delta's error class.
CONFLICT_NAMES = (*(kind.value for kind in ConflictKind), "DELTA_CONCURRENT_")
#: The provider's line for each conflict it meets (``retry/policy.py``, ``ConflictRecord.describe``).
PROVIDER_CONFLICT = re.compile(r"(Concurrent\w+Exception|MetadataChangedException|ProtocolChangedException) on \S+ "
                               r"\(attempt \d+ of \d+")


@dataclass
class RunFigures:
    """One DAG run of one mode: what the benchmark reports for it."""

    table: str
    k: int
    mode: str
    rep: int
    state: str
    makespan: float
    failed_tasks: int
    skipped_tasks: int
    conflicts: int
    rerun_seconds: float          # tries a conflict failed, and in-job attempts a conflict ended
    other_failures: int           # tries that failed for anything but a conflict (the run is suspect)
    tries: int
    correct: bool
    correctness: str
    work: dict[str, float] = field(default_factory=dict)   # task -> seconds of its successful try
    spark: dict[str, float] = field(default_factory=dict)  # task -> run_seconds of its job (read to commit)
    overhead: list[float] = field(default_factory=list)    # serial tasks: task_seconds - run_seconds
    # Pooled modes: one entry per leased task (``handover_of``): whether and how it waited, its hand-over.
    handovers: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""   # which results.json the run came from (set when reported; reps pair within one)


# -- Airflow's records --------------------------------------------------------------------------------
def seconds(value: str | None) -> float:
    """Airflow's UTC timestamps (stored without a zone in SQLite) as epoch seconds."""
    if not value:
        return float("nan")
    stamp = datetime.fromisoformat(str(value))
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()


def tries_of(db: Path, dag: str, run: str) -> dict[str, list[dict[str, Any]]]:
    """Every try of every task of the run, oldest first: ``{task: [{try_number, state, start, end}]}``."""
    columns = "task_id, try_number, state, start_date, end_date"
    rows = query(db, f"SELECT {columns} FROM task_instance_history WHERE dag_id = ? AND run_id = ?", dag, run)
    rows += query(db, f"SELECT {columns} FROM task_instance WHERE dag_id = ? AND run_id = ?", dag, run)
    out: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (r["task_id"], r["try_number"])):
        if r["start_date"] is None:
            continue
        out.setdefault(r["task_id"], []).append({"try": r["try_number"], "state": r["state"],
                                                 "start": seconds(r["start_date"]), "end": seconds(r["end_date"])})
    return out


def try_log(home: Path, dag: str, run: str, task: str, number: int) -> str:
    path = home / "logs" / f"dag_id={dag}" / f"run_id={run}" / f"task_id={task}" / f"attempt={number}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def conflicts_in(log: str, failed: bool) -> int:
    """The conflicts one try met: the provider's lines, or one for a failed try whose log names one
    (a plain PySpark job's traceback)."""
    found = len(PROVIDER_CONFLICT.findall(log))
    if found == 0 and failed and any(name in log for name in CONFLICT_NAMES):
        return 1
    return found


# -- the table ----------------------------------------------------------------------------------------
def create_table(spark: Any, path: str, k: int, table: str) -> None:
    """The seed rows (``partition_count(k)`` partitions of ROWS rows, FILES files each)."""
    partitions = wl.partition_count(k)
    partitioned = table == "partitioned"
    properties = "" if partitioned else " TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, p INT, m STRING, u STRING) USING delta"
              + (" PARTITIONED BY (p)" if partitioned else "") + properties)
    rows = spark.range(partitions * wl.ROWS).selectExpr("id", f"CAST(id DIV {wl.ROWS} AS INT) AS p", "'seed' AS m",
                                                        "'seed' AS u")
    rows.repartition(partitions, "p").sortWithinPartitions("id").write.format("delta").mode("append") \
        .option("maxRecordsPerFile", wl.ROWS // wl.FILES).save(path)


def check_table(spark: Any, path: str, k: int, table: str, reference: str | None,
                only: str | None = None) -> tuple[bool, str]:
    """Whether the table holds exactly the expected rows (and the reference table's, when given);
    ``only``: the copy written by that one writer (the disjoint mode)."""
    got = {(r["m"], r["u"]): (r["n"], r["s"]) for r in spark.sql(
        f"SELECT m, u, count(*) AS n, sum(id) AS s FROM delta.`{path}` GROUP BY m, u").collect()}
    expected = wl.expected_groups(k, table, only)
    if got != expected:
        return False, f"groups {got} != expected {expected}"
    if reference is not None:
        differ = spark.sql(f"SELECT count(*) AS n FROM ((SELECT * FROM delta.`{path}` EXCEPT ALL "
                           f"SELECT * FROM delta.`{reference}`) UNION ALL (SELECT * FROM delta.`{reference}` "
                           f"EXCEPT ALL SELECT * FROM delta.`{path}`))").collect()[0]["n"]
        if differ:
            return False, f"{differ} rows differ from the serial run's table"
    return True, "expected rows" + (", equal to the serial run's table" if reference else "")


def create_copies(spark: Any, path: str, k: int, table: str) -> None:
    """The disjoint mode's tables: one seed table per writer, byte for byte the same (a copy of the
    first; the log's paths are relative to the table)."""
    ws = wl.writers(k, table)
    first = wl.copy_location(path, ws[0].task_id)
    create_table(spark, first, k, table)
    for w in ws[1:]:
        shutil.copytree(first, wl.copy_location(path, w.task_id))


def check_copies(spark: Any, path: str, k: int, table: str) -> tuple[bool, str]:
    """Whether each writer's copy holds the seed plus that writer's change, and nothing else."""
    for w in wl.writers(k, table):
        ok, why = check_table(spark, wl.copy_location(path, w.task_id), k, table, None, only=w.task_id)
        if not ok:
            return False, f"copy of {w.task_id}: {why}"
    return True, f"expected rows in each of the {k} copies"


# -- the pool's audit: hand-overs -----------------------------------------------------------------------
#: ``holding.wait_in_worker``'s last line: the request was granted while its task waited in the worker.
WORKER_GRANT = "lease request {} granted after"
WORKER_GRANT_TAIL = re.compile(r"granted after [\d.]+ s in the worker")
#: The Airflow task runner's line when a task defers (Airflow 3, ``task_runner._defer_task``).
DEFERRED_LINE = "Pausing task as DEFERRED"


def handover_of(leases: Path, logs: str, result: dict[str, Any]) -> dict[str, Any] | None:
    """One leased job: whether its lease waited, where (``worker`` / ``deferred`` / ``unknown``) and its
    hand-over, ``run_started_at`` minus the audit's GRANT of its request; None when it held no lease.

    ``logs`` is every try's log of the task, joined.
    """
    lease = result.get("lease")
    if not isinstance(lease, dict) or not lease.get("request_id"):
        return None
    rid = str(lease["request_id"])
    events = query(leases, "SELECT kind, at FROM delta_occ_lease_audit WHERE request_id = ? ORDER BY event_id",
                   rid) if leases.exists() else []
    requested = next((float(e["at"]) for e in events if e["kind"] == "request"), None)
    granted = next((float(e["at"]) for e in events if e["kind"] == "grant"), None)
    lease_waited = float(lease.get("waited") or 0.0)
    waited = lease_waited > 0 or (requested is not None and granted is not None and granted - requested > 0.0)
    started = result.get("run_started_at")
    how = None
    if waited:
        lines = [line for line in logs.splitlines() if WORKER_GRANT.format(rid) in line]
        how = ("worker" if any(WORKER_GRANT_TAIL.search(line) for line in lines)
               else "deferred" if DEFERRED_LINE in logs else "unknown")
    return {"request_id": rid, "waited": waited, "lease_waited": lease_waited, "how": how,
            "requested_at": requested, "granted_at": granted, "run_started_at": started,
            "handover": (float(started) - granted) if waited and started is not None and granted is not None
            else None}


# -- one run --------------------------------------------------------------------------------------------
def figures(db: Path, home: Path, dag: str, run: str, state: str, *, table: str, k: int, mode: str,
            rep: int, correct: tuple[bool, str], leases: Path | None = None) -> RunFigures:
    tries = tries_of(db, dag, run)
    every = [t for ts in tries.values() for t in ts]
    start = min((t["start"] for t in every), default=float("nan"))
    end = max((t["end"] for t in every), default=float("nan"))
    failed = skipped = conflicts = other = 0
    rerun = 0.0
    work: dict[str, float] = {}
    spark: dict[str, float] = {}
    overhead: list[float] = []
    handovers: list[dict[str, Any]] = []
    for task, ts in tries.items():
        last = ts[-1]
        failed += last["state"] not in DONE
        skipped += last["state"] == "skipped"
        for t in ts:
            lost = t["state"] not in DONE
            met = conflicts_in(try_log(home, dag, run, task, t["try"]), lost)
            conflicts += met
            if lost and met:
                rerun += t["end"] - t["start"]   # the whole try: its Spark work is thrown away
            elif lost:
                other += 1
        if last["state"] in DONE:
            work[task] = last["end"] - last["start"]
        result = xcom(db, dag, run, task)
        if isinstance(result, dict):
            rerun += sum(float(c.get("seconds") or 0.0) for c in result.get("conflicts") or ())
            spark[task] = float(result.get("run_seconds") or 0.0)
            if mode == "serial" and result.get("task_seconds") is not None:  # never deferred: the whole task
                overhead.append(float(result["task_seconds"]) - float(result["run_seconds"]))
            if leases is not None:
                logs = "\n".join(try_log(home, dag, run, task, t["try"]) for t in ts)
                handover = handover_of(leases, logs, result)
                if handover is not None:
                    handovers.append({"task": task, **handover})
    return RunFigures(table, k, mode, rep, state, end - start, failed + (k - len(tries)), skipped, conflicts, rerun,
                      other, len(every), correct[0], correct[1], work, spark, overhead, handovers)


@contextmanager
def airflow(work: Path, connect_url: str, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """``airflow standalone`` with the benchmark's DAGs, pools and connections."""
    home, lake = work / "airflow", work / "lake"
    home.mkdir()
    spec = work / "spec.json"
    wl.write_spec(spec, root=str(lake), connect_url=connect_url, ks=args.writers, tables=args.tables,
                  serial_pool="bench_serial", conflict_pool="bench", retries=args.retries,
                  retry_delay=args.retry_delay, modes=["serial", *args.modes])   # serial: the warm-up
    pools = work / "pools.toml"
    pools.write_text(f'[pools.bench]\ntables = ["{lake}/**"]\nmodel = "delta"\nlease_ttl = "120s"\n'
                     f'heartbeat = "5s"\nairflow_pool = "bench_conflict_pool"\n')
    env = airflow_env(
        home, DAGS,
        AIRFLOW__CORE__PARALLELISM=str(args.parallelism),
        AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
        AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="1",
        AIRFLOW__DELTA_OCC__POOL_FILE=str(pools),
        AIRFLOW_CONN_DELTA_OCC_DEFAULT=json.dumps({"conn_type": "delta_occ",
                                                   "extra": {"mode": "connect", "connect_url": connect_url}}),
        AIRFLOW_CONN_DELTA_OCC_LEASES=json.dumps({"conn_type": "delta_occ_leases",
                                                  "extra": {"url": f"sqlite:///{work / 'leases.db'}"}}),
        AIRFLOW_CONN_SPARK_BENCH=json.dumps({"conn_type": "spark", "host": "local[1]",
                                             "extra": {"deploy-mode": "client"}}),
        DELTA_OCC_BENCH_SPEC=str(spec),
    )
    db = home / "airflow.db"

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "airflow", *argv], env=env, capture_output=True, text=True,
                              timeout=600)
        if done.returncode:
            raise RuntimeError(f"airflow {' '.join(argv)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    cli("db", "migrate")
    cli("delta-occ", "pools", "sync")
    cli("pools", "set", "bench_serial", "1", "the serial mode: one writer at a time")
    dag_ids = [d["dag_id"] for d in json.loads(spec.read_text())["dags"]]
    with standalone(env, work / "standalone.log") as server:
        deadline = time.monotonic() + 600
        while True:
            marks = ",".join("?" * len(dag_ids))
            found = query(db, f"SELECT dag_id FROM serialized_dag WHERE dag_id IN ({marks})", *dag_ids) \
                if db.exists() else []
            if len(found) == len(dag_ids):
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Airflow did not load the DAGs; see {work / 'standalone.log'}")
            time.sleep(2)

        def run(dag: str, run_id: str) -> str:
            cli("dags", "trigger", dag, "-r", run_id)
            until = time.monotonic() + RUN_TIMEOUT
            while True:
                rows = query(db, "SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", dag, run_id)
                if rows and rows[0]["state"] in ("success", "failed"):
                    return str(rows[0]["state"])
                if server.poll() is not None or time.monotonic() > until:
                    raise RuntimeError(f"{dag} {run_id} did not finish; see {work}")
                time.sleep(1)

        yield {"run": run, "db": db, "home": home, "lake": lake, "leases": work / "leases.db"}


def planner_check(path: str, spark: Any, k: int, table: str) -> str:
    """Where the provider's planner and the workload's conflict relation (the ideal bound's) disagree,
    on a fresh seed table: a pair only the planner calls conflicting is one the pool serializes that an
    ideal schedule need not."""
    from airflow_delta_occ.engine import DeltaLog

    create_table(spark, path, k, table)
    ws = wl.writers(k, table)
    planned = wl.planned_conflicts(ws, DeltaLog.for_table(path).snapshot())
    truth = {frozenset((a.task_id, b.task_id)) for a in ws for b in ws if a.task_id < b.task_id and wl.conflicts(a, b)}
    only_planner = sorted(tuple(sorted(pair)) for pair in planned - truth)
    only_truth = sorted(tuple(sorted(pair)) for pair in truth - planned)
    return (f"planner vs workload relation, {table} K={k}: {len(planned)} pairs planned conflicting, "
            f"{len(truth)} in the relation; only the planner: {only_planner or 'none'}; only the relation: "
            f"{only_truth or 'none'}")


def describe(r: RunFigures, wall: float) -> str:
    """One line per DAG run while the benchmark goes."""
    return (f"{r.table:12} K={r.k:<2} rep {r.rep} {r.mode:8} {r.state:7} makespan {r.makespan:6.1f} s  failed "
            f"{r.failed_tasks}  skipped {r.skipped_tasks}  conflicts {r.conflicts}  re-run {r.rerun_seconds:5.1f} s  "
            f"other failures {r.other_failures}  tries {r.tries}  {r.correctness} ({wall:.0f} s wall)")


def mode_order(rep: int, modes: list[str] | tuple[str, ...] = wl.MODES) -> list[str]:
    """Serial first (the reference table); the others of ``modes``, the disjoint run included, rotate
    with the repetition so that none always runs on a warmer (or busier) server."""
    others = [m for m in wl.MODES if m != "serial" and m in modes]
    shift = (rep - 1) % len(others) if others else 0
    return (["serial"] if "serial" in modes else []) + others[shift:] + others[:shift]


def run_all(args: argparse.Namespace, work: Path) -> list[RunFigures]:
    from pyspark.sql import SparkSession

    results: list[RunFigures] = []
    (work / "spark").mkdir()
    with connect_server(work / "spark", server_conf(args)) as server:
        spark = SparkSession.builder.remote(server["url"]).getOrCreate()
        with airflow(work, server["url"], args) as af:

            def one(table: str, k: int, mode: str, run_id: str, reference: str | None) -> tuple[RunFigures, str]:
                dag = wl.dag_id(table, k, mode)
                path = str(af["lake"] / dag / run_id)
                if mode == "disjoint":
                    create_copies(spark, path, k, table)
                else:
                    create_table(spark, path, k, table)
                try:
                    state = af["run"](dag, run_id)
                    correct = (check_copies(spark, path, k, table) if mode == "disjoint"
                               else check_table(spark, path, k, table, reference))
                except Exception as exc:  # a run that did not finish is a result, not the end of the benchmark
                    state, correct = "failed", (False, f"run did not finish: {exc}"[:300])
                return figures(af["db"], af["home"], dag, run_id, state, table=table, k=k, mode=mode, rep=0,
                               correct=correct, leases=af["leases"] if mode in wl.POOL_MODES else None), path

            if args.warmup:
                # The Connect server's JIT and caches warm up on a run nobody measures.
                warm, _ = one(args.tables[0], min(args.writers), "serial", "warmup", None)
                print(f"warm-up run: {warm.state} in {warm.makespan:.0f} s", flush=True)
            for table in args.tables:
                for k in args.writers:
                    for rep in range(1, args.reps + 1):
                        reference = None
                        for mode in mode_order(rep, args.modes):
                            began = time.time()
                            result, path = one(table, k, mode, f"rep{rep}", reference)
                            result.rep = rep
                            if mode == "serial" and result.state == "success" and result.correct:
                                reference = path   # the others must leave exactly its rows
                            if mode == "serial" and rep == 1:
                                print(planner_check(str(af["lake"] / "planner" / f"{table}_k{k}"), spark, k, table),
                                      flush=True)
                            results.append(result)
                            print(describe(result, time.time() - began), flush=True)
                            kept = {key: v for key, v in vars(args).items() if key not in ("work", "report")}
                            (work / "results.json").write_text(json.dumps(
                                {"args": kept, "results": [asdict(r) for r in results]}, indent=1))
        spark.stop()
    return results


# -- the report -----------------------------------------------------------------------------------------
def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    """The median, with (min-max) when there is more than one value."""
    if not values:
        return "n/a"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def achievable_bounds(group: list[RunFigures], k: int, table: str) -> dict[tuple[str, int], dict[str, Any]]:
    """``{(source, rep): bound}`` for each repetition whose disjoint run and serial run both succeeded
    with the expected rows and a result from every writer (``headline_workload.achievable_bound``)."""
    ws = wl.writers(k, table)

    def complete(r: RunFigures) -> bool:
        return r.state == "success" and r.correct and len(r.work) == k and len(r.spark) == k

    serial = {(r.source, r.rep): r for r in group if r.mode == "serial" and complete(r)}
    return {(r.source, r.rep): wl.achievable_bound(ws, r.makespan, serial[(r.source, r.rep)].work,
                                                   serial[(r.source, r.rep)].spark, r.spark)
            for r in group if r.mode == "disjoint" and complete(r) and (r.source, r.rep) in serial}


def summarize(results: list[RunFigures], slots: int) -> list[dict[str, Any]]:
    """One row per (table, K, mode): medians with min and max over the repetitions, the achievable bound
    of each repetition (and each run's makespan against its own repetition's), and the old ideal bound."""
    rows = []
    for table in dict.fromkeys(r.table for r in results):
        for k in dict.fromkeys(r.k for r in results if r.table == table):
            group = [r for r in results if r.table == table and r.k == k]
            serial = [r for r in group if r.mode == "serial"]
            ws = wl.writers(k, table)
            ideal = None
            good = [r for r in serial if r.correct and len(r.work) == k and len(r.spark) == k]
            if good:
                # Each job alone, its fastest repetition (the old bound, kept for comparison).
                work = {w.task_id: min(r.work[w.task_id] for r in good) for w in ws}
                alone = {w.task_id: min(r.spark[w.task_id] for r in good) for w in ws}
                ideal = wl.ideal_makespan(ws, work, alone, slots)
            bounds = achievable_bounds(group, k, table)
            bound_values = [b["bound"] for b in bounds.values()]
            for mode in wl.MODES:
                runs = [r for r in group if r.mode == mode]
                if not runs:
                    continue
                makespans = [r.makespan for r in runs]
                ratios = [r.makespan / bounds[(r.source, r.rep)]["bound"] for r in runs
                          if (r.source, r.rep) in bounds]
                row = {"table": table, "k": k, "mode": mode, "reps": len(runs),
                       "runs_ok": f"{sum(r.state == 'success' for r in runs)}/{len(runs)}",
                       "failed": spread([float(r.failed_tasks) for r in runs], "{:.0f}"),
                       "skipped": spread([float(r.skipped_tasks) for r in runs], "{:.0f}"),
                       "other": spread([float(r.other_failures) for r in runs], "{:.0f}"),
                       "conflicts": spread([float(r.conflicts) for r in runs], "{:.0f}"),
                       "rerun": spread([r.rerun_seconds for r in runs]),
                       "makespan": spread(makespans), "makespan_median": statistics.median(makespans),
                       "correct": f"{sum(r.correct for r in runs)}/{len(runs)}",
                       "bound": spread(bound_values),
                       "bound_median": statistics.median(bound_values) if bound_values else None,
                       "ratio": spread(ratios, "{:.2f}") if ratios else "n/a",
                       "bound_parts": [{"source": src, "rep": rep, **b} for (src, rep), b in sorted(bounds.items())],
                       "ideal": ideal["bound"] if ideal else None, "ideal_parts": ideal,
                       "handover": handover_summary(runs) if mode in wl.POOL_MODES else None}
                rows.append(row)
    return rows


def handover_summary(runs: list[RunFigures]) -> dict[str, Any]:
    """The hand-overs of the runs' leased tasks: how many leases, granted at once, and per place of
    waiting (worker, deferred, unknown) the hand-over seconds."""
    entries = [h for r in runs for h in r.handovers]
    out: dict[str, Any] = {"leases": len(entries), "at_once": sum(not h["waited"] for h in entries)}
    for how in ("worker", "deferred", "unknown"):
        out[how] = [float(h["handover"]) for h in entries if h["waited"] and h["how"] == how
                    and h.get("handover") is not None]
    out["no_figure"] = sum(h["waited"] and h.get("handover") is None for h in entries)
    return out


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["table"], r["k"]) for r in rows))
    fig, ax = plt.subplots(figsize=(max(7, 2.6 * len(groups) + 3), 4.4))
    colors = {"naive": "#d62728", "inject": "#ff7f0e", "provider": "#2ca02c", "deferred": "#bcbd22",
              "worker": "#17becf", "serial": "#7f7f7f", "disjoint": "#9467bd"}
    shown = [m for m in CHART_ORDER if any(r["mode"] == m for r in rows)]
    width = 0.8 / len(shown)
    for i, mode in enumerate(shown):
        xs, ys = [], []
        for g, (table, k) in enumerate(groups):
            match = [r for r in rows if (r["table"], r["k"], r["mode"]) == (table, k, mode)]
            if match:
                xs.append(g + (i - (len(shown) - 1) / 2) * width)
                ys.append(match[0]["makespan_median"])
        ax.bar(xs, ys, width, label=wl.MODE_LABELS[mode], color=colors[mode])
    drawn = {"bound": False, "ideal": False}
    for g, (table, k) in enumerate(groups):
        here = [r for r in rows if (r["table"], r["k"]) == (table, k)]
        bound = next((r["bound_median"] for r in here if r["bound_median"]), None)
        ideal = next((r["ideal"] for r in here if r["ideal"]), None)
        if bound:
            ax.hlines(bound, g - 0.45, g + 0.45, colors="black", linestyles="dashed",
                      label="_nolegend_" if drawn["bound"] else "achievable bound (same run, median)")
            drawn["bound"] = True
        if ideal:
            ax.hlines(ideal, g - 0.45, g + 0.45, colors="dimgray", linestyles="dotted",
                      label="_nolegend_" if drawn["ideal"] else "old ideal bound (serial-run times)")
            drawn["ideal"] = True
    ax.set_xticks(range(len(groups)), [f"{table}\nK={k}" for table, k in groups])
    ax.set_ylabel("makespan, s (median)")
    ax.set_title("K concurrent Delta writers through Airflow")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def commands(runs: list[str]) -> str:
    """How the figures were made: one command per run the report covers (``--report A B`` joins runs)."""
    return " and ".join(f"`benchmarks/headline.py {run}`" for run in runs)


def _command_of(saved_args: dict[str, Any]) -> list[str]:
    """A saved run's command line(s); early runs saved the argument list itself."""
    argv = saved_args.get("argv") or []
    return [" ".join(argv)] if any(a.startswith("--") for a in argv) else list(argv)


def handover_table(rows: list[dict[str, Any]]) -> list[str]:
    """The hand-over figures of the pooled modes, one line per (table, K, mode)."""
    pooled = [r for r in rows if r["handover"] is not None and r["handover"]["leases"]]
    if not pooled:
        return []

    def cells(values: list[float]) -> str:
        if not values:
            return "0 | - | -"
        return f"{len(values)} | {percentile(values, 0.5):.2f} | {percentile(values, 0.9):.2f}"

    lines = ["", "Hand-over of each lease that waited: the job's `run_started_at` (when it went to Spark) minus "
             "the pool's audit GRANT of the request its result names (the grant is made in the transaction that "
             "released the blocker), seconds, over every repetition. A wait is counted in the worker when the "
             "task's log shows `lease request <id> granted after ... s in the worker` (`pools/holding.wait_in_"
             "worker`), deferred when it shows the task runner's `Pausing task as DEFERRED` instead.", "",
             "| table | K | mode | leases | granted at once | waited in the worker: n | p50, s | p90, s | "
             "waited deferred: n | p50, s | p90, s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in pooled:
        h = r["handover"]
        lines.append(f"| {r['table']} | {r['k']} | {wl.MODE_LABELS[r['mode']]} | {h['leases']} | {h['at_once']} | "
                     f"{cells(h['worker'])} | {cells(h['deferred'])} |")
        if h["unknown"] or h["no_figure"]:
            lines.append(f"|  |  | (not classified: {len(h['unknown'])} waits; without a figure: "
                         f"{h['no_figure']}) |  |  |  |  |  |  |  |  |")
    return lines


def server_conf(args: argparse.Namespace) -> dict[str, str]:
    """The Connect server's settings over ``tests.servers.connect_server``'s small ones."""
    return {**delta_submit_conf(), "spark.driver.memory": args.server_memory,
            "spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}


def report(rows: list[dict[str, Any]], overhead: list[float], args: argparse.Namespace, wall: float) -> str:
    lines = [
        f"Run with {commands(args.argv)} on {machine()}; {args.date}; the whole run took {wall / 60:.0f} min.",
        "",
        f"Spark: one Connect server (`local[2]`, the machine's two cores; {partition_settings(server_conf(args))}) "
        "runs every job. Airflow: `airflow "
        f"standalone`, LocalExecutor, parallelism {args.parallelism}. Retries: naive and injection-only tasks "
        f"retries={args.retries}, retry_delay={args.retry_delay:.0f} s (set by the DAG author); provider tasks the "
        "provider's defaults (`[delta_occ] task_retries` = 2 at the task level, typed in-job retries). Each "
        f"partition holds {wl.ROWS:,} rows in {wl.FILES} files; every writer touches {wl.HALF:,} rows. "
        "Achievable bound, per repetition, every term measured in that repetition = max(the makespan of its "
        "disjoint run (the same K writers each on its own copy of the seed table, all at once through the same "
        "Airflow, no pool), the heaviest chain of mutually conflicting jobs adding up their Spark time read to "
        "commit (`run_seconds`) in its serial run (each job alone: the disjoint run's jobs overlapped, and "
        "times that overlapped add up to no bound), the longest task of its serial run); makespan / bound "
        "divides each run by the bound of its own repetition. Old ideal (kept for comparison) = max(total work / "
        f"{args.parallelism} slots, heaviest conflicting chain, longest job) with the serial runs' times (the "
        "chain their `run_seconds`), the fastest serial repetition of each. Medians, (min-max) over "
        "repetitions.",
        "",
        "| table | K | mode | DAG runs succeeded | failed tasks | skipped | Delta conflicts | Spark work re-run, s | "
        "other failed tries | makespan, s | achievable bound, s | makespan / bound | old ideal, s | "
        "final table correct |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ideal = f"{r['ideal']:.1f}" if r["ideal"] else "n/a"
        lines.append(f"| {r['table']} | {r['k']} | {wl.MODE_LABELS[r['mode']]} | {r['runs_ok']} | {r['failed']} | "
                     f"{r['skipped']} | {r['conflicts']} | {r['rerun']} | {r['other']} | {r['makespan']} | "
                     f"{r['bound']} | {r['ratio']} | {ideal} | {r['correct']} |")
    lines += ["", "Modes: " + "; ".join(wl.MODE_TITLES[m] for m in CHART_ORDER if any(r["mode"] == m for r in rows))
              + "."]
    seen: set[tuple[str, int]] = set()
    for r in rows:
        if (r["table"], r["k"]) in seen:
            continue
        seen.add((r["table"], r["k"]))
        for b in r["bound_parts"]:
            concurrent = (f"; the same chain with the disjoint run's times, which overlapped: "
                          f"{b['chain_concurrent']:.1f} s" if b.get("chain_concurrent") is not None else "")
            lines.append(f"- {r['table']}, K={r['k']}, rep {b['rep']}: achievable bound {b['bound']:.1f} s "
                         f"(the {b['binding']}): disjoint makespan {b['disjoint_makespan']:.1f} s, heaviest "
                         f"conflicting chain {b['chain']:.1f} s ({len(b['chain_members'])} jobs, alone), longest "
                         f"job {b['longest']:.1f} s (alone){concurrent}.")
        parts = r["ideal_parts"]
        if parts:
            lines.append(f"- {r['table']}, K={r['k']}, old ideal {parts['bound']:.1f} s (serial-run times): total "
                         f"work {parts['total_work']:.1f} s, heaviest conflicting chain {parts['chain']:.1f} s "
                         f"({len(parts['chain_members'])} jobs), longest job {parts['longest']:.1f} s.")
    if overhead:
        lines.append("- The provider's own time per task, in the serial runs (`task_seconds - run_seconds` of each "
                     "job's result: opening the Spark Connect session, reading the Delta log, planning, confirming "
                     "the commit; not the Airflow task start, which any operator pays): median "
                     f"{statistics.median(overhead):.2f} s, max {max(overhead):.2f} s over {len(overhead)} tasks.")
    lines += handover_table(rows)
    lines += ["", f"![makespan per mode]({CHART.name})"]
    return "\n".join(lines)


def _mode_of(saved: dict[str, Any]) -> str:
    """A saved run's mode as named now: results saved before the hand-overs were recorded ran ``provider``
    with the operator's default of then, ``deferrable=True``: the ``deferred`` mode of now."""
    return "deferred" if saved["mode"] == "provider" and "handovers" not in saved else str(saved["mode"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--tables", nargs="+", choices=wl.TABLES, default=list(wl.TABLES))
    parser.add_argument("--modes", nargs="+", choices=wl.MODES, default=list(wl.MODES))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--retries", type=int, default=3, help="Airflow retries of the naive and injection-only tasks")
    parser.add_argument("--retry-delay", type=float, default=30.0, help="their retry_delay, seconds")
    parser.add_argument("--server-memory", default="4g")
    parser.add_argument("--work", type=Path, help="keep the run's files here (default: a temporary folder)")
    parser.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="skip the unmeasured warm-up run of the Connect server")
    parser.add_argument("--report", type=Path, nargs="+", metavar="RESULTS_JSON",
                        help="only report the results.json of earlier runs (their work folders), running nothing")
    args = parser.parse_args()
    args.argv, args.date = [" ".join(sys.argv[1:])], time.strftime("%Y-%m-%d")
    work = (args.work or Path(tempfile.mkdtemp(prefix="delta-occ-headline-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}", flush=True)
    started = time.time()
    if args.report:
        runs = [json.loads(path.read_text()) for path in args.report]
        for key in ("parallelism", "retries", "retry_delay", "date"):   # report the runs as they were run
            setattr(args, key, runs[0]["args"][key])
        args.argv = [command for run in runs for command in _command_of(run["args"])]
        # Repetitions pair (a mode's run with its repetition's disjoint run) within one results.json only.
        results = [RunFigures(**{**r, "source": str(i), "mode": _mode_of(r)}) for i, run in enumerate(runs)
                   for r in run["results"]]
        started -= sum(run["args"].get("wall", 0.0) for run in runs)
    else:
        results = run_all(args, work)
        saved = json.loads((work / "results.json").read_text())
        saved["args"]["wall"] = time.time() - started
        (work / "results.json").write_text(json.dumps(saved, indent=1))
    rows = summarize(results, args.parallelism)
    overhead = [o for r in results for o in r.overhead]
    text = report(rows, overhead, args, time.time() - started)
    print(text)
    if args.no_doc:
        if args.work is not None:
            chart(rows, work / CHART.name)
            print(f"chart: {work / CHART.name}", flush=True)
    else:
        chart(rows, CHART)
        write_section("headline", "Headline: concurrent writers through Airflow, naive vs the provider", text)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
