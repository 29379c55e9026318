"""Spark servers the tests start on 127.0.0.1 from the pyspark package's own launchers, once per module.

A platform runs Spark as a standing service (a standalone cluster, a Spark Connect server), and the
tiers that test those modes start one the same way: ``spark-submit`` / ``spark-class`` from the
virtualenv, logs in a folder the failure message names, stopped (SIGTERM, then SIGKILL) at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow_delta_occ.demo import free_port

BIN = Path(sys.executable).parent
STARTUP_SECONDS = 180
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent)


def spark_env(logs: Path) -> dict[str, str]:
    """Environment for Spark's launchers and for SparkSubmitHook (which runs ``spark-submit`` from PATH)."""
    return {**os.environ, "SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(logs),
            "SPARK_WORKER_DIR": str(logs), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


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
    """A Spark Connect server (``local[2]``) with ``confs`` (delta-spark's, and any test LogStore).

    Yields ``{"url": "sc://127.0.0.1:PORT", "ui": UI_PORT, "logs": logs}``.
    """
    port, ui = free_port(), free_port()
    settings = {**confs, "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(port), "spark.ui.port": str(ui)}
    args = [str(BIN / "spark-submit"), "--class", CONNECT_SERVER_CLASS, "--master", "local[2]"]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    server = spawn([*args, "spark-internal"], spark_env(logs), logs / "server.log")
    try:
        wait_for(lambda: "Spark Connect server started" in (logs / "server.log").read_text(),
                 "the Spark Connect server", logs, [server])
        yield {"url": f"sc://127.0.0.1:{port}", "ui": ui, "logs": logs}
    finally:
        stop(server)
