"""Task-level retries of Delta operators in a real Airflow run (used by tests/airflow/test_task_retries.py).

Every scenario is a task of one DAG run; each starts its own embedded Spark session with delta-spark.

* ``merge_exhausted``: a MERGE that reads the whole table, whose in-job policy allows 2 attempts.
  On its first try a concurrent writer commits a MERGE to the same table while each attempt is
  held at its commit (see ``ConcurrentWriterMerge``), so delta-spark raises a real
  ConcurrentAppendException on both attempts; the ``ConflictFailure`` goes to Airflow, whose retry
  policy retries the task after the conflict policy's backoff; the second try commits.
* ``merge_fail_policy``: the same race, with ``ConcurrentAppendException: "fail"``: no Airflow retry.
* ``bad_partitions``: ``partitions=`` names no partition column (``JobSpecError``): no Airflow retry.
* ``append_then_lost``: an append whose first try commits and then fails before reporting (a worker
  lost after the commit, simulated by raising after the operator returned): the retry finds the
  commit of its series of tries and writes nothing again.

None of the Delta tasks sets ``retries``: they get ``[delta_occ] task_retries``.

Environment: ``DELTA_OCC_TEST_ROOT`` (tables and the gate directory) and ``DELTA_OCC_TEST_GATE_JAR``
(the compiled ``tests/spark/differential/GateLogStore.java``, from ``harness.gate_jar()``; without it
no task is held). The gate is armed from files in the gate directory (Hadoop conf ``occ.armed.dir``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, task

from airflow_delta_occ.operators.delta import DeltaAppendOperator, DeltaMergeOperator

DAG_ID = "delta_occ_task_retries"
ROOT = Path(os.environ.get("DELTA_OCC_TEST_ROOT", os.path.join(tempfile.gettempdir(), "delta-occ-task-retries")))
GATE_DIR = ROOT / "gate"
TABLES = {name: str(ROOT / name) for name in ("exhausted", "fail_policy", "append")}
GATE_JAR = os.environ.get("DELTA_OCC_TEST_GATE_JAR")
SPARK_CONF = {
    "spark.jars": GATE_JAR,
    "spark.delta.logStore.class": "airflowdeltaocc.testing.GateLogStore",
    "spark.hadoop.occ.armed.dir": str(GATE_DIR),
    # Otherwise the held commit keeps the table's commit lock and the concurrent writer cannot commit.
    "spark.databricks.delta.commitLock.enabled": "false",
} if GATE_JAR else {}
WAIT_SECONDS = 300.0
#: What the concurrent writer's commits carry in commitInfo.userMetadata.
WRITER_TAG = "concurrent_writer"


def _wait_for(path: Path, stop: threading.Event, timeout: float = WAIT_SECONDS) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if stop.is_set() or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class ConcurrentWriterMerge(DeltaMergeOperator):
    """On its first try, another writer commits to the table while each attempt of the job is held.

    The gate LogStore holds the commit of the try (matched by the run identity the job writes into
    commitInfo.userMetadata) after Spark has read the table; a thread of this task then commits a
    MERGE to the same table from another Spark session and releases the held commit. delta-spark's
    conflict check then raises what a real race raises. ``concurrent_commits`` attempts are raced.
    """

    def __init__(self, *, concurrent_commits: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.concurrent_commits = concurrent_commits

    def execute(self, context: Any) -> dict[str, Any]:
        if int(context["ti"].try_number) != 1 or not SPARK_CONF:
            return super().execute(context)
        GATE_DIR.mkdir(parents=True, exist_ok=True)
        # The commit of this try names its run identity in userMetadata, JSON-escaped in the commitInfo line.
        token = json.dumps(self._run_identity(context).user_metadata())[1:-1]
        names = [f"{self.task_id}-{n}" for n in range(1, self.concurrent_commits + 1)]
        (GATE_DIR / f"{names[0]}.arm").write_text(token)
        stop = threading.Event()
        errors: list[BaseException] = []

        def race() -> None:
            try:
                for n, name in enumerate(names, start=1):
                    if not _wait_for(GATE_DIR / f"{name}.reached", stop):
                        self.log.warning("the job's commit never reached gate %s", name)
                        return
                    self._concurrent_commit(n)
                    if n < len(names):  # armed before the release: the job's next attempt is held too
                        (GATE_DIR / f"{names[n]}.arm").write_text(token)
                    (GATE_DIR / f"{name}.release").touch()
            except BaseException as exc:  # reported in the task log; the Delta log shows what was committed
                errors.append(exc)
                for name in names:
                    (GATE_DIR / f"{name}.release").touch()

        writer = threading.Thread(target=race, name=f"concurrent-writer-{self.task_id}", daemon=True)
        writer.start()
        try:
            return super().execute(context)
        finally:
            stop.set()
            writer.join(120)
            for name in names:
                (GATE_DIR / f"{name}.arm").unlink(missing_ok=True)
            if errors:
                self.log.error("the concurrent writer failed: %r", errors[0])

    def _concurrent_commit(self, n: int) -> None:
        """A MERGE inserting one row, from another session of this worker's Spark application."""
        session = self.hook.get_spark().newSession()
        session.conf.set("spark.databricks.delta.commitInfo.userMetadata",
                         json.dumps({WRITER_TAG: {"for": self.task_id, "commit": n}}))
        session.sql(f"MERGE INTO delta.`{self.table}` AS t USING (SELECT {100 + n} AS id, 'concurrent' AS v) AS s "
                    "ON t.id = s.id WHEN NOT MATCHED THEN INSERT *").collect()
        self.log.info("concurrent writer committed MERGE %s to %s", n, self.table)


class AppendThenWorkerLost(DeltaAppendOperator):
    """Its first try commits, then fails before Airflow hears of the success (a lost worker)."""

    def execute(self, context: Any) -> dict[str, Any]:
        result = super().execute(context)
        if int(context["ti"].try_number) == 1:
            raise RuntimeError(f"simulated loss of the worker after the commit of version {result['version']}")
        return result


with DAG(
    dag_id=DAG_ID,
    schedule=None,
    start_date=dt.datetime(2024, 1, 1),
    catchup=False,
    max_active_tasks=4,
    tags=["delta", "test"],
    doc_md=__doc__,
) as dag:

    @task
    def create_tables() -> None:
        from airflow_delta_occ.hooks.delta import DeltaSparkHook

        spark = DeltaSparkHook(spark_conf=SPARK_CONF).get_spark()
        for name, path in TABLES.items():
            if name == "append":
                spark.sql(f"CREATE TABLE delta.`{path}` (id INT, v STRING) USING delta")
            else:
                spark.sql(f"CREATE TABLE delta.`{path}` USING delta AS SELECT * FROM VALUES (1, 'seed'), (2, 'seed') "
                          "AS seed(id, v)")

    upsert = "SELECT 1 AS id, 'merged' AS v UNION ALL SELECT 3 AS id, 'merged' AS v"
    merge_exhausted = ConcurrentWriterMerge(
        task_id="merge_exhausted", table=TABLES["exhausted"], source_query=upsert, merge_condition="t.id = s.id",
        conflict_policies={"ConcurrentAppendException": {"max_attempts": 2, "initial_delay": 2.0,
                                                         "multiplier": 2.0, "jitter": 0.0}},
        concurrent_commits=2, spark_conf=SPARK_CONF)
    merge_fail_policy = ConcurrentWriterMerge(
        task_id="merge_fail_policy", table=TABLES["fail_policy"], source_query=upsert, merge_condition="t.id = s.id",
        conflict_policies={"ConcurrentAppendException": "fail"}, concurrent_commits=1, spark_conf=SPARK_CONF)
    bad_partitions = DeltaMergeOperator(
        task_id="bad_partitions", table=TABLES["append"], source_query=upsert, merge_condition="t.id = s.id",
        partitions={"country": "DE"}, spark_conf=SPARK_CONF)
    append_then_lost = AppendThenWorkerLost(
        task_id="append_then_lost", table=TABLES["append"],
        source_query="SELECT 1 AS id, 'appended' AS v UNION ALL SELECT 2 AS id, 'appended' AS v",
        retry_delay=dt.timedelta(seconds=1), spark_conf=SPARK_CONF)

    create_tables() >> [merge_exhausted, merge_fail_policy, bad_partitions, append_then_lost]
