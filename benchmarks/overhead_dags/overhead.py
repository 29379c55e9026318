"""The overhead benchmark's DAG: the same MERGE, run one task at a time, three ways, built from the JSON
spec that ``benchmarks/overhead.py`` writes (``$DELTA_OCC_OVERHEAD_SPEC``).

Each round runs, in an order that rotates with the round:

* ``plain_N``: Airflow's ``SparkSubmitOperator`` submitting ``headline_job.py`` with the statement the
  provider runs for this MERGE (the partition predicate included), on a local master;
* ``submit_N``: the provider's ``DeltaMergeOperator`` in spark-submit mode on the same local master;
* ``embedded_N``: the same operator in embedded mode (Spark starts inside the task process).

One task at a time (``max_active_tasks=1``, a chain), so every task has the machine to itself.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, chain

from airflow_delta_occ.operators.delta import DeltaMergeOperator

SPEC_PATH = os.environ.get("DELTA_OCC_OVERHEAD_SPEC")
JOB = str(Path(__file__).resolve().parent.parent / "headline_job.py")
VARIANTS = ("plain", "submit", "embedded")


def _task(spec: dict[str, Any], variant: str, round_: int) -> Any:
    task_id = f"{variant}_{round_}"
    if variant == "plain":
        from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

        return SparkSubmitOperator(task_id=task_id, application=JOB, conn_id="spark_local", conf=spec["conf"],
                                   application_args=["local", spec["statement"]])
    return DeltaMergeOperator(task_id=task_id, delta_conn_id=f"delta_{variant}", table=spec["table"],
                              source_query=spec["source_query"], merge_condition="t.id = s.id",
                              clauses=[{"kind": "matched_update", "set": {"m": "s.m"}}],
                              partitions={"p": spec["partition"]})


if SPEC_PATH:
    _spec = json.loads(Path(SPEC_PATH).read_text())
    with DAG(dag_id="delta_occ_overhead", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False,
             max_active_tasks=1, max_active_runs=1, tags=["benchmark"], doc_md=__doc__) as dag:
        order = []
        for _round in range(_spec["rounds"]):
            shift = _round % len(VARIANTS)
            order += [_task(_spec, v, _round) for v in VARIANTS[shift:] + VARIANTS[:shift]]
        chain(*order)
