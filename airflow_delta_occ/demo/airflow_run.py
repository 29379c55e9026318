"""A throwaway Airflow for the demo, the tests and the benchmarks: its environment, ``airflow standalone``,
and one DAG run triggered and watched until it ends.

Every installation gets its own AIRFLOW_HOME (SQLite) and free ports on 127.0.0.1, so several can run
side by side; the servers run in their own process group and are stopped with the block that started
them, so no task process outlives it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow_delta_occ.ports import free_ports

from .metadata import query

#: How often the demo polls Airflow, and how long it stays quiet when nothing changes.
POLL_SECONDS = 1.0
HEARTBEAT_SECONDS = 15.0
#: How long an import error may stand while the DAG has not appeared before the run gives up.
IMPORT_ERROR_GRACE_SECONDS = 30.0

Progress = Callable[[str], None]


def airflow_env(home: Path, dags_folder: Path | str, **settings: str) -> dict[str, str]:
    """Environment of a throwaway Airflow installation in ``home`` running the LocalExecutor.

    Every server gets its own free port on 127.0.0.1, so several installations (the demo, tests)
    can run side by side; ``settings`` adds or overrides variables (``AIRFLOW__CORE__PARALLELISM``).
    """
    bin_dir = str(Path(sys.executable).parent)
    api_port, worker_logs, trigger_logs = free_ports(3)   # together: picked one by one, two could be one port
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{api_port}/execution/",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(worker_logs),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(trigger_logs),
        **settings,
    }


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
            stop_process_group(server)


def stop_process_group(process: subprocess.Popen[Any]) -> None:
    """Stop a server started with ``start_new_session=True`` and every process it started: SIGTERM to its
    group, SIGKILL after 60 s."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)


# Task instance states, grouped for a newcomer; the groups print in this order.
_STATE_GROUPS = {
    "success": "done", "running": "running", "queued": "queued", "scheduled": "queued",
    "up_for_retry": "retrying", "up_for_reschedule": "retrying", "deferred": "deferred",
    "restarting": "retrying", "failed": "FAILED", "upstream_failed": "not run (upstream failed)",
    "skipped": "skipped", None: "waiting", "": "waiting", "none": "waiting",
}
_GROUP_ORDER = ["done", "running", "queued", "retrying", "deferred", "waiting", "FAILED",
                "not run (upstream failed)", "skipped"]


def _map_index(task: dict[str, Any]) -> int | None:
    value = task.get("map_index")
    return None if value in (None, "", -1, "-1") else int(value)


def _task_groups(tasks: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """``[("done", "seed_table"), ("running", "merge_de, merge_fr"), ("running", "merge[0,2]"), ...]``."""
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
    """``done: seed_table | running: merge_de, merge[0,2] | ...`` (mapped tasks grouped)."""
    return " | ".join(f"{group}: {names}" for group, names in _task_groups(tasks)) or "no task instances yet"


def _still_line(tasks: Iterable[dict[str, Any]]) -> str:
    """The short line repeated while nothing changes: ``still running: merge_de, merge_fr``."""
    busy = [f"{group}: {names}" for group, names in _task_groups(tasks) if group in ("running", "queued", "retrying")]
    return "still " + (" | ".join(busy) if busy else "waiting for the scheduler")



def airflow_cli(env: Mapping[str, str], *args: str, timeout: float = 300.0) -> str:
    """Run ``airflow ARGS`` in the installation ``env`` names; its stdout. RuntimeError if it fails."""
    done = subprocess.run([sys.executable, "-m", "airflow", *args], env=dict(env), capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"airflow {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


@dataclass(frozen=True)
class DagRunOutcome:
    """How a DAG run ended: its state, its task instances (the CLI's JSON rows), its ``run_after``, and
    ``seconds`` from the trigger (the ``airflow dags trigger`` command starting) to the end (the watcher
    seeing the run finished, within POLL_SECONDS)."""

    state: str
    tasks: list[dict[str, Any]]
    run_after: str | None
    seconds: float | None = None


def run_dag(env: Mapping[str, str], work: Path, dag_id: str, run_id: str, *, timeout: float = 900.0,
            progress: Progress | None = None) -> DagRunOutcome:
    """Start Airflow (``airflow standalone``) in ``env``, trigger one run of ``dag_id``, wait until it ends.

    The run is manual and has no logical date (like the UI's trigger button). The wait reads the
    installation's SQLite database (``AIRFLOW_HOME/airflow.db``) once a second instead of calling the
    CLI, which costs seconds of CPU the Spark tasks need. ``progress`` (e.g. ``print``) gets a line when
    Airflow is up, whenever the run's task states change, and every ~15 s while they do not. Airflow's
    own output goes to ``work/airflow-standalone.log``.
    """
    db = Path(env["AIRFLOW_HOME"]) / "airflow.db"
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

        def alive() -> None:
            if server.poll() is not None:
                raise RuntimeError(f"Airflow stopped; see {work / 'airflow-standalone.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{dag_id} run {run_id} did not finish in {timeout:.0f} s; see {work}")

        say("starting Airflow: database, scheduler, DAG processor, triggerer, API server ...")
        waiting = f"waiting for Airflow to come up and parse {dag_id} ..."
        errors_since: float | None = None
        while not (db.exists() and query(db, "SELECT 1 FROM serialized_dag WHERE dag_id = ?", dag_id)):
            alive()
            errors = query(db, "SELECT filename, stacktrace FROM import_error") if db.exists() else []
            errors_since = (errors_since or time.monotonic()) if errors else None
            if errors_since is not None and time.monotonic() - errors_since > IMPORT_ERROR_GRACE_SECONDS:
                shown = "\n".join(f"{e['filename']}:\n{str(e['stacktrace'])[-2000:]}" for e in errors)
                raise RuntimeError(f"{dag_id} did not appear and Airflow reports import errors:\n{shown}")
            say(waiting, repeat=waiting)
            time.sleep(1)
        say(f"Airflow is up and has parsed {dag_id}")
        airflow_cli(env, "dags", "unpause", dag_id)
        triggered = time.monotonic()
        airflow_cli(env, "dags", "trigger", dag_id, "-r", run_id)
        say(f"triggered run '{run_id}' (manual, no logical date)")
        while True:
            alive()
            time.sleep(POLL_SECONDS)
            runs = query(db, "SELECT state, run_after FROM dag_run WHERE dag_id = ? AND run_id = ?", dag_id, run_id)
            tasks = task_instances(db, dag_id, run_id)
            if runs and runs[0]["state"] in ("success", "failed"):
                seconds = time.monotonic() - triggered
                break
            say(task_states_line(tasks), repeat=_still_line(tasks))
        state, run_after = str(runs[0]["state"]), runs[0]["run_after"]
        say(f"run {state}: {task_states_line(tasks)}")
        return DagRunOutcome(state=state, tasks=tasks, run_after=_iso(run_after), seconds=round(seconds, 1))


def task_instances(db: Path, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    """The run's task instances as rows: task_id, map_index, state, try_number, start_date, end_date
    (ISO 8601 in UTC)."""
    rows = query(db, "SELECT task_id, map_index, state, try_number, start_date, end_date FROM task_instance "
                     "WHERE dag_id = ? AND run_id = ? ORDER BY task_id, map_index", dag_id, run_id)
    return [{**r, "start_date": _iso(r["start_date"]), "end_date": _iso(r["end_date"])} for r in rows]


def _iso(value: Any) -> str | None:
    """A timestamp as Airflow's SQLite database holds it (naive, UTC), as ISO 8601 with its zone."""
    if not value:
        return None
    parsed = datetime.fromisoformat(str(value))
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).isoformat()
