"""Task-level retries, idempotent retries and clears of Delta operators, in real Airflow runs.

Every scenario is a task of one run of ``tests/airflow/dags/delta_occ_task_retries.py``, run by
``airflow dags test``: Airflow's task runner, its retry policy handling and its retry scheduling
(``retry_delay``, a policy's delay override), one task at a time in one process, so one embedded
Spark application with delta-spark serves all tasks. The conflicts are real: the gate LogStore of
the spark tier (``tests/spark/differential/GateLogStore.java``, armed from a file here; its jar from
``harness.gate_jar()``) holds a task's commit while another writer commits to the same table, and
delta-spark's own conflict check decides. Then the append task is cleared with
``airflow tasks clear`` and a scheduler (LocalExecutor, with the API server) runs it again in the
same DAG run (``dags test`` would start a new run with a new run_id instead).

The evidence is what Airflow and Delta recorded: task instances and their earlier tries (the
metadata database and ``airflow tasks states-for-dag-run``), the operators' XCom results, the task
logs, the Delta logs (read by the engine) and the tables' rows (read from their data files).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from airflow_delta_occ.demo.airflow_run import stop_process_group
from airflow_delta_occ.demo.metadata import query as _query
from airflow_delta_occ.demo.metadata import xcom
from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.ports import free_ports

from ..servers import airflow_api_answers, wait_for
from ..spark.differential.harness import gate_jar
from .conftest import AIRFLOW

HERE = Path(__file__).resolve().parent
DAGS = HERE / "dags"
DAG_ID = "delta_occ_task_retries"
LOGICAL_DATE = "2024-01-01T00:00:00+00:00"
TASK_RETRIES = 3  # [delta_occ] task_retries, set by environment variable; the provider's default is 2
RUN_TIMEOUT = 600.0
FINISHED = {"success", "failed", "skipped", "upstream_failed"}
DELTA_TASKS = ("merge_exhausted", "merge_fail_policy", "bad_partitions", "append_then_lost")


# -- reading what Airflow recorded ----------------------------------------------------------------
_TI_COLUMNS = "task_id, state, try_number, max_tries, start_date, end_date, retry_delay_override, retry_reason"


def _task_instances(db: Path, run_id: str) -> dict[str, dict[str, Any]]:
    rows = _query(db, f"SELECT {_TI_COLUMNS} FROM task_instance WHERE dag_id = ? AND run_id = ?", DAG_ID, run_id)
    return {r["task_id"]: r for r in rows}


def _earlier_tries(db: Path, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """The tries before the current one of every task instance (Airflow's task_instance_history)."""
    rows = _query(db, f"SELECT {_TI_COLUMNS} FROM task_instance_history WHERE dag_id = ? AND run_id = ? "
                      "ORDER BY try_number", DAG_ID, run_id)
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["task_id"], []).append(r)
    return out


def _xcom(db: Path, run_id: str, task_id: str, dag_id: str = DAG_ID) -> Any:
    return xcom(db, dag_id, run_id, task_id)


def _tries_in_output(output: str) -> dict[tuple[str, int], str]:
    """The log lines of each try that ``airflow dags test`` ran (one task at a time), by (task_id, try)."""
    tries: dict[tuple[str, int], list[str]] = {}
    current: tuple[str, int] | None = None
    for line in output.splitlines():
        if started := re.search(r"\[DAG TEST\] starting task_id=(\S+)", line):
            task_id = started.group(1)
            current = (task_id, 1 + sum(1 for t, _ in tries if t == task_id))
            tries[current] = []
        if current is not None:
            tries[current].append(line)
        if re.search(r"\[DAG TEST\] end task task_id=", line):
            current = None
    return {key: "\n".join(lines) for key, lines in tries.items()}


def _json_list(text: str) -> list[dict[str, Any]]:
    """The JSON list a CLI printed (Airflow may print other lines before it)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(("[{", "[]")) or line == "[":
            return list(json.loads("\n".join(lines[i:])))
    raise AssertionError(f"no JSON list in CLI output: {text[-2000:]}")


def _when(value: str) -> datetime:
    return datetime.fromisoformat(value)


# -- reading what Delta recorded ------------------------------------------------------------------
def _commits(table: str) -> list[dict[str, Any]]:
    """Every commit, oldest first: version, operation and the parsed userMetadata."""
    out = []
    for commit in reversed(DeltaLog.for_table(table).history()):
        info = commit.commit_info
        if info is None:
            continue
        meta = json.loads(info.user_metadata) if info.user_metadata else {}
        out.append({"version": commit.version, "operation": info.operation, "meta": meta})
    return out


def _rows(table: str) -> list[tuple[Any, ...]]:
    """The table's rows, read from the data files of its newest snapshot."""
    import pyarrow.parquet as pq

    rows = []
    for add in DeltaLog.for_table(table).snapshot().files():
        data = pq.read_table(os.path.join(table, unquote(add.path))).to_pylist()
        rows += [(r["id"], r["v"]) for r in data]
    return sorted(rows)


def _airflow_tags(table: str, task_id: str) -> list[dict[str, Any]]:
    return [{**c["meta"]["airflow"], "version": c["version"], "operation": c["operation"]}
            for c in _commits(table) if c["meta"].get("airflow", {}).get("task_id") == task_id]


def _writer_commits(table: str) -> list[dict[str, Any]]:
    return [{**c["meta"]["concurrent_writer"], "version": c["version"], "operation": c["operation"]}
            for c in _commits(table) if "concurrent_writer" in c["meta"]]


# -- the Airflow run ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Run the DAG with ``airflow dags test``, clear the append task, let the scheduler run it again."""
    work = tmp_path_factory.mktemp("task_retries")
    home, lake = work / "airflow", work / "lake"
    home.mkdir()
    api_port, worker_logs, trigger_logs = free_ports(3)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{api_port}/execution/",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(worker_logs),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(trigger_logs),
        "AIRFLOW__DELTA_OCC__TASK_RETRIES": str(TASK_RETRIES),
        "DELTA_OCC_TEST_ROOT": str(lake),
        "DELTA_OCC_TEST_GATE_JAR": gate_jar(),
    }
    db = home / "airflow.db"
    tables = {n: str(lake / n) for n in ("exhausted", "fail_policy", "append")}
    started = time.monotonic()

    def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*AIRFLOW, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)

    migrate = cli("db", "migrate")
    assert migrate.returncode == 0, migrate.stdout[-3000:]
    # 1. Every scenario as a task of one run: `dags test` runs the tasks one at a time in one process
    #    (one Spark application for all) with Airflow's own retry handling. The run fails: two tasks must.
    test = cli("dags", "test", DAG_ID, LOGICAL_DATE[:10], timeout=RUN_TIMEOUT)
    (work / "dags-test.log").write_text(test.stdout)
    [dag_run] = _query(db, "SELECT run_id, state FROM dag_run WHERE dag_id = ?", DAG_ID)
    run_id = dag_run["run_id"]
    assert dag_run["state"] == "failed", f"see {work / 'dags-test.log'}"
    dags_test_seconds = round(time.monotonic() - started)
    before = {"tis": _task_instances(db, run_id), "xcom": _xcom(db, run_id, "append_then_lost"),
              "commits": _airflow_tags(tables["append"], "append_then_lost"), "rows": _rows(tables["append"])}

    # 2. A deliberate clear of the append task; the scheduler runs it again, in the same run.
    clear = cli("tasks", "clear", DAG_ID, "-t", "append_then_lost", "-s", LOGICAL_DATE[:10], "-e",
                LOGICAL_DATE[:10], "-y")
    assert clear.returncode == 0, clear.stdout[-3000:]
    after_clear = _task_instances(db, run_id)["append_then_lost"]
    deadline = time.monotonic() + RUN_TIMEOUT
    servers: list[subprocess.Popen[bytes]] = []
    try:
        # The scheduler (LocalExecutor) and the API server its task processes report to; the DAG is
        # already serialized (by `dags test`), so no DAG processor is needed. The scheduler starts only
        # once the API server answers: a task process that finds no API server fails its try, and on a
        # loaded machine the cleared task then ran as try 4 instead of 3.
        for name in ("api-server", "scheduler"):
            with open(work / f"airflow-{name}.log", "w") as log:
                servers.append(subprocess.Popen([*AIRFLOW, name], env=env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True))
            if name == "api-server":
                wait_for(lambda: airflow_api_answers(api_port),
                         "the API server", work, servers)
        while True:
            ti = _task_instances(db, run_id)["append_then_lost"]
            if ti["try_number"] > after_clear["try_number"] and ti["state"] in FINISHED:
                break
            assert all(s.poll() is None for s in servers), f"an Airflow server exited; see {work}/airflow-*.log"
            assert time.monotonic() < deadline, f"the cleared task did not run again: {ti}; see {work}"
            time.sleep(1)
    finally:
        for server in servers:
            stop_process_group(server)
    states = subprocess.run([*AIRFLOW, "tasks", "states-for-dag-run", DAG_ID, run_id, "-o", "json"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert states.returncode == 0, states.stderr[-3000:]
    logs = _tries_in_output(test.stdout)
    cleared_log = home / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}" / "task_id=append_then_lost" / "attempt=3.log"
    logs[("append_then_lost", 3)] = cleared_log.read_text(errors="replace") if cleared_log.exists() else ""
    print(f"\ndags test: {dags_test_seconds} s; clear and scheduler rerun: "
          f"{round(time.monotonic() - started) - dags_test_seconds} s")
    yield {
        "run_id": run_id, "tables": tables, "before_clear": before, "after_clear": after_clear,
        "tis": _task_instances(db, run_id), "earlier_tries": _earlier_tries(db, run_id),
        "xcom": {t: _xcom(db, run_id, t) for t in DELTA_TASKS}, "logs": logs,
        "cli_states": {t["task_id"]: t["state"] for t in _json_list(states.stdout)},
    }


# -- the scenarios --------------------------------------------------------------------------------
def test_delta_tasks_take_retries_from_the_provider_config(run: dict[str, Any]) -> None:
    """No Delta task sets retries: each has [delta_occ] task_retries (3 here); a plain task keeps 0."""
    first_tries = {t: (run["earlier_tries"].get(t) or [run["tis"][t]])[0] for t in DELTA_TASKS}
    assert {t: r["max_tries"] for t, r in first_tries.items()} == dict.fromkeys(DELTA_TASKS, TASK_RETRIES)
    assert run["tis"]["create_tables"]["max_tries"] == 0
    assert run["cli_states"]["create_tables"] == "success"


def test_conflict_that_exhausted_its_in_job_retries_is_retried_by_airflow(run: dict[str, Any]) -> None:
    ti = run["tis"]["merge_exhausted"]
    assert (ti["state"], ti["try_number"]) == ("success", 2)
    assert run["cli_states"]["merge_exhausted"] == "success"
    # Try 1: both in-job attempts met a real ConcurrentAppendException (a concurrent writer committed
    # while each was held at its commit), so the job gave up and Airflow's retry policy took over.
    log = run["logs"][("merge_exhausted", 1)]
    assert "ConcurrentAppendException after 2 attempt(s)" in log, log[-3000:]
    assert "action=retry" in log and "ConcurrentAppendException: retrying" in log, log[-3000:]
    [first] = run["earlier_tries"]["merge_exhausted"]
    assert first["try_number"] == 1
    assert first["retry_reason"] == "ConcurrentAppendException: retrying"
    # The delay is the conflict policy's backoff for try 1 (initial_delay 2 s, jitter 0), not the
    # task's retry_delay (Airflow's default, 300 s).
    assert first["retry_delay_override"] == pytest.approx(2.0)
    gap = (_when(ti["start_date"]) - _when(first["end_date"])).total_seconds()
    assert 2.0 <= gap < 120, gap

    table = run["tables"]["exhausted"]
    writer = _writer_commits(table)
    assert [(w["for"], w["commit"], w["operation"]) for w in writer] == [
        ("merge_exhausted", 1, "MERGE"), ("merge_exhausted", 2, "MERGE")]
    tags = _airflow_tags(table, "merge_exhausted")
    # Only try 2 committed, after both concurrent commits, in the same series of tries as try 1.
    assert [(t["operation"], t["try_number"], t["first_try"]) for t in tags] == [("MERGE", 2, 1)]
    assert tags[0]["version"] > writer[-1]["version"]
    result = run["xcom"]["merge_exhausted"]
    assert result["version"] == tags[0]["version"] and result["confirmed"] is True
    assert result["already_committed"] is False
    assert result["attempts"] == 1 and result["conflicts"] == []
    assert _rows(table) == [(1, "merged"), (2, "seed"), (3, "merged"), (101, "concurrent"), (102, "concurrent")]


def test_conflict_whose_policy_is_fail_fails_at_once(run: dict[str, Any]) -> None:
    ti = run["tis"]["merge_fail_policy"]
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 1, TASK_RETRIES)
    assert run["cli_states"]["merge_fail_policy"] == "failed"
    assert "merge_fail_policy" not in run["earlier_tries"]  # no retry was ever scheduled
    assert ("merge_fail_policy", 2) not in run["logs"]
    log = run["logs"][("merge_fail_policy", 1)]
    assert "ConcurrentAppendException after 1 attempt(s)" in log, log[-3000:]
    assert "action=fail" in log, log[-3000:]
    table = run["tables"]["fail_policy"]
    assert [(w["for"], w["commit"]) for w in _writer_commits(table)] == [("merge_fail_policy", 1)]
    assert _airflow_tags(table, "merge_fail_policy") == []  # the task's MERGE never committed
    assert _rows(table) == [(1, "seed"), (2, "seed"), (101, "concurrent")]


def test_bad_job_input_fails_at_once(run: dict[str, Any]) -> None:
    ti = run["tis"]["bad_partitions"]
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 1, TASK_RETRIES)
    assert "bad_partitions" not in run["earlier_tries"]
    assert ("bad_partitions", 2) not in run["logs"]
    log = run["logs"][("bad_partitions", 1)]
    assert "PartitionSpecError" in log and "action=fail" in log, log[-3000:]
    assert _airflow_tags(run["tables"]["append"], "bad_partitions") == []


def test_retry_after_a_commit_writes_nothing_again(run: dict[str, Any]) -> None:
    """Try 1 committed and then failed; try 2 (same series) found the commit and wrote nothing."""
    before = run["before_clear"]
    ti = before["tis"]["append_then_lost"]
    assert (ti["state"], ti["try_number"]) == ("success", 2)
    assert "simulated loss of the worker after the commit" in run["logs"][("append_then_lost", 1)]
    [first] = [t for t in run["earlier_tries"]["append_then_lost"] if t["try_number"] == 1]
    assert first["retry_delay_override"] is None  # not a conflict: the task's own retry_delay (1 s)
    [commit] = before["commits"]
    assert (commit["operation"], commit["try_number"], commit["first_try"]) == ("WRITE", 1, 1)
    result = before["xcom"]
    assert result["already_committed"] is True and result["confirmed"] is True
    assert result["version"] == commit["version"]
    assert before["rows"] == [(1, "appended"), (2, "appended")]


def test_clear_starts_a_new_series_that_writes_again(run: dict[str, Any]) -> None:
    cleared = run["after_clear"]
    assert (cleared["try_number"], cleared["max_tries"]) == (2, 2 + TASK_RETRIES)
    ti = run["tis"]["append_then_lost"]
    assert (ti["state"], ti["try_number"]) == ("success", 3)
    assert run["cli_states"]["append_then_lost"] == "success"
    assert "committed version" in run["logs"][("append_then_lost", 3)]  # run by the scheduler's executor
    commits = _airflow_tags(run["tables"]["append"], "append_then_lost")
    # first_try = max_tries - retries + 1 = 5 - 3 + 1: a new series, so a new txnAppId and a new commit.
    assert [(c["operation"], c["try_number"], c["first_try"]) for c in commits] == [("WRITE", 1, 1), ("WRITE", 3, 3)]
    result = run["xcom"]["append_then_lost"]
    assert result["already_committed"] is False and result["version"] == commits[1]["version"]
    assert _rows(run["tables"]["append"]) == [(1, "appended"), (1, "appended"), (2, "appended"), (2, "appended")]
