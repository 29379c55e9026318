"""The same DAG through spark-submit to a real Spark standalone cluster (master + worker on 127.0.0.1).

The master and worker are started from the pyspark package's own ``spark-class``; the example DAG
runs through the Airflow CLI with the ``delta_occ_default`` connection switched to ``spark-submit``,
so every MERGE is a separate Spark application on the cluster, submitted by
apache-airflow-providers-apache-spark's ``SparkSubmitHook``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.demo import free_port
from airflow_delta_occ.engine import DeltaLog

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _spark_home() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent)


def _master_state(ui_port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as response:
        return dict(json.loads(response.read()))


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    logs = tmp_path_factory.mktemp("standalone")
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = {**os.environ, "SPARK_HOME": _spark_home(), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(logs),
           "SPARK_WORKER_DIR": str(logs)}
    spark_class = str(BIN / "spark-class")
    master = subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(ui)], env=env,
                              stdout=open(logs / "master.log", "w"), stderr=subprocess.STDOUT)
    worker = subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                               "--webui-port", str(worker_ui), "--cores", "2", "--memory", "2g",
                               f"spark://127.0.0.1:{port}"], env=env,
                              stdout=open(logs / "worker.log", "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if any(w.get("state") == "ALIVE" for w in _master_state(ui).get("workers", [])):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standalone worker did not register; see {logs}")
            time.sleep(0.5)
        yield {"master": f"spark://127.0.0.1:{port}", "port": port, "ui": ui, "logs": logs}
    finally:
        for proc in (worker, master):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_example_dag_through_spark_submit(standalone: dict[str, Any], tmp_path: Path) -> None:
    home = tmp_path / "airflow"
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # SparkSubmitHook runs `spark-submit`
        "SPARK_HOME": _spark_home(),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags_examples"),
        "DELTA_OCC_DEMO_ROOT": str(tmp_path / "lake"),
        "AIRFLOW_CONN_SPARK_STANDALONE": json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1",
                                                     "port": standalone["port"],
                                                     "extra": {"deploy-mode": "client"}}),
        "AIRFLOW_CONN_DELTA_OCC_DEFAULT": json.dumps({"conn_type": "delta_occ", "extra": {
            "mode": "spark-submit", "spark_conn_id": "spark_standalone",
            "spark_conf": {"spark.executor.memory": "1g", "spark.cores.max": "2"}}}),
    }
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True)
    run = subprocess.run([sys.executable, "-m", "airflow", "dags", "test", "delta_concurrent_merges", "2024-01-01"],
                         env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]

    log = DeltaLog.for_table(str(tmp_path / "lake" / "sales"))
    merges = [c.commit_info for c in log.history() if c.commit_info and c.commit_info.operation == "MERGE"]
    assert len(merges) == 4
    assert all(json.loads(m.user_metadata or "{}")["airflow"]["task_id"] == "merge_country" for m in merges)
    apps = _master_state(standalone["ui"]).get("completedapps", []) + _master_state(standalone["ui"]).get(
        "activeapps", [])
    submitted = [a for a in apps if str(a.get("name", "")).startswith("delta-occ-delta_concurrent_merges")]
    assert len(submitted) >= 4, [a.get("name") for a in apps]
