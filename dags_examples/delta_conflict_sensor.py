"""A writer the provider does not run, kept apart from the pool's other writers by ``DeltaConflictSensor``.

A platform job changes the table's properties (``ALTER TABLE ... SET TBLPROPERTIES``) from a plain
task. A metadata change fails every concurrent writer of the table with ``MetadataChangedException``,
so it must not overlap with any of them:

1. ``wait_for_lease`` asks the conflict pool ``sales`` for a lease on what the job does (the whole
   table, a metadata change), waiting deferred (no worker slot) while another writer holds one;
2. ``set_retention`` runs while the sensor's lease keeps the pool's other writers waiting;
3. ``release_lease`` gives the lease back whether the job succeeded or failed (``all_done``);
   otherwise it ends with its TTL (``lease_ttl``).

The same pattern fits a ``SparkSubmitOperator``, a Databricks job or any other writer between the
sensor and the release step. It needs ``[delta_occ] pool_file`` with a pool ``sales`` that covers the
table, and the ``delta_occ_leases`` connection (see docs/pools.md). The table is the one
``delta_concurrent_merges`` writes (``DELTA_OCC_DEMO_ROOT``).
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile

from airflow.sdk import DAG, task

from airflow_delta_occ.sensors import DeltaConflictSensor, DeltaLeaseReleaseOperator

TABLE = os.path.join(os.environ.get("DELTA_OCC_DEMO_ROOT", os.path.join(tempfile.gettempdir(), "delta-occ-demo")),
                     "sales")
PROPERTIES = {"delta.logRetentionDuration": "interval 60 days"}

with DAG(
    dag_id="delta_conflict_sensor",
    schedule=None,
    start_date=dt.datetime(2024, 1, 1),
    catchup=False,
    tags=["delta", "example"],
    doc_md=__doc__,
) as dag:
    wait_for_lease = DeltaConflictSensor(
        task_id="wait_for_lease",
        table=TABLE,
        operation="set_properties",
        properties=PROPERTIES,
        conflict_pool="sales",
        lease_ttl=900,         # the writer below must finish within 15 minutes, or release early
        poke_interval=5,
        timeout=3600,          # give up (and fail) after an hour of waiting
    )

    @task
    def set_retention(table: str) -> None:
        """The writer: one ALTER TABLE in the Spark the ``delta_occ`` connection names."""
        from airflow_delta_occ.hooks.delta import DeltaSparkHook

        settings = ", ".join(f"'{key}' = '{value}'" for key, value in PROPERTIES.items())
        with DeltaSparkHook().job_session() as spark:
            quoted = table.replace("`", "``")  # a path is an identifier here: backticks doubled
            spark.sql(f"ALTER TABLE delta.`{quoted}` SET TBLPROPERTIES ({settings})").collect()

    release_lease = DeltaLeaseReleaseOperator(task_id="release_lease", sensor_task_id="wait_for_lease")

    wait_for_lease >> set_retention(TABLE) >> release_lease
