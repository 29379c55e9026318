"""Spark servers the tests start on 127.0.0.1 from the pyspark package's own launchers, once per module.

A platform runs Spark as a standing service (a standalone cluster, a Spark Connect server), and the
tiers that test those modes start one the same way: ``spark-submit`` / ``spark-class`` from the
virtualenv, logs in a folder the failure message names, stopped (SIGTERM, then SIGKILL) at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

from airflow_delta_occ.spark.connect_server import SMALL_LOCAL_CONF, STARTUP_SECONDS, launcher_env, local_connect_server

BIN = Path(sys.executable).parent
#: For JVMs that live seconds (a submitted job's driver and executor): the client compiler only, and the
#: serial collector. C2's compiler threads and the parallel collector's threads compete with the job on two
#: cores and pay off only in a JVM that runs for minutes (measured: a submitted refusal test, 61 -> 45 s).
SHORT_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: A test's submitted application, for tables of a few rows on two cores: Delta's snapshot and Spark's
#: shuffle partitions of the embedded session (50 and 200 tiny tasks cost a submitted job about 20 s on one
#: executor core), one executor core on a standalone cluster (ignored by ``local[N]``), no UI, and the short
#: JVMs' options. Test settings, not the provider's: a platform's cluster has its own. A test's own
#: settings go after these.
SMALL_SUBMIT_CONF: Mapping[str, str] = MappingProxyType({
    **SMALL_LOCAL_CONF, "spark.executor.memory": "1g", "spark.cores.max": "1", "spark.ui.enabled": "false",
    "spark.driver.extraJavaOptions": SHORT_JVM_OPTIONS, "spark.executor.extraJavaOptions": SHORT_JVM_OPTIONS})


def spark_env(logs: Path) -> dict[str, str]:
    """Environment for Spark's launchers and for SparkSubmitHook (which runs ``spark-submit`` from PATH)."""
    return launcher_env(logs)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def airflow_api_answers(port: int) -> bool:
    """Whether the Airflow API server on ``port`` answers its health check (a task process that finds no
    API server fails its try, so tests start tasks only once it does)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def wait_for(ready: Callable[[], bool], what: str, logs: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """Poll ``ready`` until it holds; RuntimeError naming the logs if a process exits or time runs out."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        try:
            if ready():
                return
        except OSError:
            pass
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start; see the logs in {logs}")
        time.sleep(0.5)


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def spawn(args: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, env=dict(env), stdout=open(log, "w"), stderr=subprocess.STDOUT)


@contextmanager
def connect_server(logs: Path, confs: Mapping[str, str]) -> Iterator[dict[str, Any]]:
    """A Spark Connect server (``local[2]``) with ``confs`` (delta-spark's, and any test LogStore) over
    ``SMALL_LOCAL_CONF``, as ``make demo`` starts it: the package's ``local_connect_server``. Without the
    small partition counts every job on a table of a few files runs dozens of tiny tasks (Delta's 50
    snapshot partitions, Spark's 200 shuffle partitions): the Celery e2e test took 737 s with those and
    457 s with 2 of each, here (one run each).

    Yields ``{"url": "sc://127.0.0.1:PORT", "ui": UI_PORT, "logs": logs}`` (``ui`` None with the UI off).
    """
    with local_connect_server(logs, {**SMALL_LOCAL_CONF, **confs}) as server:
        yield {"url": server.url, "ui": server.ui_port, "logs": logs}


def partition_settings(confs: Mapping[str, str]) -> str:
    """How ``connect_server(logs, confs)`` splits work, for a benchmark's report: its shuffle and Delta
    snapshot partitions (the figures depend on them)."""
    merged = {**SMALL_LOCAL_CONF, **confs}
    return (f"shuffle partitions {merged['spark.sql.shuffle.partitions']}, "
            f"Delta snapshot partitions {merged['spark.databricks.delta.snapshotPartitions']}")
