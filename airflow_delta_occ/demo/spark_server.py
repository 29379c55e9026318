"""Where the demo's Spark jobs run: one local Spark Connect server every task shares (``connect``, the
default), or an embedded Spark session started by each task (``embedded``, what a DAG gets without a
``delta_occ`` connection).

The server is ``python -m airflow_delta_occ.spark.connect_server`` (``local[2]``, delta-spark),
started as a program of its own the way the demo starts Airflow: in its own process group, stopped
with the block that started it. (``demo`` sits beside ``spark`` in the package's layers, so it runs
that module instead of importing it.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .airflow_run import Progress, stop_process_group

SPARK_MODES = ("connect", "embedded")
SERVER_MODULE = "airflow_delta_occ.spark.connect_server"
#: How long the demo waits for the server: the launcher's own limit (180 s) and its Python start.
READY_SECONDS = 240.0


@dataclass(frozen=True)
class DemoSpark:
    """The demo's Spark: ``mode``, and for ``connect`` the server's URL, UI, log, JVM and start time."""

    mode: str
    url: str | None = None
    ui_url: str | None = None
    log: Path | None = None
    pid: int | None = None               # the server's JVM
    start_seconds: float | None = None   # launch to ready, as the demo saw it

    def connection_env(self) -> dict[str, str]:
        """``AIRFLOW_CONN_DELTA_OCC_DEFAULT`` pointing the provider's jobs at the server (none when embedded)."""
        if self.mode != "connect":
            return {}
        extra = {"mode": "connect", "connect_url": self.url,
                 **({"spark_ui_url": self.ui_url} if self.ui_url else {})}  # the tasks' Spark UI link
        return {"AIRFLOW_CONN_DELTA_OCC_DEFAULT": json.dumps({"conn_type": "delta_occ", "extra": extra})}

    def describe(self) -> str:
        if self.mode != "connect":
            return "embedded Spark: each task starts its own Spark session (a JVM) with delta-spark"
        return (f"one Spark Connect server (local[2], delta-spark) at {self.url}, Spark UI {self.ui_url or 'off'}, "
                f"log {self.log}")


@contextmanager
def demo_spark(mode: str, logs: Path, *, progress: Progress | None = None) -> Iterator[DemoSpark]:
    """The demo's Spark while the block runs: for ``connect`` a local server, started now and stopped at the end.

    Raises:
        ValueError: an unknown mode.
        RuntimeError: the server did not start (the message names its logs).
    """
    if mode not in SPARK_MODES:
        raise ValueError(f"unknown Spark mode {mode!r}; use one of {', '.join(SPARK_MODES)}")
    if mode == "embedded":
        yield DemoSpark(mode)
        return
    logs.mkdir(parents=True, exist_ok=True)
    ready, launcher_log = logs / "ready.json", logs / "launcher.log"
    if progress is not None:
        progress("starting one Spark Connect server (local[2], delta-spark) for every task ...")
    started = time.monotonic()
    with open(launcher_log, "wb") as out:
        command = [sys.executable, "-m", SERVER_MODULE, "--logs", str(logs), "--ready-file", str(ready)]
        launcher = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while not ready.exists():
            if launcher.poll() is not None or time.monotonic() - started > READY_SECONDS:
                tail = launcher_log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the Spark Connect server did not start; see {logs}:\n{tail}")
            time.sleep(0.2)
        server = json.loads(ready.read_text())
        spark = DemoSpark("connect", url=server["url"], ui_url=server["ui_url"], log=Path(server["log"]),
                          pid=int(server["pid"]), start_seconds=round(time.monotonic() - started, 1))
        if progress is not None:
            progress(f"Spark Connect server ready in {spark.start_seconds:.0f} s at {spark.url} "
                     f"(Spark UI {spark.ui_url or 'off'})")
        yield spark
    finally:
        stop_process_group(launcher)
