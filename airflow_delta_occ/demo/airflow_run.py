"""``make demo``: concurrent MERGEs into one Delta table through a real Airflow scheduler.

The example DAG (``dags_examples/delta_concurrent_merges.py``) merges one source per country into one
table, each MERGE confined to its partition by ``partitions=``, then compacts the day. The demo
starts Airflow (``airflow standalone``: scheduler with the LocalExecutor, DAG processor, API server,
SQLite) in a throwaway AIRFLOW_HOME, triggers the DAG (a manual run without a logical date; the DAG
uses the run's date), prints the task states while it waits, and then reads the table's log with the
engine, without Spark: when each task ran, which version each MERGE read and which it committed (a
MERGE that committed later than read version + 1 was rebased over a concurrent one, without
conflict), what the compaction did, and the planner's verdicts for partition-confined and
unconfined MERGEs.

``python -m airflow_delta_occ.demo --dags-folder PATH`` takes the DAGs from PATH (default:
``dags_examples`` in the current directory, i.e. run it from the repository root).
``--sequential`` runs the DAG with ``airflow dags test`` instead (one task at a time, no scheduler).
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
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DAG_ID = "delta_concurrent_merges"
DAG_FILE = f"{DAG_ID}.py"
RUN_ID = "demo"
#: How often the demo polls Airflow, and how long it stays quiet when nothing changes.
POLL_SECONDS = 8.0
HEARTBEAT_SECONDS = 15.0
RUN_CHECK_SECONDS = 60.0

Progress = Callable[[str], None]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for servers started by the demo and the tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_dags_folder(dags_folder: Path | str) -> Path:
    """The folder as an absolute path; FileNotFoundError unless it holds the example DAG file."""
    folder = Path(dags_folder).expanduser().resolve()
    if not (folder / DAG_FILE).is_file():
        raise FileNotFoundError(
            f"{folder} does not hold {DAG_FILE}. Run the demo from the repository root (the DAGs are in "
            f"dags_examples/) or pass --dags-folder PATH/TO/dags_examples.")
    return folder


def _json_tail(text: str) -> Any:
    for line in reversed(text.splitlines()):
        if line.startswith(("[", "{")):
            return json.loads(line)
    raise RuntimeError(f"no JSON in: {text[-1000:]}")


def airflow_env(home: Path, dags_folder: Path | str, **settings: str) -> dict[str, str]:
    """Environment of a throwaway Airflow installation in ``home`` running the LocalExecutor.

    Every server gets its own free port on 127.0.0.1, so several installations (the demo, tests)
    can run side by side; ``settings`` adds or overrides variables (``AIRFLOW__CORE__PARALLELISM``).
    """
    bin_dir = str(Path(sys.executable).parent)
    api_port = free_port()
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{api_port}/execution/",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        **settings,
    }


def demo_env(work: Path, dags_folder: Path | str) -> dict[str, str]:
    return airflow_env(work / "airflow", check_dags_folder(dags_folder), DELTA_OCC_DEMO_ROOT=str(work / "lake"))


@contextmanager
def standalone(env: Mapping[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``airflow standalone`` (scheduler, DAG processor, API server, triggerer) while the block runs.

    It runs in its own process group, stopped with SIGTERM (SIGKILL after 60 s) when the block ends,
    so no task process it started outlives the block.
    """
    with open(log_path, "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "airflow", "standalone"], env=dict(env), stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield server
        finally:
            try:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(60)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(30)


# Task instance states, grouped for a newcomer; the groups print in this order.
_STATE_GROUPS = {
    "success": "done", "running": "running", "queued": "queued", "scheduled": "queued",
    "up_for_retry": "retrying", "up_for_reschedule": "retrying", "deferred": "deferred",
    "restarting": "retrying", "failed": "FAILED", "upstream_failed": "not run (upstream failed)",
    "skipped": "skipped", None: "waiting", "": "waiting", "none": "waiting",
}
_FINAL_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
_GROUP_ORDER = ["done", "running", "queued", "retrying", "deferred", "waiting", "FAILED",
                "not run (upstream failed)", "skipped"]


def _map_index(task: dict[str, Any]) -> int | None:
    value = task.get("map_index")
    return None if value in (None, "", -1, "-1") else int(value)


def _task_groups(tasks: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """``[("done", "prepare_table_and_sources"), ("running", "merge_country[0,2]"), ...]``."""
    groups: dict[str, dict[str, list[int]]] = {}
    for t in tasks:
        if t.get("state") == "removed":  # the placeholder of a mapped task, once it is expanded
            continue
        group = _STATE_GROUPS.get(t.get("state"), str(t.get("state")))
        indices = groups.setdefault(group, {}).setdefault(t["task_id"], [])
        if (index := _map_index(t)) is not None:
            indices.append(index)
    ordered = sorted(groups, key=lambda g: _GROUP_ORDER.index(g) if g in _GROUP_ORDER else len(_GROUP_ORDER))
    return [(group, ", ".join(f"{task_id}[{','.join(map(str, sorted(ix)))}]" if ix else task_id
                              for task_id, ix in groups[group].items()))
            for group in ordered]


def task_states_line(tasks: Iterable[dict[str, Any]]) -> str:
    """``done: prepare_table_and_sources | running: merge_country[0,2] | ...`` (mapped tasks grouped)."""
    return " | ".join(f"{group}: {names}" for group, names in _task_groups(tasks)) or "no task instances yet"


def _still_line(tasks: Iterable[dict[str, Any]]) -> str:
    """The short line repeated while nothing changes: ``still running: merge_country[0,1,2,3]``."""
    busy = [f"{group}: {names}" for group, names in _task_groups(tasks) if group in ("running", "queued", "retrying")]
    return "still " + (" | ".join(busy) if busy else "waiting for the scheduler")


def run_with_scheduler(work: Path, *, dags_folder: Path | str, timeout: float = 900.0,
                       progress: Progress | None = None) -> dict[str, Any]:
    """Start Airflow, trigger the DAG, wait for its run; return the run's state and its task instances.

    ``dags_folder`` must hold ``delta_concurrent_merges.py``. ``progress`` (e.g. ``print``) gets a line
    when Airflow is up, whenever the run's task states change, and every ~15 s while they do not.
    """
    env = demo_env(work, dags_folder)
    airflow = [sys.executable, "-m", "airflow"]
    (work / "airflow").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    last_message, last_time = "", started

    def say(message: str, *, repeat: str | None = None) -> None:
        """Print ``message``; if it is the last one again, print ``repeat`` only every HEARTBEAT_SECONDS."""
        nonlocal last_message, last_time
        now = time.monotonic()
        if repeat is not None and message == last_message:
            if now - last_time < HEARTBEAT_SECONDS:
                return
            shown = repeat
        else:
            shown = message
        last_message, last_time = message, now
        if progress is not None:
            elapsed = int(now - started)
            progress(f"  [{elapsed // 60}:{elapsed % 60:02d}] {shown}")

    with standalone(env, work / "airflow-standalone.log") as server:
        deadline = time.monotonic() + timeout

        def cli(*args: str) -> str:
            out = subprocess.run([*airflow, *args], env=env, capture_output=True, text=True, timeout=300)
            return out.stdout

        say("starting Airflow: database, scheduler, DAG processor, API server ...")
        waiting = "waiting for Airflow to come up and parse the DAG ..."
        while DAG_ID not in cli("dags", "list", "-o", "json"):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Airflow did not come up; see {work / 'airflow-standalone.log'}")
            say(waiting, repeat=waiting)
            time.sleep(2)
        say(f"Airflow is up and has parsed {DAG_ID}")
        cli("dags", "unpause", DAG_ID)
        # No -l: like a run triggered from the UI, it has no logical date, only run_after (the DAG
        # partitions by that date).
        cli("dags", "trigger", DAG_ID, "-r", RUN_ID)
        say(f"triggered run '{RUN_ID}' (manual, no logical date)")
        # One CLI call per poll (each costs seconds of CPU that the Spark tasks need): the task states;
        # the run's state when they are all final, or once a minute.
        state, run_after, run_checked = "queued", None, -RUN_CHECK_SECONDS
        tasks: list[dict[str, Any]] = []
        final = False
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the DAG run did not finish in {timeout:.0f} s; see {work / 'airflow'}")
            time.sleep(POLL_SECONDS)
            try:
                tasks = _json_tail(cli("tasks", "states-for-dag-run", DAG_ID, RUN_ID, "-o", "json") or "[]")
                final = bool(tasks) and all(t.get("state") in _FINAL_STATES for t in tasks)
                if final or time.monotonic() - run_checked >= RUN_CHECK_SECONDS:
                    runs = _json_tail(cli("dags", "list-runs", DAG_ID, "-o", "json") or "[]")
                    run: dict[str, Any] = next((r for r in runs if r["run_id"] == RUN_ID), {})
                    state, run_after = run.get("state", state), run.get("run_after", run_after)
                    run_checked = time.monotonic()
            except (RuntimeError, ValueError):  # a CLI call that printed no JSON (e.g. database busy)
                continue
            if state in ("success", "failed"):
                if not final:  # the run finished after this poll's task states were read
                    tasks = _json_tail(cli("tasks", "states-for-dag-run", DAG_ID, RUN_ID, "-o", "json"))
                break
            say(task_states_line(tasks), repeat=_still_line(tasks))
        say(f"run {state}: {task_states_line(tasks)}")
        return {"state": state, "tasks": tasks, "run_after": run_after, "table": str(work / "lake" / "sales")}


def run_sequential(work: Path, *, dags_folder: Path | str) -> dict[str, Any]:
    env = demo_env(work, dags_folder)
    airflow = [sys.executable, "-m", "airflow"]
    subprocess.run([*airflow, "db", "migrate"], env=env, check=True, capture_output=True)
    run = subprocess.run([*airflow, "dags", "test", DAG_ID, "2024-01-01"], env=env, capture_output=True, text=True)
    return {"state": "success" if run.returncode == 0 else "failed", "tasks": [],
            "table": str(work / "lake" / "sales"), "output": run.stdout[-5000:] + run.stderr[-5000:]}


def _count(metrics: Any, key: str) -> int | None:
    try:
        return int(metrics[key])
    except (KeyError, TypeError, ValueError):
        return None


def _size(n: int | None) -> str:
    if n is None:
        return "? bytes"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} bytes"


def compaction_summary(log: Any, snapshot: Any, run_date: str | None) -> list[str]:
    """What the OPTIMIZE commit did, from its operationMetrics in the Delta log, or why there is none."""
    optimize = next((c for c in log.history() if c.commit_info and c.commit_info.operation == "OPTIMIZE"), None)
    if optimize is not None:
        m = optimize.commit_info.operation_metrics
        removed, added = _count(m, "numRemovedFiles"), _count(m, "numAddedFiles")
        return [f"compaction (compact_day): OPTIMIZE v{optimize.version} rewrote {removed} small files "
                f"({_size(_count(m, 'numRemovedBytes'))}) into {added} ({_size(_count(m, 'numAddedBytes'))}) "
                "(the commit's operationMetrics in the Delta log)"]
    per_partition: dict[str, int] = {}
    for f in snapshot.files():
        values = snapshot.partition_values(f)
        if run_date is None or str(values.get("date")) == run_date:
            key = ", ".join(f"{k}={v}" for k, v in values.items())
            per_partition[key] = per_partition.get(key, 0) + 1
    counts = sorted(set(per_partition.values()))
    held = ("a single file" if counts == [1] else
            f"{' or '.join(map(str, counts))} file(s)" if counts else "no file")
    return ["compaction (compact_day): OPTIMIZE committed nothing, as there was nothing to compact: each of the "
            f"{len(per_partition)} partitions of date={run_date} holds {held} (OPTIMIZE rewrites only partitions "
            "with several small files)"]


def report(result: dict[str, Any]) -> None:
    from airflow_delta_occ.engine import DeltaLog
    from airflow_delta_occ.engine.planner import Operation, can_conflict, plan_footprint

    def hms(value: str | None) -> str:
        return value[11:19] if value else "--:--:--"

    for t in sorted(result["tasks"], key=lambda t: (t.get("start_date") or "", t["task_id"])):
        if t.get("state") == "removed":
            continue
        index = f"[{_map_index(t)}]" if _map_index(t) is not None else ""
        print(f"  {t['task_id'] + index:<28} {t['state']:<8} {hms(t.get('start_date'))} -> {hms(t.get('end_date'))}")
    log = DeltaLog.for_table(result["table"])
    snapshot = log.snapshot()
    dates = sorted({str(snapshot.partition_values(f)["date"]) for f in snapshot.files()})
    run_date = dates[-1] if dates else None
    print(f"\ntable {log.table_uri}: version {snapshot.version}, {snapshot.num_files} files, "
          f"partitioned by {', '.join(snapshot.partition_columns)}; the run wrote date={run_date}")
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
    print()
    for line in compaction_summary(log, snapshot, run_date):
        print(line)
    day = run_date or "2024-01-01"
    confined = [plan_footprint(snapshot, Operation.MERGE, f"date = DATE'{day}' AND country = '{c}'",
                               write_partitions=[{"date": day, "country": c}], label=f"MERGE {c}")
                for c in ("DE", "FR")]
    unconfined = plan_footprint(snapshot, Operation.MERGE, None, label="MERGE without partitions=")
    print("\nplanner verdicts (model 'delta'):")
    for a, b in ((confined[0], confined[1]), (confined[0], unconfined)):
        v = can_conflict(a, b, snapshot)
        print(f"  {a.label} vs {b.label}: {'may conflict: ' + str(v.exception) if v.conflict else 'no conflict'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m airflow_delta_occ.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--dags-folder", type=Path, default=Path("dags_examples"),
                        help=f"folder holding {DAG_FILE} (default: ./dags_examples, i.e. run from the repository root)")
    parser.add_argument("--sequential", action="store_true", help="airflow dags test instead of a scheduler")
    args = parser.parse_args(argv)
    try:
        dags_folder = check_dags_folder(args.dags_folder)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    work = Path(tempfile.mkdtemp(prefix="delta-occ-demo-"))
    print(f"DAGs from {dags_folder}; Airflow home and Delta lake in {work}")
    started = time.perf_counter()
    if args.sequential:
        print("running the DAG with `airflow dags test` ...")
        result = run_sequential(work, dags_folder=dags_folder)
    else:
        print("starting Airflow (scheduler + LocalExecutor) and triggering the DAG; each task starts an "
              "embedded Spark session with delta-spark (a few minutes on two cores) ...")
        result = run_with_scheduler(work, dags_folder=dags_folder, progress=lambda line: print(line, flush=True))
    print(f"DAG run {result['state']} in {time.perf_counter() - started:.0f} s")
    if result["state"] != "success":
        print(result.get("output", f"task logs under {work / 'airflow' / 'logs'}"))
        raise SystemExit(1)
    report(result)


if __name__ == "__main__":
    main()
