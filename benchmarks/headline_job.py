"""The naive writer: a plain PySpark application, submitted by Airflow's own ``SparkSubmitOperator``.

It runs one SQL statement exactly as the DAG author wrote it (no partition predicate is added) on the
benchmark's Spark Connect server, and fails like any PySpark job when Delta raises a conflict; the
only retries are Airflow's. With ``local`` instead of a Connect URL it runs in the Spark that
spark-submit started (the overhead benchmark: ``overhead.py``).

Usage: ``spark-submit headline_job.py CONNECT_URL|local SQL``.
"""

from __future__ import annotations

import os
import sys
import time

from pyspark.sql import SparkSession

STATEMENT_SECONDS = "delta-occ-plain-statement-seconds"


def main(connect_url: str, sql: str) -> None:
    if connect_url == "local":
        spark = SparkSession.builder.getOrCreate()   # spark-submit's master and confs (delta-spark)
    else:
        # spark-submit (which SparkSubmitHook always gives a --master) exports MASTER to the Python
        # driver; pyspark refuses a master next to a Connect URL, and this job's Spark is the server.
        os.environ.pop("MASTER", None)
        spark = SparkSession.builder.remote(connect_url).getOrCreate()
    try:
        began = time.monotonic()
        spark.sql(sql).collect()
        # The overhead benchmark pairs this with the provider's job of the same round (read from the log).
        print(f"{STATEMENT_SECONDS}={time.monotonic() - began:.3f}", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
