"""A task killed mid-MERGE leaves no running Spark work, and the table at its old version, in every mode.

The MERGE is made slow inside its own Spark jobs: every row it inserts hashes a large string in
the executor (a slow insert clause put into the spec after the operator built it). The test waits
until the MERGE's jobs run (seen in the Spark UI's REST API of whichever process runs them), kills
the job, then checks:

* embedded: the job runs in a child process playing the task process: it runs the operator, and its
  SIGTERM handler calls ``on_kill`` as the Task SDK's does, in the thread waiting inside py4j.
  The child's Spark session must be stopped (its UI gone), the operator must raise
  ``JobKilledError``, and the MERGE's jobs must have ended failed (cancelled) in the child's event log;
* spark-submit (client mode, the standalone cluster): the driver process and the runner it started
  are gone, the master lists the application as finished and runs nothing;
* Spark Connect: the server runs no job afterwards, the MERGE's jobs ended failed (cancelled), and a new
  session on it works.

That the kill stopped the MERGE, rather than waited for it, is read from Spark's own record of each job's end
(failed, not succeeded), not from a clock: a slow machine delays the kill as much as the MERGE.

In every mode the table stays at the version it had before the MERGE (read from the Delta log by
the engine), also after a pause long enough for a straggling commit to land.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.demo import free_port
from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.expressions import Expr
from airflow_delta_occ.engine.sql_parser import parse_predicate
from airflow_delta_occ.exceptions import JobKilledError
from airflow_delta_occ.hooks.delta import DeltaSparkHook
from airflow_delta_occ.jobs.spec import JobSpec, MergeClause
from airflow_delta_occ.operators.delta import DeltaMergeOperator

from ..servers import SMALL_SUBMIT_CONF, get_json, spark_env
from .jobs import context, create_sales, merge_spec, rows, source

REPO = Path(__file__).resolve().parents[2]
# Measured here: a row costs about 0.1 s of CPU once the JIT is warm (1 s cold), so 40 rows took
# about 2 s on two cores, and a faster CI machine finished the MERGE before the kill landed. 1000
# rows keep it busy for about 50 s here: the kill always lands mid-MERGE. (Measured in the embedded
# session; the spark-submit job's executor runs the client JIT only, SHORT_JVM_OPTIONS, so it is slower still.)
SOURCE_ROWS = 1000
REPORT = "KILL_TEST_REPORT "
# What the JVM itself writes: log4j's console lines and Ivy's resolution.
JVM_LINE = re.compile(r"^(\d{2}/\d{2}/\d{2} \d{2}:\d{2}:\d{2} (INFO|WARN|ERROR)\b|:: resolv|\s+confs: \[default\])")


def _rendered(text: str) -> Expr:
    return parse_predicate(text)  # specs carry expressions as parse trees


# Each inserted row hashes 60 MB in the executor: slow Spark work inside the MERGE's own jobs, from
# a deterministic expression (Delta refuses non-deterministic ones in MERGE; the provider refuses
# reflect(), so no sleep).
SLOW_INSERT = MergeClause("not_matched_insert", set={
    "id": _rendered("s.id"), "date": _rendered("s.date"), "country": _rendered("s.country"),
    "v": _rendered("s.v + length(sha2(repeat(CAST(s.id AS STRING), 20000000), 512)) * 0")})


def slow(spec: JobSpec) -> JobSpec:
    return replace(spec, clauses=(SLOW_INSERT,))


class SlowMerge(DeltaMergeOperator):
    def build_spec(self, snapshot: Any, run: Any) -> JobSpec:
        return slow(super().build_spec(snapshot, run))


def _tables(spark: Any, tmp_path: Path) -> tuple[str, str, int, list[tuple[Any, ...]]]:
    sales = create_sales(spark, str(tmp_path / "sales"))
    src = source(spark, tmp_path, "src", [(100 + i, i, "2024-01-01", "DE") for i in range(SOURCE_ROWS)])
    return sales, src, DeltaLog.for_table(sales).latest_version(), rows(spark, sales)


def _running_jobs(ui: int) -> list[dict[str, Any]]:
    apps = get_json(f"http://127.0.0.1:{ui}/api/v1/applications")
    return [job for app in apps
            for job in get_json(f"http://127.0.0.1:{ui}/api/v1/applications/{app['id']}/jobs?status=running")]


def _job_statuses(ui: int) -> dict[int, str]:
    """Every job of the UI's applications: job id -> RUNNING, SUCCEEDED, FAILED (a cancelled job) or UNKNOWN."""
    apps = get_json(f"http://127.0.0.1:{ui}/api/v1/applications")
    return {job["jobId"]: job["status"] for app in apps
            for job in get_json(f"http://127.0.0.1:{ui}/api/v1/applications/{app['id']}/jobs")}


def _assert_cut_short(ends: dict[int, str], merge_jobs: list[dict[str, Any]], failed: str, running: str = "") -> None:
    """The MERGE's jobs (the one running at the kill and every later one) stopped, and one ended ``failed``: cancelled
    by the kill. Had the kill waited for the MERGE instead, they would all have ended succeeded (and committed)."""
    first = min(j["jobId"] for j in merge_jobs)
    merge = {job: end for job, end in ends.items() if job >= first}
    assert failed in merge.values() and (not running or running not in merge.values()), (merge_jobs, ends)


def _logged_job_results(event_log_dir: Path) -> dict[int, str]:
    """Job id -> ``JobSucceeded`` or ``JobFailed``, from the ``SparkListenerJobEnd`` events of the event logs under
    ``event_log_dir`` (one file per application, or Spark 4's rolling ``eventlog_v2_*`` folders of them)."""
    results = {}
    for log in sorted(path for path in event_log_dir.rglob("*") if path.is_file()):
        for line in log.read_text().splitlines():
            event = json.loads(line) if line.startswith("{") else {}
            if event.get("Event") == "SparkListenerJobEnd":
                results[event["Job ID"]] = event["Job Result"]["Result"]
    return results


def _wait_until_merge_runs(ui: int, alive: Callable[[], bool], timeout: float = 120.0) -> list[dict[str, Any]]:
    """The MERGE's running jobs once one of them has been busy for a moment (seen running a second apart): the
    MERGE's short jobs come first, and the kill is meant for its slow inserts."""
    deadline = time.monotonic() + timeout
    seen: set[int] = set()
    while time.monotonic() < deadline:
        assert alive(), "the job ended before it could be killed"
        try:
            jobs = [j for j in _running_jobs(ui) if j.get("numActiveTasks", 0) > 0 and "MERGE" in json.dumps(j)]
        except (OSError, urllib.error.URLError, ValueError):
            jobs = []  # the UI is not up yet
        busy = [j for j in jobs if j["jobId"] in seen]
        if busy:
            return busy
        seen = {j["jobId"] for j in jobs}
        time.sleep(1.0 if jobs else 0.2)
    raise AssertionError(f"the MERGE's jobs never showed up in the Spark UI on port {ui}")


def _ui_gone(ui: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            get_json(f"http://127.0.0.1:{ui}/api/v1/applications")
        except (OSError, urllib.error.URLError):
            return True
        time.sleep(0.3)
    return False


def _assert_table_unchanged(spark: Any, table: str, version: int, before: list[tuple[Any, ...]]) -> None:
    assert DeltaLog.for_table(table).latest_version() == version
    time.sleep(2)  # a commit still on its way would land now
    assert DeltaLog.for_table(table).latest_version() == version
    assert rows(spark, table) == before


def _run_in_thread(run: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = run()
        except BaseException as exc:  # judged by the test
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


# -- embedded: a child process plays the task process ----------------------------------------------
def _child(config: dict[str, Any]) -> None:
    """Run the slow MERGE as a task would, with the Task SDK's SIGTERM handling; print a report."""
    op = SlowMerge(task_id="merge_DE", table=config["table"], source=config["source"],
                   partitions={"date": "2024-01-01", "country": "DE"}, merge_condition="t.id = s.id",
                   spark_conf={"spark.ui.enabled": "true", "spark.ui.port": str(config["ui"]),
                               "spark.eventLog.enabled": "true", "spark.eventLog.dir": config["event_log"],
                               "spark.eventLog.compress": "false"})
    killed: list[float] = []

    def on_term(signum: int, frame: Any) -> None:  # as airflow.sdk.execution_time.task_runner._on_term
        killed.append(time.monotonic())
        op.on_kill()

    signal.signal(signal.SIGTERM, on_term)
    report: dict[str, Any] = {"error": None}
    try:
        op.execute(context("merge_DE", "kill-embedded"))
    except Exception as exc:
        report = {"error": type(exc).__name__, "message": str(exc)[:2000]}
    from pyspark import SparkContext

    report["seconds_after_kill"] = time.monotonic() - killed[0] if killed else None
    report["spark_context_stopped"] = SparkContext._active_spark_context is None
    print(REPORT + json.dumps(report), flush=True)


def test_embedded_kill_cancels_the_jobs_and_stops_the_session(spark: Any, tmp_path: Path) -> None:
    sales, src, version, before = _tables(spark, tmp_path)
    ui = free_port()
    env = {**spark_env(tmp_path), "AIRFLOW_CONN_DELTA_OCC_DEFAULT": json.dumps(
        {"conn_type": "delta_occ", "extra": {"mode": "embedded"}})}
    event_log = tmp_path / "event_log"
    event_log.mkdir()
    config = json.dumps({"table": sales, "source": src, "ui": ui, "event_log": event_log.as_uri()})
    log, errors = tmp_path / "child.log", tmp_path / "child.err"
    with open(log, "w") as out, open(errors, "w") as err:
        child = subprocess.Popen([sys.executable, "-m", "tests.spark.test_kill", config], cwd=REPO, env=env,
                                 stdout=out, stderr=err)
    try:
        merge_jobs = _wait_until_merge_runs(ui, lambda: child.poll() is None, timeout=180)
        child.send_signal(signal.SIGTERM)
        child.wait(60)
    finally:
        if child.poll() is None:
            child.kill()
    output, stderr = log.read_text(), errors.read_text()
    # The task log (issue #24): the JVM's lines reach logging at their own level, none on stderr (which Airflow
    # logs at ERROR), and what the JVM reports while it is being stopped is no error of the task's.
    jvm_on_stderr = [line for line in stderr.splitlines() if JVM_LINE.match(line)]
    assert jvm_on_stderr == [], jvm_on_stderr[:10]
    jvm_errors = [line for line in output.splitlines() if "[airflow_delta_occ.spark.jvm]" in line
                  and re.search(r"\[(error|critical)\s*\]", line)]
    assert jvm_errors == [], jvm_errors[:10]
    assert "Broken pipe" not in output + stderr, (output + stderr)[-5000:]
    reports = [json.loads(line[len(REPORT):]) for line in output.splitlines() if line.startswith(REPORT)]
    assert reports, output[-5000:]
    report = reports[0]
    assert report["error"] == "JobKilledError", report
    assert "stopped by on_kill" in report["message"]
    assert report["spark_context_stopped"], report
    # The kill cut the MERGE short (its inserts had about 50 s left here): a job of it ended failed in the child's
    # event log. How soon is bounded only by child.wait(60) above, a bound on hanging; the child's own clock
    # (seconds_after_kill) is in the report.
    _assert_cut_short(_logged_job_results(event_log), merge_jobs, "JobFailed")
    assert _ui_gone(ui)
    _assert_table_unchanged(spark, sales, version, before)


# -- spark-submit to the standalone cluster ----------------------------------------------------------
def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def test_spark_submit_kill_ends_the_driver_and_the_application(spark: Any, tmp_path: Path, standalone: dict[str, Any],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    sales, src, version, before = _tables(spark, tmp_path)
    for key, value in spark_env(standalone["logs"]).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_KILL", json.dumps(
        {"conn_type": "spark", "host": "spark://127.0.0.1", "port": standalone["port"],
         "extra": {"deploy-mode": "client"}}))
    ui = free_port()
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_KILL", json.dumps({"conn_type": "delta_occ", "extra": {
        "mode": "spark-submit", "spark_conn_id": "spark_kill", "spark_conf": {
            # Its own UI (the test watches the MERGE start there) and both cores, as before the small settings.
            **SMALL_SUBMIT_CONF, "spark.cores.max": "2", "spark.ui.enabled": "true", "spark.ui.port": str(ui)}}}))
    run_id = f"kill-submit-{time.monotonic_ns()}"
    spec = slow(merge_spec(sales, src, "DE", run_id, {}))
    hook = DeltaSparkHook("delta_occ_kill")
    thread, outcome = _run_in_thread(lambda: hook.run(spec))
    _wait_until_merge_runs(ui, thread.is_alive)
    running = hook._running
    assert running is not None and running.submit is not None
    assert _processes_with(run_id)  # spark-submit's JVM and the runner it started
    hook.on_kill()
    thread.join(60)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), JobKilledError), outcome
    assert running.submit._submit_sp.poll() is not None  # the driver JVM (client mode)
    deadline = time.monotonic() + 30
    while _processes_with(run_id) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not _processes_with(run_id), "a driver process outlived on_kill"
    assert _ui_gone(ui)
    master = get_json(f"http://127.0.0.1:{standalone['ui']}/json/")
    ours = [a for a in master.get("activeapps", []) + master.get("completedapps", [])
            if a.get("name") == f"delta-occ-{spec.run.dag_id}.{spec.run.task_id}"]
    assert ours and all(a in master.get("completedapps", []) for a in ours), master.get("activeapps")
    assert not master.get("activeapps"), master.get("activeapps")
    _assert_table_unchanged(spark, sales, version, before)


# -- Spark Connect -----------------------------------------------------------------------------------
def test_connect_kill_interrupts_the_operations_on_the_server(spark: Any, tmp_path: Path,
                                                              connect_server: dict[str, Any],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    sales, src, version, before = _tables(spark, tmp_path)
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_KILL", json.dumps(
        {"conn_type": "delta_occ", "extra": {"mode": "connect", "connect_url": connect_server["url"]}}))
    spec = slow(merge_spec(sales, src, "DE", "kill-connect", {}))
    hook = DeltaSparkHook("delta_occ_kill")
    thread, outcome = _run_in_thread(lambda: hook.run(spec))
    merge_jobs = _wait_until_merge_runs(connect_server["ui"], thread.is_alive)
    killed_at = time.monotonic()
    hook.on_kill()
    thread.join(60)
    assert not thread.is_alive()
    error = outcome.get("error")
    # The client sees the interruption (OPERATION_CANCELED) or, when the session was closed first,
    # NO_ACTIVE_SESSION: either way the job failed as killed.
    assert isinstance(error, JobKilledError), outcome
    # Only "did not hang": a server that ignored the kill would run the MERGE to its end (about 50 s here, longer
    # on a slower machine), and its jobs would then show SUCCEEDED below.
    while _running_jobs(connect_server["ui"]) and time.monotonic() < killed_at + 120:
        time.sleep(0.3)
    assert not _running_jobs(connect_server["ui"])
    # The server cut the MERGE short: a job of it ended failed (cancelled), and none runs.
    _assert_cut_short(_job_statuses(connect_server["ui"]), merge_jobs, "FAILED", running="RUNNING")
    with DeltaSparkHook("delta_occ_kill").job_session() as fresh:  # the server is fine; only the job stopped
        assert fresh.range(3).count() == 3
    _assert_table_unchanged(spark, sales, version, before)


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
