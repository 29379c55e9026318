"""One Delta UPDATE in the conflict pool ``sales``: it waits (deferred) for a conflicting lease, then runs.

Used by ``tests/airflow/test_conflict_pool_dag.py``, which creates the table, the pool file and the
lease store (and the conflicting lease) before it runs this DAG with ``airflow dags test``.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from pathlib import Path

from airflow.sdk import DAG

from airflow_delta_occ.operators.delta import DeltaUpdateOperator

DAG_ID = "delta_occ_conflict_pool"
ROOT = Path(os.environ.get("DELTA_OCC_TEST_ROOT", os.path.join(tempfile.gettempdir(), "delta-occ-conflict-pool")))
TABLE = str(ROOT / "sales")

with DAG(dag_id=DAG_ID, schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False,
         tags=["delta", "test"], doc_md=__doc__) as dag:
    DeltaUpdateOperator(task_id="update_in_pool", table=TABLE, set={"v": "'updated'"}, where="id = 1",
                        conflict_pool="sales", retries=0)
