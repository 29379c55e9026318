"""A local Spark Connect server on 127.0.0.1, started from pyspark's own ``spark-submit``.

One JVM (``local[2]`` by default) that every job of a local Airflow shares, instead of one embedded
JVM per task: ``make demo`` runs its DAG on one, and the tests' Connect tiers and the headline
benchmark start theirs with ``local_connect_server``.

``python -m airflow_delta_occ.spark.connect_server --logs DIR`` runs one with delta-spark (jars
from the per-user Ivy cache, see ``session``) until it gets SIGTERM or SIGINT; ``--ready-file``
names a file it writes, as JSON, once the server accepts sessions (URL, ports, log, start time).
Point a ``delta_occ`` connection at it with the extras ``{"mode": "connect", "connect_url": URL}``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_delta_occ.ports import free_ports

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: What the server logs once its gRPC endpoint is up.
READY_LINE = "Spark Connect server started"
STARTUP_SECONDS = 180.0
STOP_SECONDS = 30.0
LOG_NAME = "connect-server.log"

#: Settings for small local tables on two cores (what the embedded session uses too): a MERGE of a
#: few rows should not shuffle into Spark's 200 default partitions, nor a snapshot into Delta's 50.
SMALL_LOCAL_CONF: Mapping[str, str] = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.databricks.delta.snapshotPartitions": "2",
}


class ConnectServerError(RuntimeError):
    """The Spark Connect server did not start (its log names why)."""


@dataclass(frozen=True)
class ConnectServer:
    """A running server: where clients connect, where its UI and its log are, how long it took to start."""

    url: str                 # sc://127.0.0.1:PORT
    port: int
    ui_port: int | None      # None with spark.ui.enabled=false
    log: Path
    pid: int
    start_seconds: float     # launch to ready
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def ui_url(self) -> str | None:
        return f"http://127.0.0.1:{self.ui_port}" if self.ui_port is not None else None

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "port": self.port, "ui_port": self.ui_port, "ui_url": self.ui_url,
                "log": str(self.log), "pid": self.pid, "start_seconds": self.start_seconds}


def spark_home() -> Path:
    """The pyspark package's folder: a Spark distribution with ``bin/spark-submit`` and the jars."""
    import pyspark

    return Path(pyspark.__file__).parent


def launcher_env(logs: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for Spark's launchers (``spark-submit``, ``spark-class``) run from this virtualenv.

    Spark binds and advertises 127.0.0.1 and logs under ``logs``; the virtualenv's ``bin`` leads
    PATH, so ``spark-submit`` from PATH (as Airflow's SparkSubmitHook runs it) is pyspark's own.
    """
    base = os.environ if base is None else base
    bin_dir = str(Path(sys.executable).parent)
    return {**base, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(logs),
            "SPARK_WORKER_DIR": str(logs), "PATH": f"{bin_dir}{os.pathsep}{base.get('PATH', '')}",
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


@contextmanager
def local_connect_server(logs: Path, conf: Mapping[str, str], *, master: str = "local[2]",
                         port: int | None = None, ui_port: int | None = None, own_group: bool = True,
                         startup_seconds: float = STARTUP_SECONDS) -> Iterator[ConnectServer]:
    """A Spark Connect server with ``conf`` (delta-spark's: ``session.delta_submit_conf()``) while the block runs.

    It binds 127.0.0.1 on ``port`` (a free one by default) and, unless ``conf`` turns the UI off,
    serves its UI on ``ui_port`` (likewise). It runs in ``logs`` (its log, Spark's warehouse and
    Derby's files land there, not in the caller's folder) and in its own process group
    (``own_group``), stopped when the block ends: SIGTERM, SIGKILL after 30 s. With
    ``own_group=False`` it stays in the caller's group, for a launcher that is itself stopped as a
    group (``main``).

    Raises:
        ConnectServerError: it exited, or did not log that it started within ``startup_seconds``.
    """
    logs.mkdir(parents=True, exist_ok=True)
    spare = iter(free_ports(2, besides=(port, ui_port)))
    port = port or next(spare)
    ui_on = str(conf.get("spark.ui.enabled", "true")).lower() != "false"
    ui_port = (ui_port or next(spare)) if ui_on else None
    settings = {**conf, "spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": str(port),
                **({"spark.ui.port": str(ui_port)} if ui_port is not None else {})}
    args = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", master]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    log = logs / LOG_NAME
    started = time.monotonic()
    with open(log, "wb") as out:
        process = subprocess.Popen([*args, "spark-internal"], env=launcher_env(logs), cwd=logs, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=own_group)
    try:
        deadline = started + startup_seconds
        while READY_LINE not in log.read_text(errors="replace"):
            if process.poll() is not None:
                raise ConnectServerError(f"the Spark Connect server exited ({process.returncode}) before it "
                                         f"started; see {log}")
            if time.monotonic() > deadline:
                raise ConnectServerError(f"the Spark Connect server did not start in {startup_seconds:.0f} s; "
                                         f"see {log}")
            time.sleep(0.25)
        yield ConnectServer(url=f"sc://127.0.0.1:{port}", port=port, ui_port=ui_port, log=log, pid=process.pid,
                            start_seconds=round(time.monotonic() - started, 1), _process=process)
    finally:
        _stop(process, own_group)


def _stop(process: subprocess.Popen[bytes], own_group: bool) -> None:
    """SIGTERM (to its group when it has one: launchers may leave children), SIGKILL after STOP_SECONDS."""
    for sig, wait in ((signal.SIGTERM, STOP_SECONDS), (signal.SIGKILL, STOP_SECONDS)):
        if process.poll() is not None:
            return
        try:
            if own_group:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)
            process.wait(wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m airflow_delta_occ.spark.connect_server",
                                     description="Run a local Spark Connect server with delta-spark until "
                                                 "SIGTERM or SIGINT (Ctrl-C).")
    parser.add_argument("--logs", type=Path, required=True, help="folder for its log, warehouse and ready file")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--port", type=int, default=0, help="gRPC port (default: a free one)")
    parser.add_argument("--ui-port", type=int, default=0, help="Spark UI port (default: a free one)")
    parser.add_argument("--conf", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting (repeatable; overrides delta-spark's and the small-table defaults)")
    parser.add_argument("--ready-file", type=Path, help="write the server's URL, ports and log here, as JSON, "
                                                        "once it accepts sessions")
    args = parser.parse_args(argv)
    from airflow_delta_occ.spark.session import delta_submit_conf

    conf = {**delta_submit_conf(), **SMALL_LOCAL_CONF, **dict(args.conf)}
    # SIGTERM (how the demo stops its servers) ends the block below, which stops the JVM.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        with local_connect_server(args.logs.resolve(), conf, master=args.master, port=args.port or None,
                                  ui_port=args.ui_port or None, own_group=False) as server:
            if args.ready_file is not None:
                partial = args.ready_file.with_name(args.ready_file.name + ".part")
                partial.write_text(json.dumps(server.to_json()))
                partial.replace(args.ready_file)
            print(f"Spark Connect server at {server.url} (Spark UI {server.ui_url or 'off'}), started in "
                  f"{server.start_seconds:.1f} s; log {server.log}", flush=True)
            while server.running():
                time.sleep(1)
            raise SystemExit(f"the Spark Connect server stopped; see {server.log}")
    except KeyboardInterrupt:
        pass
    except ConnectServerError as exc:
        raise SystemExit(str(exc)) from exc


if __name__ == "__main__":
    main()
