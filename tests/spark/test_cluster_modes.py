"""The same jobs through ``spark-submit`` to a real standalone cluster and through a real Spark Connect server.

Both run on 127.0.0.1 from the pyspark package's own launchers: a standalone master and worker
(``spark-class``), and a Connect server (``spark-submit --class ...SparkConnectServer``) with
delta-spark and the test gate LogStore on its classpath. The example DAG runs through the Airflow
CLI with the ``delta_occ_default`` connection switched to Connect (spark-submit jobs are proven by
the races, the refusals and the kill test, which submit to the same cluster), and the gated MERGE races of
the operator tier run with job A inside the cluster or the Connect server, so the conflict that
reaches the operator was raised by delta-spark there and classified from what crossed the wire:
the runner's result line for spark-submit, the error class for Connect.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.exceptions import (
    ConflictFailure,
    SourceNotFoundError,
    SourceOutsidePartitionsError,
    StatementRefusedError,
)
from airflow_delta_occ.hooks.delta import DeltaSparkHook
from airflow_delta_occ.jobs.result import JobResult
from airflow_delta_occ.jobs.spec import JobSpec
from airflow_delta_occ.retry.classify import ConflictKind
from airflow_delta_occ.spark.runner import RESULT_PREFIX
from airflow_delta_occ.spark.session import CONNECT_MODE_FLAG

from ..servers import SMALL_SUBMIT_CONF, get_json
from .jobs import (
    check_disjoint_merges,
    check_overlapping_merges,
    create_sales,
    delta_conn,
    merge_spec,
    race_merges,
    source,
)

REPO = Path(__file__).resolve().parents[2]


def _run_example_dag(tmp_path: Path, env: dict[str, str], delta_conn: dict[str, Any]) -> Path:
    """Run ``delta_concurrent_merges`` through the Airflow CLI; return the table it wrote."""
    env = {**env, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags_examples"), "DELTA_OCC_DEMO_ROOT": str(tmp_path / "lake"),
           "AIRFLOW_CONN_DELTA_OCC_DEFAULT": json.dumps({"conn_type": "delta_occ", "extra": delta_conn})}
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True)
    run = subprocess.run([sys.executable, "-m", "airflow", "dags", "test", "delta_concurrent_merges", "2024-01-01"],
                         env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    table = tmp_path / "lake" / "sales"
    merges = [c.commit_info for c in DeltaLog.for_table(str(table)).history()
              if c.commit_info and c.commit_info.operation == "MERGE"]
    assert len(merges) == 4
    assert all(json.loads(m.user_metadata or "{}")["airflow"]["task_id"] == "merge_country" for m in merges)
    return table


def test_example_dag_through_spark_connect(connect_server: dict[str, Any], tmp_path: Path) -> None:
    table = _run_example_dag(tmp_path, dict(os.environ), {"mode": "connect", "connect_url": connect_server["url"]})
    # The table was created on the Connect server ...
    assert DeltaLog.for_table(str(table)).snapshot().metadata.configuration.get("delta.checkpointInterval") == "7"
    # ... and every MERGE ran there, each in its own Connect session.
    app = get_json(f"http://127.0.0.1:{connect_server['ui']}/api/v1/applications")[0]["id"]
    executions = get_json(f"http://127.0.0.1:{connect_server['ui']}/api/v1/applications/{app}/sql"
                           "?details=false&length=10000")
    merge_sessions = {e["description"].split('session_id: "')[1].split('"')[0]
                      for e in executions
                      if "MergeIntoCommand" in e["planDescription"] and str(table) in e["planDescription"]}
    assert len(merge_sessions) == 4, merge_sessions
    # Each MERGE task's "Spark UI" link opens the server's UI, which names the application the jobs ran in.
    with sqlite3.connect(tmp_path / "airflow" / "airflow.db") as db:
        links = [json.loads(v) for (v,) in db.execute(
            "SELECT value FROM xcom WHERE key = '_link_SparkUILink' AND task_id = 'merge_country'")]
        results = [json.loads(v) for (v,) in db.execute(
            "SELECT value FROM xcom WHERE key = 'return_value' AND task_id = 'merge_country'")]
    assert len(links) == 4 and len(set(links)) == 1, links
    assert links[0].endswith(f":{connect_server['ui']}"), links
    assert {r["spark_app_id"] for r in results} == {app}
    assert get_json(f"{links[0]}/api/v1/applications")[0]["id"] == app


def _hook_runner(conn_id: str) -> Callable[[Any, JobSpec], JobResult]:
    return lambda _session, spec: DeltaSparkHook(conn_id).run(spec)


@pytest.fixture(params=["spark-submit", "connect"])
def remote_runner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Runs job A through the hook in one of the remote modes."""
    return _hook_runner(delta_conn(request.param, request, monkeypatch))


def _outcome(run: Callable[[], Any]) -> tuple[str, str]:
    try:
        run()
    except Exception as exc:  # the class and message are what the test compares across modes
        return type(exc).__name__, str(exc)
    raise AssertionError("the job did not fail")


def test_the_same_failure_raises_the_same_error_in_every_mode(spark: Any, tmp_path: Path,
                                                              request: pytest.FixtureRequest,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing source, an unknown column and a fail-policy conflict: same class, same message, same
    Airflow decision, whether the job ran embedded, through spark-submit or over Spark Connect."""
    from airflow.sdk.definitions.retry_policy import RetryAction

    from airflow_delta_occ.operators.retry_policy import DeltaConflictRetryPolicy

    outcomes: dict[str, dict[str, tuple[str, str]]] = {}
    for i, mode in enumerate(("embedded", "spark-submit", "connect")):
        runner = _hook_runner(delta_conn(mode, request, monkeypatch))
        home = tmp_path / f"mode{i}"  # paths of one length: Spark's messages give positions in the statement
        sales = create_sales(spark, str(home / "sales"))
        src = source(spark, home, "de", [(1, 11, "2024-01-01", "DE")])
        missing = merge_spec(sales, "/nonexistent/landing/de", "DE", f"missing-{mode}", {})
        unknown = merge_spec(sales, src, "DE", f"unknown-{mode}", {}, merge_condition="t.id = s.no_such_column")
        before = DeltaLog.for_table(sales).latest_version()
        outcomes[mode] = {"missing source": _outcome(lambda: runner(spark, missing)),  # noqa: B023
                          "unknown column": _outcome(lambda: runner(spark, unknown))}  # noqa: B023
        fr = source(spark, home, "fr", [(3, 33, "2024-01-01", "FR")])
        race, _ = race_merges(spark, sales, src, fr, None, None, {"ConcurrentAppendException": "fail"}, run_a=runner)
        # Without partition predicates both MERGEs read the whole table for Delta: the real conflict,
        # classified in every mode (test_remote_injection_avoids_the_conflict relies on this race).
        assert isinstance(race.a_error, ConflictFailure) and race.a_error.kind is ConflictKind.APPEND, race.a_error
        assert race.b_error is None
        outcomes[mode]["fail-policy conflict"] = (type(race.a_error).__name__, str(race.a_error))
        assert DeltaLog.for_table(sales).latest_version() == before + 1  # only B committed
    assert outcomes["embedded"] == outcomes["spark-submit"] == outcomes["connect"], json.dumps(outcomes, indent=1)
    expected = {"missing source": "SourceNotFoundError", "unknown column": "StatementRefusedError",
                "fail-policy conflict": "ConflictFailure"}
    assert {k: v[0] for k, v in outcomes["embedded"].items()} == expected
    policy = DeltaConflictRetryPolicy("merge", {"ConcurrentAppendException": "fail"})
    for error in (SourceNotFoundError("x"), StatementRefusedError("x")):
        assert policy.evaluate(error, 1, 3).action is RetryAction.FAIL
    assert CONNECT_MODE_FLAG not in os.environ


def test_remote_injection_avoids_the_conflict(spark: Any, sales: str, tmp_path: Path, remote_runner: Any) -> None:
    """Two MERGEs into different partitions, with the injected predicates, both commit at their first attempt.
    The same race without them (the real conflict, classified) is run in both remote modes by
    test_the_same_failure_raises_the_same_error_in_every_mode."""
    check_disjoint_merges(spark, sales, tmp_path, remote_runner, conflict_first=False)
    # The worker is left as found: embedded and spark-submit jobs can follow in this process.
    assert CONNECT_MODE_FLAG not in os.environ


def _stamp(_logger: Any, _method: str, event: Any) -> Any:
    """A structlog processor: when this process received the line (the task log's own clock)."""
    event["received"] = time.time()
    return event


_DRIVER_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def test_remote_overlapping_merges_retry_to_the_serial_result(spark: Any, sales: str, tmp_path: Path,
                                                              remote_runner: Any, request: pytest.FixtureRequest,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The real conflict is retried in the job, and logged when it happens: its kind, the winning version
    and the backoff reach the task log before the retry; a spark-submit driver's lines reach it live,
    as the driver prints them, while the hook still reads the result from the same stream."""
    import structlog.testing

    mode = request.node.callspec.params["remote_runner"]
    finished: list[tuple[float, JobResult]] = []

    def run_a(session: Any, spec: JobSpec) -> JobResult:
        result = remote_runner(session, spec)
        finished.append((time.time(), result))  # spark-submit has exited (or the Connect job returned)
        return result

    caplog.set_level(logging.INFO, logger="airflow_delta_occ")
    with structlog.testing.capture_logs(processors=[_stamp]) as hook_lines:
        check_overlapping_merges(spark, sales, tmp_path, run_a)
    assert CONNECT_MODE_FLAG not in os.environ
    [(ended, result)] = finished
    # What reached the task log: the hook's lines (structlog, the driver's output in spark-submit
    # mode) and the provider's own loggers (stdlib: the in-job retry loop in Connect mode).
    received = [(float(e["received"]), str(e["event"])) for e in hook_lines] + \
        [(r.created, r.getMessage()) for r in caplog.records if r.name.startswith("airflow_delta_occ")]
    assert result.conflicts and len(result.conflicts) == result.attempts - 1
    for conflict in result.conflicts:
        assert conflict.winning_version is not None and conflict.action == "retry"
        expected = (f"{conflict.kind.value} on {sales} (attempt {conflict.attempt} of ",
                    f"winning version {conflict.winning_version}): retrying in {conflict.delay:.2f} s")
        logged = [(at, line) for at, line in received if all(part in line for part in expected)]
        assert len(logged) == 1, (expected, [line for _, line in received if "Concurrent" in line])
        at, line = logged[0]
        # Logged when it happened: before the backoff and the retry, not with the final result.
        assert ended - at >= conflict.delay, (ended, at, line)
        if mode == "spark-submit":
            # The driver printed it (with its own clock) and the hook logged it as it arrived.
            printed = _DRIVER_TIME.match(line)
            assert printed and "WARNING airflow_delta_occ.retry.policy: " in line, line
            lag = at - datetime.strptime(printed.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            assert -1.0 < lag < ended - at, (lag, line)
    if mode == "spark-submit":
        [(result_at, _)] = [(at, line) for at, line in received if line.startswith(RESULT_PREFIX)]
        [(conflict_at, _)] = [(at, line) for at, line in received if "retrying in" in line]
        # Streamed, not collected at exit: the backoff and the whole second attempt ran in the driver
        # between the conflict line and the result line reaching the log ...
        assert result_at - conflict_at >= result.conflicts[0].delay, (conflict_at, result_at, result.conflicts[0])
        # ... and Spark's own start-up lines arrived long before spark-submit exited.
        driver = [at for at, line in received if " INFO SparkContext: " in line]
        assert driver and ended - min(driver) > result.run_seconds / 2, (ended, driver, result.run_seconds)


def test_remote_refusal_comes_back_as_the_same_typed_error(spark: Any, sales: str, tmp_path: Path,
                                                           remote_runner: Any) -> None:
    """Source rows outside the partitions are refused on the remote side, before anything is written,
    and reach the operator as ``SourceOutsidePartitionsError`` in every mode (never retried)."""
    src = source(spark, tmp_path, "mixed", [(1, 11, "2024-01-01", "DE"), (3, 33, "2024-01-01", "FR")])
    spec = merge_spec(sales, src, "DE", "refused-run", {})
    before = DeltaLog.for_table(sales).latest_version()
    with pytest.raises(SourceOutsidePartitionsError, match="1 source row"):
        remote_runner(spark, spec)
    assert DeltaLog.for_table(sales).latest_version() == before


def test_the_connection_button_in_the_remote_modes(request: pytest.FixtureRequest,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The form's test button answers from the real servers: spark-submit's binary for the cluster's
    connection, and a SELECT 1 through the spark_connect connection."""
    for mode, expected in (("spark-submit", "spark://127.0.0.1"), ("connect", "answered SELECT 1")):
        ok, message = DeltaSparkHook(delta_conn(mode, request, monkeypatch)).test_connection()
        assert ok and expected in message, message


def test_connect_table_name_is_looked_up_in_the_servers_catalog(request: pytest.FixtureRequest, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``table_name=`` in Connect mode resolves in the Connect server's catalog: a table created there
    (and unknown to this process) is found, and a missing one raises ``TableNotFoundError``."""
    from airflow_delta_occ.engine.errors import TableNotFoundError

    hook = DeltaSparkHook(delta_conn("connect", request, monkeypatch))
    location = tmp_path / "only_on_the_server"
    with hook.job_session() as spark:
        spark.sql(f"CREATE TABLE default.only_on_connect (id INT) USING delta LOCATION '{location}'")
    try:
        assert hook.table_location("default.only_on_connect").rstrip("/").endswith(str(location))
        with pytest.raises(TableNotFoundError):
            hook.table_location("default.no_such_table_on_connect")
    finally:
        with hook.job_session() as spark:
            spark.sql("DROP TABLE IF EXISTS default.only_on_connect")


def test_spark_submit_table_name_is_looked_up_on_the_cluster(spark: Any, request: pytest.FixtureRequest,
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``table_name=`` in spark-submit mode resolves through the runner on the cluster (``--describe-table``),
    not in a Spark on the worker: a table registered only in the cluster's metastore (a Hive metastore on
    Derby that the jobs' drivers use, created by another application) is found there, though this
    process's catalog does not know it; a missing one raises ``TableNotFoundError``."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_delta_occ.engine.errors import TableNotFoundError
    from airflow_delta_occ.spark.session import delta_submit_conf

    conn_id = delta_conn("spark-submit", request, monkeypatch)
    metastore = {"spark.sql.catalogImplementation": "hive", "spark.sql.warehouse.dir": str(tmp_path / "warehouse"),
                 "spark.hadoop.javax.jdo.option.ConnectionURL":
                     f"jdbc:derby:;databaseName={tmp_path / 'metastore_db'};create=true"}
    conn = json.loads(os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"])
    conn["extra"]["spark_conf"].update(metastore)
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    location = tmp_path / "only_on_the_cluster"
    script = tmp_path / "register.py"
    create = f"CREATE TABLE default.only_on_the_cluster (id INT) USING delta LOCATION '{location}'"
    script.write_text(f"from pyspark.sql import SparkSession\nspark = SparkSession.builder.getOrCreate()\n"
                      f"spark.sql({create!r})\nspark.stop()\n")
    SparkSubmitHook(conn_id=conn["extra"]["spark_conn_id"], name="register-table", conf={
        **delta_submit_conf(), **SMALL_SUBMIT_CONF, **metastore}).submit(str(script))
    assert not spark.catalog.tableExists("default.only_on_the_cluster")  # this process's catalog
    hook = DeltaSparkHook(conn_id)
    assert hook.table_location("default.only_on_the_cluster").rstrip("/").endswith(str(location))
    with pytest.raises(TableNotFoundError, match="no_such_table_on_the_cluster"):
        hook.table_location("default.no_such_table_on_the_cluster")


@pytest.mark.parametrize("mode", ["spark-submit", "connect"])
def test_remote_statements_mean_what_was_rendered_whatever_the_spark_conf(spark: Any, tmp_path: Path, mode: str,
                                                                          request: pytest.FixtureRequest,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's ``spark_conf`` flips settings that change what SQL text means (on the submitted
    driver's SparkConf, or on the job's Connect session): the runner pins them for its statements,
    so a DELETE of a partition whose value holds a quote deletes exactly it and an overflow fails
    the job without writing (issue #20)."""
    from airflow_delta_occ.engine import DeltaLog as Log
    from airflow_delta_occ.jobs.spec import RunIdentity
    from airflow_delta_occ.operators.delta import DeltaDeleteOperator, DeltaUpdateOperator

    conn_id = delta_conn(mode, request, monkeypatch)
    flipped = {"spark.sql.parser.escapedStringLiterals": "true", "spark.sql.variable.substitute": "true",
               "spark.sql.ansi.enabled": "false"}
    hook = DeltaSparkHook(conn_id, spark_conf=flipped)  # over the connection's own spark_conf
    hostile = "x' OR 1=1 --"
    path = str(tmp_path / "people")
    spark.createDataFrame([(1, 1, "DE"), (2, 2, hostile)], "id INT, v INT, country STRING") \
        .write.format("delta").partitionBy("country").save(path)
    run = RunIdentity("people", "t", f"remote-{mode}")
    delete = DeltaDeleteOperator(task_id="d", table=path, partitions={"country": hostile})
    hook.run(delete.build_spec(Log.for_table(path).snapshot(), run))
    update = DeltaUpdateOperator(task_id="u", table=path, partitions={"country": "DE"}, set={"v": "v + 2147483647"})
    before = Log.for_table(path).latest_version()
    with pytest.raises(Exception, match=r"(?i)overflow"):
        hook.run(update.build_spec(Log.for_table(path).snapshot(), RunIdentity("people", "u", f"remote-{mode}")))
    assert Log.for_table(path).latest_version() == before
    assert sorted(tuple(r) for r in spark.read.format("delta").load(path).collect()) == [(1, 1, "DE")]
