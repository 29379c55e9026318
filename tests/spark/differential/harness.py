"""Run two real delta-spark transactions with a fixed interleaving: A reads, B commits, A commits.

``GateLogStore`` (Java, compiled by ``gate_jar()`` on first use and cached by source hash) holds the
commit of any transaction whose ``commitInfo.userMetadata`` carries a gate token. A runs in a thread
with the token set on its own SparkSession; once A is held, B runs to completion in the main thread;
then A is released and delta-spark's real conflict checker decides A's fate. The lines A tried to
commit are captured at the gate, so the engine can be fed exactly what A staged.

The same class can also be armed from a file (Hadoop conf ``occ.armed.dir``, see the Java source);
tests/airflow uses that, with the jar from ``gate_jar()``. Importing this module starts no Spark.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_delta_occ.retry.classify import classify_conflict
from airflow_delta_occ.spark.session import ivy_dir

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "GateLogStore.java")
CLASS_NAME = "airflowdeltaocc.testing.GateLogStore"
GATE_DIR = os.path.join(tempfile.gettempdir(), "airflow-delta-occ-gates")
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"


def gate_jar() -> str:
    """The path of ``GateLogStore.java`` compiled against the cached Delta and Spark jars.

    The jar is named by the source's hash: it is built once per source version and reused (also by
    other processes) while the source is unchanged. Needs no running Spark.
    """
    import pyspark

    with open(SOURCE, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()[:16]
    out_dir = os.path.join(os.path.dirname(ivy_dir()), "gate")
    jar = os.path.join(out_dir, f"gate-logstore-{digest}.jar")
    if os.path.exists(jar):
        return jar
    storage = glob.glob(os.path.join(ivy_dir(), "jars", "io.delta_delta-storage-*.jar"))
    if not storage:  # a fresh machine: fill the Ivy cache first (in a child, before our JVM starts)
        subprocess.run([sys.executable, "-m", "airflow_delta_occ.spark.session", "--resolve-jars"], check=True)
        storage = glob.glob(os.path.join(ivy_dir(), "jars", "io.delta_delta-storage-*.jar"))
    if not storage:
        raise RuntimeError(f"delta-storage jar not found under {ivy_dir()}/jars: resolve the Delta jars first")
    classpath = os.pathsep.join([*storage, os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")])
    build = tempfile.mkdtemp(prefix="gate-build-")
    try:
        javac = subprocess.run(["javac", "-d", build, "-cp", classpath, SOURCE], capture_output=True, text=True)
        if javac.returncode != 0:
            raise RuntimeError(f"javac failed to compile {SOURCE}:\n{javac.stdout}{javac.stderr}")
        os.makedirs(out_dir, exist_ok=True)
        tmp = f"{jar}.{uuid.uuid4().hex}.tmp"
        with zipfile.ZipFile(tmp, "w") as zf:
            for root, _, files in os.walk(build):
                for name in files:
                    full = os.path.join(root, name)
                    zf.write(full, os.path.relpath(full, build))
        os.replace(tmp, jar)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return jar


def gate_session_conf() -> dict[str, str]:
    """Spark confs that install the gate; a pure pass-through for commits without a token."""
    return {
        "spark.jars": gate_jar(),
        "spark.delta.logStore.class": CLASS_NAME,
        "spark.hadoop.occ.gate.dir": GATE_DIR,
        # Otherwise the held commit keeps the table's commit lock and the winner cannot commit.
        "spark.databricks.delta.commitLock.enabled": "false",
    }


def classify(exc: BaseException | None) -> str | None:
    """delta-spark's conflict class name for an exception from PySpark, ``other:...`` for anything else."""
    if exc is None:
        return None
    kind = classify_conflict(exc)
    return kind.value if kind is not None else f"other:{type(exc).__name__}: {str(exc)[:300]}"


@dataclass
class Interleaved:
    """What happened: A's and B's outcome (``None`` = committed) and what A tried to commit."""

    a_outcome: str | None
    b_outcome: str | None
    a_staged: list[dict[str, Any]] | None
    a_error: BaseException | None
    b_error: BaseException | None


def run_interleaved(spark: Any, a: Callable[[Any], Any], b: Callable[[Any], Any], *,
                    timeout: float = 180.0) -> Interleaved:
    """Run ``a`` until it is about to commit, run ``b`` fully, then let ``a`` commit."""
    name = f"a-{uuid.uuid4().hex[:12]}"
    os.makedirs(GATE_DIR, exist_ok=True)
    reached = os.path.join(GATE_DIR, f"{name}.reached")
    release = os.path.join(GATE_DIR, f"{name}.release")
    session_a = spark.newSession()
    session_a.conf.set(USER_METADATA_CONF, f"occ-gate:{name}")
    session_b = spark.newSession()
    errors: dict[str, BaseException] = {}
    done = threading.Event()

    def run_a() -> None:
        try:
            a(session_a)
        except BaseException as exc:  # recorded, judged by the caller
            errors["a"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=run_a, name=f"txn-{name}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not os.path.exists(reached) and not done.is_set():
        if time.monotonic() > deadline:
            raise TimeoutError(f"transaction A never reached its commit within {timeout} s")
        time.sleep(0.02)
    staged = None
    if os.path.exists(reached):
        with open(reached, encoding="utf-8") as fh:
            staged = [json.loads(line) for line in fh if line.strip()]
    try:
        b(session_b)
    except Exception as exc:
        errors["b"] = exc
    finally:
        with open(release, "w"):
            pass
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError("transaction A did not finish after its release")
    for path in (reached, release):
        if os.path.exists(path):
            os.remove(path)
    return Interleaved(classify(errors.get("a")), classify(errors.get("b")), staged, errors.get("a"),
                       errors.get("b"))
