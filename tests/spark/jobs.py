"""Shared pieces of the operator tests: a small sales table, sources, and a gated race of two MERGEs.

The race is the proof pattern of the operator tier: job A is held at its commit by the gate
LogStore while job B commits, so both read the same version, as two Airflow tasks racing on one
table would. A can run anywhere (this process, a spark-submit application, a Spark Connect
server); only its ``run_id`` must carry the gate token, which lands in ``commitInfo.userMetadata``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.exceptions import ConflictFailure
from airflow_delta_occ.jobs.result import JobResult
from airflow_delta_occ.jobs.spec import JobSpec, RunIdentity
from airflow_delta_occ.operators.delta import DeltaMergeOperator
from airflow_delta_occ.retry.classify import ConflictKind
from airflow_delta_occ.spark.runner import run_job

from ..servers import SMALL_SUBMIT_CONF, spark_env
from .differential.harness import USER_METADATA_CONF, Interleaved, gate_session_conf, run_interleaved

FAST = {"initial_delay": 0.0, "jitter": 0.0}
JobRunner = Callable[[Any, JobSpec], JobResult]


def run_checked(session: Any, spec: JobSpec) -> JobResult:
    """Run a job in this process as the embedded hook does: a failed job raises its typed error."""
    return run_job(session, spec).raise_for_status()


def context(task_id: str = "task", run_id: str = "manual__2024-01-01", try_number: int = 1,
            max_tries: int | None = None) -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="sales", task_id=task_id, map_index=-1, try_number=try_number)
    if max_tries is not None:
        ti.max_tries = max_tries
    return {"ti": ti, "run_id": run_id}


def create_sales(spark: Any, path: str) -> str:
    """Partitioned by (date, country); two rows per partition."""
    spark.sql(f"CREATE TABLE delta.`{path}` (id INT, v INT, date DATE, country STRING) USING delta "
              "PARTITIONED BY (date, country)")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 0, DATE'2024-01-01', 'DE'), (2, 0, DATE'2024-01-01', 'DE'), "
              "(3, 0, DATE'2024-01-01', 'FR'), (4, 0, DATE'2024-01-01', 'FR')")
    return path


def source(spark: Any, tmp_path: Any, name: str, rows: list[tuple[int, int, str, str]]) -> str:
    path = str(tmp_path / name)
    spark.createDataFrame(rows, "id INT, v INT, date STRING, country STRING") \
        .selectExpr("id", "v", "CAST(date AS DATE) AS date", "country").write.format("delta").save(path)
    return path


def rows(spark: Any, path: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.sql(f"SELECT id, v, country FROM delta.`{path}`").collect())


def merge(table: str, src: str, country: str | None, **kw: Any) -> DeltaMergeOperator:
    kw.setdefault("partitions", {"date": "2024-01-01", "country": country} if country else None)
    kw.setdefault("merge_condition", "t.id = s.id AND t.country = s.country")
    return DeltaMergeOperator(task_id=f"merge_{country}", table=table, source=src, **kw)


def merge_spec(table: str, src: str, country: str | None, run_id: str, policies: dict[str, Any],
               **kw: Any) -> JobSpec:
    op = merge(table, src, country, conflict_policies=policies, **kw)
    snapshot = DeltaLog.for_table(table).snapshot()
    return op.build_spec(snapshot, RunIdentity("sales", f"merge_{country}", run_id))


def race_merges(spark: Any, table: str, a_src: str, b_src: str, a_country: str | None, b_country: str | None,
                policies: dict[str, Any], *, run_a: JobRunner = run_checked) -> tuple[Interleaved, dict[str, Any]]:
    """MERGE A (through ``run_a``) held at its commit while MERGE B commits in this process."""
    results: dict[str, Any] = {}

    def job_a(session: Any) -> None:
        token = session.conf.get(USER_METADATA_CONF)  # the gate holds commits tagged with it
        results["a"] = run_a(session, merge_spec(table, a_src, a_country, token, policies))

    def job_b(session: Any) -> None:
        results["b"] = run_checked(session, merge_spec(table, b_src, b_country, "run-b", policies))

    return run_interleaved(spark, job_a, job_b), results


def check_disjoint_merges(spark: Any, sales: str, tmp_path: Any, run_a: JobRunner, *,
                          conflict_first: bool = True) -> None:
    """Two MERGEs into different partitions: a real conflict without injection, none with it.

    ``conflict_first=False`` leaves out the race without injection, for a caller whose other test runs
    that very race in the same mode (each race through spark-submit is a whole application).
    """
    de = source(spark, tmp_path, "de", [(1, 11, "2024-01-01", "DE")])
    fr = source(spark, tmp_path, "fr", [(3, 33, "2024-01-01", "FR")])
    fail_fast = {"ConcurrentAppendException": "fail"}
    if conflict_first:
        # Without partition predicates both MERGEs read the whole table for Delta: the real conflict.
        race, _ = race_merges(spark, sales, de, fr, None, None, fail_fast, run_a=run_a)
        assert isinstance(race.a_error, ConflictFailure) and race.a_error.kind is ConflictKind.APPEND
        assert rows(spark, sales) == [(1, 0, "DE"), (2, 0, "DE"), (3, 33, "FR"), (4, 0, "FR")]
    # With them, both commit at the first attempt.
    race, results = race_merges(spark, sales, de, fr, "DE", "FR", fail_fast, run_a=run_a)
    assert race.a_error is None and race.b_error is None
    assert results["a"].attempts == 1 and results["b"].attempts == 1
    assert rows(spark, sales) == [(1, 11, "DE"), (2, 0, "DE"), (3, 33, "FR"), (4, 0, "FR")]


def check_overlapping_merges(spark: Any, sales: str, tmp_path: Any, run_a: JobRunner) -> None:
    """Two MERGEs into one partition: A retries its ConcurrentAppendException to the serial result."""
    a_src = source(spark, tmp_path, "a", [(1, 100, "2024-01-01", "DE"), (5, 5, "2024-01-01", "DE")])
    b_src = source(spark, tmp_path, "b", [(1, 200, "2024-01-01", "DE"), (6, 6, "2024-01-01", "DE")])
    backoff = {**FAST, "initial_delay": 0.25}
    race, results = race_merges(spark, sales, a_src, b_src, "DE", "DE", {"ConcurrentAppendException": backoff},
                                run_a=run_a)
    assert race.a_error is None and race.b_error is None
    assert results["a"].attempts == 2
    assert results["a"].conflicts[0].kind is ConflictKind.APPEND
    assert results["a"].wait_seconds == 0.25 and results["a"].run_seconds > 0.25
    # Serial order: B, then A (A's retry re-read the table B changed, with the source read once).
    assert rows(spark, sales) == [(1, 100, "DE"), (2, 0, "DE"), (3, 0, "FR"), (4, 0, "FR"), (5, 5, "DE"),
                                  (6, 6, "DE")]


def delta_conn(mode: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ``delta_occ`` connection for ``mode`` (the gate jar on the remote side too); returns its id."""
    if mode == "spark-submit":
        cluster = request.getfixturevalue("standalone")
        for key, value in spark_env(cluster["logs"]).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_RACE", json.dumps(
            {"conn_type": "spark", "host": "spark://127.0.0.1", "port": cluster["port"],
             "extra": {"deploy-mode": "client"}}))
        extra: dict[str, Any] = {"mode": "spark-submit", "spark_conn_id": "spark_race", "spark_conf": {
            **SMALL_SUBMIT_CONF, **gate_session_conf()}}
    elif mode == "connect":
        # Through the Spark provider's spark_connect connection, as a platform team would set it up.
        port = request.getfixturevalue("connect_server")["url"].rsplit(":", 1)[1]
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_RACE", json.dumps(
            {"conn_type": "spark_connect", "host": "127.0.0.1", "port": int(port), "login": "delta-occ-tests"}))
        extra = {"mode": "connect", "spark_connect_conn_id": "spark_connect_race"}
    else:
        extra = {"mode": "embedded"}
    conn_id = f"delta_occ_{mode.replace('-', '_')}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "delta_occ", "extra": extra}))
    return conn_id
