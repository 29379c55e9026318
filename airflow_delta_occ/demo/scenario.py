"""The demo's scenario: ``dags_examples/delta_conflict_pool.py`` in a throwaway Airflow with a conflict pool.

Sets up what a platform team sets up (a pool file with the pool ``demo`` covering the demo's lake, a
SQLite lease store named by the ``delta_occ_leases`` connection, the pool's Airflow pool through
``airflow delta-occ pools sync``, a Spark Connect server named by the ``delta_occ_default``
connection), runs the DAG once under a real scheduler, and gathers what the parts recorded: the task
instances, each task's result (XCom), the pool's audit and the table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_delta_occ.jobs.result import JobResult
from airflow_delta_occ.pools.story import PoolStory

from .airflow_run import DagRunOutcome, Progress, airflow_cli, airflow_env, run_dag
from .metadata import xcom
from .spark_server import DemoSpark, demo_spark

DAG_ID = "delta_conflict_pool"
DAG_FILE = f"{DAG_ID}.py"
RUN_ID = "demo"
POOL = "demo"
#: Airflow's task slots: every writer of the DAG can start at once (the pool decides who waits).
PARALLELISM = 8


def check_dags_folder(dags_folder: Path | str) -> Path:
    """The folder as an absolute path; FileNotFoundError unless it holds the demo's DAG file."""
    folder = Path(dags_folder).expanduser().resolve()
    if not (folder / DAG_FILE).is_file():
        raise FileNotFoundError(
            f"{folder} does not hold {DAG_FILE}. Run the demo from the repository root (the DAGs are in "
            f"dags_examples/) or pass --dags-folder PATH/TO/dags_examples.")
    return folder


def demo_env(work: Path, dags_folder: Path | str, spark: DemoSpark | None = None) -> dict[str, str]:
    """The throwaway installation: Airflow home, lake, pool file and lease store all under ``work``; the
    provider's jobs run where ``spark`` says (embedded without it)."""
    lake = work / "lake"
    pools = work / "pools.toml"
    # ``sales`` serves the other example DAGs of the folder (delta_conflict_sensor names it): without
    # it, their import would fail in the demo's Airflow.
    pools.write_text(f"[pools.{POOL}]\n"
                     f"tables = [{json.dumps(str(lake / 'orders'))}]\n"
                     'model = "delta"\nlease_ttl = "10m"\nheartbeat = "10s"\n'
                     'description = "the demo: writers of the orders table wait only for writers they conflict with"\n'
                     "[pools.sales]\n"
                     f"tables = [{json.dumps(str(lake / 'sales'))}]\n")
    leases = json.dumps({"conn_type": "delta_occ_leases", "extra": {"url": f"sqlite:///{work / 'leases.db'}"}})
    return airflow_env(work / "airflow", check_dags_folder(dags_folder), DELTA_OCC_DEMO_ROOT=str(lake),
                       DELTA_OCC_DEMO_POOL=POOL, AIRFLOW__DELTA_OCC__POOL_FILE=str(pools),
                       AIRFLOW_CONN_DELTA_OCC_LEASES=leases, AIRFLOW__CORE__PARALLELISM=str(PARALLELISM),
                       **(spark.connection_env() if spark is not None else {}))


@dataclass(frozen=True)
class DemoRun:
    """What one demo run left: the DAG run, each Delta task's result, the pool's story, the table and
    where Spark ran."""

    outcome: DagRunOutcome
    table: str
    results: dict[str, JobResult]
    leases: dict[str, str]          # request id -> the task that held it
    story: PoolStory
    checked: dict[str, list[float]] | None   # check_table's rows and sum per country
    work: Path
    spark: DemoSpark


def run_demo(work: Path, *, dags_folder: Path | str, spark: str = "connect", timeout: float = 1500.0,
             progress: Progress | None = None) -> DemoRun:
    """Set the installation up, run the DAG once under the scheduler, and gather what it recorded.

    ``spark="connect"`` (the default) starts one local Spark Connect server first, which every task's
    job shares, and stops it at the end; ``"embedded"`` lets each task start its own Spark session.
    """
    check_dags_folder(dags_folder)
    with demo_spark(spark, work / "spark", progress=progress) as where:
        env = demo_env(work, dags_folder, where)
        (work / "airflow").mkdir(parents=True, exist_ok=True)
        airflow_cli(env, "db", "migrate")
        airflow_cli(env, "delta-occ", "pools", "sync")
        outcome = run_dag(env, work, DAG_ID, RUN_ID, timeout=timeout, progress=progress)
    db = work / "airflow" / "airflow.db"
    results: dict[str, JobResult] = {}
    leases: dict[str, str] = {}
    checked = None
    for task in outcome.tasks:
        value = xcom(db, DAG_ID, RUN_ID, task["task_id"])
        if not isinstance(value, dict):
            continue
        if task["task_id"] == "check_table":
            checked = value
            continue
        result = results[task["task_id"]] = JobResult.from_json(value)
        if result.lease is not None:
            leases[result.lease.request_id] = task["task_id"]
    from airflow_delta_occ.pools.leases.sql import SqlLeaseStore

    store = SqlLeaseStore(f"sqlite:///{work / 'leases.db'}")
    try:
        story = PoolStory.from_audit(store.history(pool=POOL, limit=100_000))
    finally:
        store.close()
    return DemoRun(outcome, str(work / "lake" / "orders"), results, leases, story, checked, work, where)


def task_rows(run: DemoRun) -> list[dict[str, Any]]:
    """The run's task instances in the order they started (mapped placeholders left out)."""
    return sorted((t for t in run.outcome.tasks if t.get("state") != "removed"),
                  key=lambda t: (t.get("start_date") or "~", t["task_id"]))
