"""Real local Spark with delta-spark for the ``spark`` tier: one session for the whole run.

Delta's jars come from Maven Central through Spark's Ivy resolution into a per-user cache
(``airflow_delta_occ.spark.session``). A missing Java or an unreachable repository fails the tier
loudly: a skipped real-Spark test proves nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.demo import free_port
from airflow_delta_occ.spark.session import delta_submit_conf, local_delta_session

from ..servers import BIN, get_json, spark_env, spawn, stop, wait_for
from ..servers import connect_server as connect_server_at
from .differential.harness import gate_session_conf
from .jobs import create_sales
from .tables import TableSpec, build_table

HERE = Path(__file__).resolve().parent
TABLE_SPECS = [
    TableSpec("partitioned_classic", partitioned=True, deletion_vectors=False, checkpoint="classic"),
    TableSpec("partitioned_dv_multipart_colmap", partitioned=True, deletion_vectors=True,
              checkpoint="multipart", column_mapping=True),
    TableSpec("unpartitioned_dv_v2json", partitioned=False, deletion_vectors=True, checkpoint="v2-json"),
    TableSpec("unpartitioned_v2parquet", partitioned=False, deletion_vectors=False, checkpoint="v2-parquet"),
]
# Set on the Connect server only: a table created there carries it, one created elsewhere does not.
CONNECT_MARKER = ("spark.databricks.delta.properties.defaults.checkpointInterval", "7")


@pytest.hookimpl(tryfirst=True)  # before tests/conftest.py checks that every test has its tier
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under this folder is in the ``spark`` tier (``make test-spark``: ``pytest tests -m spark``)."""
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    # The gate LogStore passes every commit through untouched unless a test sets its token.
    session = local_delta_session("airflow-delta-occ-tests", conf=gate_session_conf())
    yield session
    session.stop()


@pytest.fixture(scope="session")
def built_tables(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, TableSpec]]:
    """Every table of ``TABLE_SPECS`` built once per run: name -> (path, spec).

    Two at a time, each in its own session of the one SparkContext (its own SQL settings and temp
    views): a build is a hundred small statements whose time is mostly the driver's, so two threads
    use both cores and the fixture takes about half as long.
    """
    root = tmp_path_factory.mktemp("delta_tables")

    def build(spec: TableSpec) -> tuple[str, tuple[str, TableSpec]]:
        path = str(root / spec.name)
        history = build_table(spark.newSession(), path, spec)
        assert len(history) >= 25, history
        return spec.name, (path, spec)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(build, TABLE_SPECS))


@pytest.fixture
def sales(spark: Any, tmp_path: Any) -> str:
    """A small table partitioned by (date, country), two rows per partition (see ``jobs.create_sales``)."""
    return create_sales(spark, str(tmp_path / "sales"))


@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A standalone master and worker on 127.0.0.1, started once for every module that submits to it."""
    logs = tmp_path_factory.mktemp("standalone")
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env, spark_class = spark_env(logs), str(BIN / "spark-class")
    master = spawn([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(port), "--webui-port", str(ui)], env, logs / "master.log")
    worker = spawn([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                    "--webui-port", str(worker_ui), "--cores", "2", "--memory", "2g",
                    f"spark://127.0.0.1:{port}"], env, logs / "worker.log")
    try:
        wait_for(lambda: any(w.get("state") == "ALIVE"
                             for w in get_json(f"http://127.0.0.1:{ui}/json/").get("workers", [])),
                 "the standalone master and worker", logs, [master, worker])
        yield {"port": port, "ui": ui, "logs": logs, "env": env}
    finally:
        stop(worker, master)


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A Spark Connect server with delta-spark and the gate LogStore, as a platform team would run one
    (started once for every module that uses it)."""
    logs = tmp_path_factory.mktemp("connect")
    # One transaction per MERGE statement (delta-spark's re-run after a lost materialised source off), so the
    # server's MERGEs can be watched for early abort (docs/early-abort.md).
    with connect_server_at(logs, {**delta_submit_conf(), **gate_session_conf(),
                                  CONNECT_MARKER[0]: CONNECT_MARKER[1],
                                  "spark.databricks.delta.merge.materializeSource.maxAttempts": "1"}) as server:
        yield server
