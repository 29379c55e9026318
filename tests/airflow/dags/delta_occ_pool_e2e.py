"""Eight writers to one Delta table under a real scheduler, with and without a conflict pool.

Used by ``tests/airflow/test_pool_e2e.py``, which creates the tables, the pool file, the Airflow pools
and a Spark Connect server (every Delta job runs there, as on a platform's standing Spark), starts
``airflow standalone`` and triggers these DAGs.

``delta_occ_e2e_pooled`` and ``delta_occ_e2e_naive`` run the same eight writers on a table
partitioned by ``p`` (``p`` = 1..4, two files each; see the test for the rows), the first in the
conflict pool ``e2e`` and the second in none:

* ``merge_p1`` and ``update_p1`` both rewrite partition 1 (a real Delta conflict when they overlap).
  ``merge_p1``'s commit is held by the test LogStore after Spark has read the table (the gate, armed
  from a file); the test releases it once ``update_p1`` has committed, or after a few seconds.
* ``merge_p2`` and ``optimize_p2`` both rewrite partition 2;
* ``update_p3``, ``delete_p4`` and ``append_p5`` (a new partition) touch nothing anyone else does;
* ``set_properties``: a writer the provider does not run (a plain task running ``ALTER TABLE ... SET
  TBLPROPERTIES`` over Spark Connect), behind ``DeltaConflictSensor`` and ``DeltaLeaseReleaseOperator``
  in the pooled DAG. A metadata change conflicts with every concurrent writer.

``delta_occ_e2e_kill``: ``held_writer`` takes a lease on partition 1 of another table and its commit is
held; the test kills its task process (SIGKILL: no ``on_kill``, no release). ``next_writer`` (an UPDATE
of partition 1 in the same pool) must be granted once the lease's TTL has run out.

Environment: ``DELTA_OCC_E2E_ROOT`` (tables and the gate directory; the Connect server's
``occ.armed.dir`` is ``ROOT/gate``). The Connect URL comes from the ``delta_occ_default`` connection.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, task

from airflow_delta_occ.hooks.delta import DeltaSparkHook
from airflow_delta_occ.hooks.leases import DeltaLeaseStoreHook
from airflow_delta_occ.operators.delta import (
    DeltaAppendOperator,
    DeltaDeleteOperator,
    DeltaMergeOperator,
    DeltaOptimizeOperator,
    DeltaUpdateOperator,
)
from airflow_delta_occ.sensors import DeltaConflictSensor, DeltaLeaseReleaseOperator

ROOT = Path(os.environ.get("DELTA_OCC_E2E_ROOT", os.path.join(tempfile.gettempdir(), "delta-occ-e2e")))
GATE_DIR = ROOT / "gate"
POOL, KILL_POOL = "e2e", "e2e_kill"
#: What the ALTER TABLE commit carries in commitInfo.userMetadata (the operators tag theirs with the run).
PROPERTIES_TAG = "e2e_set_properties"
START = dt.datetime(2024, 1, 1)


class HeldMerge(DeltaMergeOperator):
    """A MERGE whose commit the gate LogStore holds until the test releases it.

    Before the job runs it arms the gate with its run identity (which its commit carries in
    ``userMetadata``) and writes its process id next to it, for the test that kills it.
    """

    def execute(self, context: Any) -> dict[str, Any]:
        GATE_DIR.mkdir(parents=True, exist_ok=True)
        token = json.dumps(self._run_identity(context).user_metadata())[1:-1]
        (GATE_DIR / f"{context['dag'].dag_id}.{self.task_id}.pid").write_text(str(os.getpid()))
        (GATE_DIR / f"{context['dag'].dag_id}.{self.task_id}.arm").write_text(token)
        return super().execute(context)


def _merge(task_id: str, table: str, p: int, pool: str | None, cls: type[DeltaMergeOperator] = DeltaMergeOperator,
           **kwargs: Any) -> DeltaMergeOperator:
    base = p * 1000
    return cls(task_id=task_id, table=table, partitions={"p": p}, conflict_pool=pool,
               source_query=f"SELECT id, {p} AS p, 'merged' AS m FROM range({base}, {base + 50})",
               merge_condition="t.id = s.id",
               clauses=[{"kind": "matched_update", "set": {"m": "s.m"}}], **kwargs)


def _wait_for_holder(pool: str, task_id: str, **kwargs: Any) -> Any:
    """A task that ends once ``task_id`` of this run holds a lease in ``pool``."""

    @task(task_id=f"wait_for_{task_id}_lease", **kwargs)
    def wait() -> None:
        with DeltaLeaseStoreHook().get_store() as store:
            while not any(f"/{task_id}/" in r.owner for r in store.holders(pool=pool)):
                time.sleep(0.5)

    return wait()


def writers(dag_id: str, pool: str | None) -> DAG:
    """The eight writers on ``ROOT/<name>``; in ``pool`` when given."""
    name = dag_id.rsplit("_", 1)[-1]
    table = str(ROOT / name)
    # The race in partition 1 is what the test watches: start both of its writers first.
    first = {"priority_weight": 100, "weight_rule": "absolute"}
    with DAG(dag_id=dag_id, schedule=None, start_date=START, catchup=False, max_active_tasks=8,
             tags=["delta", "test"], doc_md=__doc__) as dag:
        _merge("merge_p1", table, 1, pool, HeldMerge, **first)
        update_p1 = DeltaUpdateOperator(task_id="update_p1", table=table, partitions={"p": 1},
                                        set={"u": "'updated'"}, where="id >= 1050", conflict_pool=pool, **first)
        if pool is not None:
            # Pooled: update_p1 asks once merge_p1 holds partition 1, so the held commit is merge_p1's
            # lease (the test watches disjoint writers run meanwhile) and update_p1 is the one that waits.
            _wait_for_holder(pool, "merge_p1", **first) >> update_p1
        _merge("merge_p2", table, 2, pool)
        DeltaOptimizeOperator(task_id="optimize_p2", table=table, partitions={"p": 2}, conflict_pool=pool)
        DeltaUpdateOperator(task_id="update_p3", table=table, partitions={"p": 3}, set={"u": "'updated'"},
                            where="id < 3050", conflict_pool=pool)
        DeltaDeleteOperator(task_id="delete_p4", table=table, partitions={"p": 4}, where="id % 2 = 0",
                            conflict_pool=pool)
        DeltaAppendOperator(task_id="append_p5", table=table, partitions={"p": 5},
                            source_query="SELECT id, 5 AS p, 'appended' AS m, CAST(NULL AS STRING) AS u "
                                         "FROM range(5000, 5100)", conflict_pool=pool)

        @task(task_id="set_properties", priority_weight=1)
        def set_properties(table: str) -> int:
            """A writer the provider does not run: one ALTER TABLE over Spark Connect."""
            with DeltaSparkHook().job_session() as spark:
                spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", json.dumps({PROPERTIES_TAG: dag_id}))
                spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('e2e.owner' = 'platform')").collect()
                return int(spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").collect()[0]["version"])

        alter = set_properties(table)
        if pool is not None:
            sensor = DeltaConflictSensor(task_id="wait_for_properties_lease", table=table,
                                         operation="set_properties", properties={"e2e.owner": "platform"},
                                         conflict_pool=pool, poke_interval=1,
                                         priority_weight=1)
            release = DeltaLeaseReleaseOperator(task_id="release_properties_lease",
                                                sensor_task_id="wait_for_properties_lease")
            sensor >> alter >> release
    return dag


pooled = writers("delta_occ_e2e_pooled", POOL)
naive = writers("delta_occ_e2e_naive", None)


with DAG(dag_id="delta_occ_e2e_kill", schedule=None, start_date=START, catchup=False, max_active_tasks=4,
         tags=["delta", "test"], doc_md=__doc__) as kill:
    table = str(ROOT / "kill")
    held = _merge("held_writer", table, 1, KILL_POOL, HeldMerge, retries=0)

    nxt = DeltaUpdateOperator(task_id="next_writer", table=table, partitions={"p": 1}, set={"u": "'updated'"},
                              where="id >= 1050", conflict_pool=KILL_POOL, retries=0)
    # next_writer must ask after held_writer holds its lease (else it might go first).
    _wait_for_holder(KILL_POOL, "held_writer") >> nxt
