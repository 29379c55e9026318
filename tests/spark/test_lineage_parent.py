"""The OpenLineage parent job reaches each job's own Spark session, job after job, in one process.

``airflow dags test`` (and any worker that keeps its embedded Spark) runs many Delta tasks on one
SparkContext. The hook hands each job its parent through the builder, which changes only the
process's default session; the runner works in a private session (``newSession``), which starts
from the SparkContext's conf, i.e. from whatever the first task of the process had. The result
carries what the job's session held, read in the job.
"""

from __future__ import annotations

from typing import Any

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.hooks.delta import DeltaSparkHook
from airflow_delta_occ.jobs.result import OpenLineageParent
from airflow_delta_occ.jobs.spec import RunIdentity
from airflow_delta_occ.operators.delta import DeltaDeleteOperator


def _parent(task: str, run_id: str) -> dict[str, str]:
    return {"spark.openlineage.parentJobNamespace": "lake", "spark.openlineage.parentJobName": f"sales.{task}",
            "spark.openlineage.parentRunId": run_id, "spark.openlineage.rootParentJobNamespace": "lake",
            "spark.openlineage.rootParentJobName": "sales",
            "spark.openlineage.rootParentRunId": "019a0000-0000-7000-8000-000000000000"}


def test_each_job_session_holds_its_own_tasks_parent(spark: Any, sales: str) -> None:
    seen = []
    for i, conf in enumerate([_parent("a", "019a0000-0000-7000-8000-00000000000a"),
                              _parent("b", "019a0000-0000-7000-8000-00000000000b"),
                              {}]):  # a task that hands over no parent must not inherit the one before
        operator = DeltaDeleteOperator(task_id=f"d{i}", table=sales, where=f"id = {i + 1}",
                                       partitions={"date": "2024-01-01", "country": "DE"})
        spec = operator.build_spec(DeltaLog.for_table(sales).snapshot(), RunIdentity("sales", f"d{i}", "r"))
        result = DeltaSparkHook(None, spark_conf=conf).run(spec)
        seen.append(result.openlineage_parent)
    assert seen == [OpenLineageParent.from_conf(_parent("a", "019a0000-0000-7000-8000-00000000000a")),
                    OpenLineageParent.from_conf(_parent("b", "019a0000-0000-7000-8000-00000000000b")),
                    None]
