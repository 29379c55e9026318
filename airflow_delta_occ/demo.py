"""``make demo``: concurrent MERGEs into one Delta table through a real Airflow scheduler.

The example DAG (``dags_examples/delta_concurrent_merges.py``) merges one source per country into one
table, each MERGE confined to its partition by ``partitions=``, then compacts the day. The demo
starts Airflow (``airflow standalone``: scheduler with the LocalExecutor, DAG processor, API server,
SQLite) in a throwaway AIRFLOW_HOME, triggers the DAG, waits for it, and then reads the table's log
with the engine, without Spark: when each task ran, which version each MERGE read and which it
committed (a MERGE that committed later than read version + 1 was rebased over a concurrent one,
without conflict), and the planner's verdicts for partition-confined and unconfined MERGEs.

``python -m airflow_delta_occ.demo --sequential`` runs the DAG with ``airflow dags test`` instead
(one task at a time, no scheduler).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DAG_ID = "delta_concurrent_merges"
LOGICAL_DATE = "2024-01-01T00:00:00+00:00"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for servers started by the demo and the tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _json_tail(text: str) -> Any:
    for line in reversed(text.splitlines()):
        if line.startswith(("[", "{")):
            return json.loads(line)
    raise RuntimeError(f"no JSON in: {text[-1000:]}")


def demo_env(work: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    api_port = free_port()
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(work / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags_examples"),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{api_port}/execution/",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "DELTA_OCC_DEMO_ROOT": str(work / "lake"),
    }


def run_with_scheduler(work: Path, *, timeout: float = 900.0) -> dict[str, Any]:
    """Start Airflow, trigger the DAG, wait for its run; return the run's state and its task instances."""
    env = demo_env(work)
    airflow = [sys.executable, "-m", "airflow"]
    (work / "airflow").mkdir(parents=True, exist_ok=True)
    log = open(work / "airflow-standalone.log", "w")  # closed in finally
    server = subprocess.Popen([*airflow, "standalone"], env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + timeout

        def cli(*args: str) -> str:
            out = subprocess.run([*airflow, *args], env=env, capture_output=True, text=True, timeout=300)
            return out.stdout

        while DAG_ID not in cli("dags", "list", "-o", "json"):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Airflow did not come up; see {work / 'airflow-standalone.log'}")
            time.sleep(2)
        cli("dags", "unpause", DAG_ID)
        cli("dags", "trigger", DAG_ID, "-l", LOGICAL_DATE, "-r", "demo")
        state = "queued"
        while state not in ("success", "failed"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the DAG run did not finish in {timeout:.0f} s")
            time.sleep(3)
            runs = _json_tail(cli("dags", "list-runs", DAG_ID, "-o", "json") or "[]")
            state = next((r["state"] for r in runs if r["run_id"] == "demo"), "queued")
        tasks = _json_tail(cli("tasks", "states-for-dag-run", DAG_ID, "demo", "-o", "json"))
        return {"state": state, "tasks": tasks, "table": str(work / "lake" / "sales")}
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


def run_sequential(work: Path) -> dict[str, Any]:
    env = demo_env(work)
    airflow = [sys.executable, "-m", "airflow"]
    subprocess.run([*airflow, "db", "migrate"], env=env, check=True, capture_output=True)
    run = subprocess.run([*airflow, "dags", "test", DAG_ID, "2024-01-01"], env=env, capture_output=True, text=True)
    return {"state": "success" if run.returncode == 0 else "failed", "tasks": [],
            "table": str(work / "lake" / "sales"), "output": run.stdout[-5000:] + run.stderr[-5000:]}


def report(result: dict[str, Any]) -> None:
    from airflow_delta_occ.engine import DeltaLog
    from airflow_delta_occ.engine.planner import Operation, can_conflict, plan_footprint

    for t in sorted(result["tasks"], key=lambda t: (t["start_date"] or "", t["task_id"])):
        index = f"[{t['map_index']}]" if str(t.get("map_index", "")) not in ("", "-1") else ""
        print(f"  {t['task_id'] + index:<28} {t['state']:<8} {t['start_date'][11:19]} -> {t['end_date'][11:19]}")
    log = DeltaLog.for_table(result["table"])
    snapshot = log.snapshot()
    print(f"\ntable {log.table_uri}: version {snapshot.version}, {snapshot.num_files} files, "
          f"partitioned by {', '.join(snapshot.partition_columns)}")
    print("commits (read from the Delta log by the engine, no Spark):")
    for commit in reversed(log.history()):
        info = commit.commit_info
        if info is None:
            continue
        tag = json.loads(info.user_metadata).get("airflow", {}) if info.user_metadata else {}
        who = f"{tag['task_id']}[{tag['map_index']}]" if tag else "-"
        read = info.read_version
        note = ""
        if read is not None and commit.version > read + 1:
            note = f"  <- rebased over {commit.version - read - 1} concurrent commit(s), no conflict"
        print(f"  v{commit.version:<3} {info.operation:<13} by {who:<18} read v{read if read is not None else '-'}"
              f"{note}")
    confined = [plan_footprint(snapshot, Operation.MERGE, f"date = DATE'2024-01-01' AND country = '{c}'",
                               write_partitions=[{"date": "2024-01-01", "country": c}], label=f"MERGE {c}")
                for c in ("DE", "FR")]
    unconfined = plan_footprint(snapshot, Operation.MERGE, None, label="MERGE without partitions=")
    print("\nplanner verdicts (model 'delta'):")
    for a, b in ((confined[0], confined[1]), (confined[0], unconfined)):
        v = can_conflict(a, b, snapshot)
        print(f"  {a.label} vs {b.label}: {'may conflict: ' + str(v.exception) if v.conflict else 'no conflict'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", action="store_true", help="airflow dags test instead of a scheduler")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="delta-occ-demo-"))
    print(f"Airflow home and Delta lake in {work}")
    started = time.perf_counter()
    if args.sequential:
        print("running the DAG with `airflow dags test` ...")
        result = run_sequential(work)
    else:
        print("starting Airflow (scheduler + LocalExecutor) and triggering the DAG; each task starts an "
              "embedded Spark session with delta-spark ...")
        result = run_with_scheduler(work)
    print(f"DAG run {result['state']} in {time.perf_counter() - started:.0f} s")
    if result["state"] != "success":
        print(result.get("output", f"see {work}"))
        raise SystemExit(1)
    report(result)


if __name__ == "__main__":
    main()
