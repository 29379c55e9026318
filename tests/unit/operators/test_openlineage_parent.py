"""The OpenLineage parent job an operator hands to its Spark job is the current try's, computed by the
OpenLineage provider's own helper, and the author's ``spark_conf`` is never rewritten."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.providers.openlineage.plugins.macros import lineage_run_id

from airflow_delta_occ.operators.delta import DeltaDeleteOperator

pytestmark = pytest.mark.unit


def _context(try_number: int) -> dict[str, Any]:
    """What the provider's helper reads of a running task instance: ids, try, and its DAG run."""
    dag_run = SimpleNamespace(logical_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC), run_after=None, conf={},
                              clear_number=0)
    ti = SimpleNamespace(dag_id="sales", task_id="d", map_index=-1, try_number=try_number, dag_run=dag_run)
    ti.get_template_context = lambda: {"dag_run": dag_run}
    return {"ti": ti, "run_id": "manual__1", "dag_run": dag_run}


def test_each_try_hands_over_its_own_run_and_leaves_spark_conf_alone() -> None:
    """``airflow dags test`` retries a task on the same operator object: the second try's job must not
    carry the first try's run (the provider's helper keeps parent confs already present)."""
    operator = DeltaDeleteOperator(task_id="d", table="/lake/sales", where="id = 1",
                                   spark_conf={"spark.sql.shuffle.partitions": "4"},
                                   openlineage_inject_parent_job_info=True)
    for try_number in (1, 2):
        context = _context(try_number)
        operator._inject_openlineage_properties(context)
        assert operator.hook.spark_conf["spark.openlineage.parentRunId"] == lineage_run_id(context["ti"])
        assert operator.hook.spark_conf["spark.sql.shuffle.partitions"] == "4"
    assert operator.spark_conf == {"spark.sql.shuffle.partitions": "4"}
    first, second = (lineage_run_id(_context(n)["ti"]) for n in (1, 2))
    assert first != second


def test_a_parent_the_author_set_is_kept() -> None:
    operator = DeltaDeleteOperator(task_id="d", table="/lake/sales", where="id = 1",
                                   spark_conf={"spark.openlineage.parentRunId": "mine"},
                                   openlineage_inject_parent_job_info=True)
    operator._inject_openlineage_properties(_context(1))
    assert operator.hook.spark_conf["spark.openlineage.parentRunId"] == "mine"
