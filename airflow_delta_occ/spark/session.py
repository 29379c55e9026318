"""A local SparkSession with delta-spark, jars resolved from Maven Central and cached per user.

The delta-spark wheel ships no jars: the JVM side is ``io.delta:delta-spark_<spark major.minor>_2.13``
at the wheel's version. Spark's ``spark.jars.packages`` resolves it (and its dependencies) with
Ivy; pointing ``spark.jars.ivy`` at a persistent per-user folder makes every run after the first
start without network access.

``python -m airflow_delta_occ.spark.session --resolve-jars`` fills the cache ahead of time (CI does
this before the timed tests).
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# pyspark's Connect client marks the whole process with these; classic sessions and spark-submit
# children started afterwards would take the Connect path.
CONNECT_MODE_FLAG = "SPARK_CONNECT_MODE_ENABLED"
INHERITED_CONNECT_ENV = (CONNECT_MODE_FLAG, "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")

IVY_DIR_ENV = "DELTA_OCC_IVY_DIR"
DEFAULT_IVY_DIR = os.path.join(os.path.expanduser("~"), ".cache", "airflow-delta-occ", "ivy")

DELTA_SESSION_CONF: Mapping[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def ivy_dir() -> str:
    return os.environ.get(IVY_DIR_ENV, DEFAULT_IVY_DIR)


def delta_maven_coordinates() -> str:
    """The delta-spark artifact matching the installed pyspark and delta-spark wheels.

    Asked of delta-spark's own helper (``configure_spark_with_delta_pip``), which knows how its
    artifact is named for each Spark version; it configures a builder, read back without starting
    anything, so ``spark-submit`` gets the same artifact as the embedded session.
    """
    from delta.pip_utils import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    builder = configure_spark_with_delta_pip(SparkSession.Builder())
    return str(builder._options["spark.jars.packages"])


def delta_submit_conf() -> dict[str, str]:
    """Spark confs that give a submitted application delta-spark (jars from the same Ivy cache)."""
    return {
        "spark.jars.packages": delta_maven_coordinates(),
        "spark.jars.ivy": ivy_dir(),
        "spark.sql.session.timeZone": "UTC",
        **DELTA_SESSION_CONF,
    }


def local_delta_session(
    app_name: str = "airflow-delta-occ",
    *,
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or reuse) a local SparkSession with Delta enabled and small, test-friendly settings.

    Timestamps are handled in UTC so partition values written by Spark read back the same in the
    engine. ``delta.exceptions.captured`` is imported when present so conflicts arrive as
    ``delta.exceptions`` classes instead of raw ``Py4JJavaError``.

    Secret confs (``spark.storage.is_secret_conf``: storage keys, OpenLineage transport credentials)
    never reach the JVM's command line, which every local user can read (``ps``): see
    ``_launch_jvm_without_secrets``. They still reach the SparkContext's ``SparkConf``, where Spark
    derives the Hadoop configuration from ``spark.hadoop.*`` and listeners read their settings.
    """
    from pyspark.sql import SparkSession

    warehouse = os.path.join(tempfile.gettempdir(), "airflow-delta-occ-warehouse")
    options = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.jars.packages": delta_maven_coordinates(),
        "spark.jars.ivy": ivy_dir(),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",   # a progress bar redrawn with carriage returns, in a task log
        "spark.sql.warehouse.dir": warehouse,
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={warehouse}",
        "spark.databricks.delta.snapshotPartitions": "2",
        **DELTA_SESSION_CONF,
        **(conf or {}),
    }
    _launch_jvm_without_secrets(options)
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        import delta.exceptions.captured  # noqa: F401  (installs the py4j conversion on 4.0-4.3)
    except ImportError:
        pass
    return spark


def _launch_jvm_without_secrets(options: Mapping[str, str]) -> None:
    """Start this process's Spark JVM, if it has none yet, with every conf but the secret ones.

    pyspark starts the JVM as ``spark-submit --conf k=v ... pyspark-shell`` with *every* conf of the
    first SparkContext (``pyspark.java_gateway.launch_gateway``), and a command line is readable by
    any user of the machine. Launching the gateway first with the public confs (those spark-submit
    itself must see: ``spark.jars.packages``, the driver's Java options) makes the SparkContext
    created next take the secret ones over py4j instead, as it does for any context after the
    first. ``SparkContext._ensure_initialized`` is the call pyspark makes itself for this; it does
    nothing when the JVM already runs. The s3 tier (``tests/s3/test_secrets.py``) scans every
    process's command line to keep this true for the pinned pyspark.

    The JVM's stdout and stderr are piped to ``jvm_output``, which logs each line at the level it states:
    left on the task process's stderr, Airflow would log all of them (Ivy's resolution at every start,
    log4j's INFO and WARN) at ERROR.
    """
    from pyspark import SparkConf
    from pyspark.core.context import SparkContext
    from pyspark.java_gateway import launch_gateway

    from airflow_delta_occ.spark.jvm_output import start_relay
    from airflow_delta_occ.spark.storage import split_secret_confs

    public, _secrets = split_secret_confs(options)
    conf = SparkConf(loadDefaults=False).setAll(list(public.items()))
    with SparkContext._lock:
        if SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
            # Its output is relayed to logging at each line's own level (``jvm_output``), not left on the task's
            # stderr, which Airflow logs at ERROR. The pipes are drained from before the JVM starts: pyspark waits
            # for the JVM's port without reading them, and a JVM that fails to start says why on them.
            ends = [os.pipe(), os.pipe()]
            for (read_end, _), name in zip(ends, ("stdout", "stderr"), strict=True):
                start_relay(os.fdopen(read_end, "rb"), name)
            try:
                gateway = launch_gateway(  # type: ignore[no-untyped-call]  # pyspark's is untyped
                    conf, popen_kwargs={"stdout": ends[0][1], "stderr": ends[1][1]})
            finally:
                for _, write_end in ends:   # the JVM holds its own copies; the relays end when it exits
                    os.close(write_end)
            SparkContext._ensure_initialized(gateway=gateway, conf=conf)
            return
    SparkContext._ensure_initialized(conf=conf)


def main() -> None:
    parser = argparse.ArgumentParser(description="Local Spark + Delta session utilities")
    parser.add_argument("--resolve-jars", action="store_true", help="download Delta jars into the cache")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")   # the JVM's output (Ivy's resolution) is logged
    if args.resolve_jars:
        start = time.perf_counter()
        spark = local_delta_session("resolve-jars")
        spark.range(1).count()
        spark.stop()
        print(f"{delta_maven_coordinates()} ready in {ivy_dir()} ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
