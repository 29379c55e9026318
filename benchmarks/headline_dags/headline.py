"""The headline benchmark's DAGs: one per table, number of writers K and mode, built from the JSON spec
that ``benchmarks/headline.py`` writes (``$DELTA_OCC_BENCH_SPEC``; see ``headline_workload.py``).

Every DAG is only the K writers, all independent, so the scheduler starts them together up to its
parallelism; the orchestrator creates the table before it triggers a run (``run_id`` = the table's
folder). Modes:

* ``naive``: Airflow's ``SparkSubmitOperator`` submits ``headline_job.py`` with the author's SQL;
  ``retries`` / ``retry_delay`` as the spec says (what a user sets).
* ``inject``: the provider's operators with ``partitions=``, no pool; in-job retries off (every conflict
  policy ``fail``) and Airflow's plain retries, the same as ``naive``.
* ``provider``: the provider's operators with ``partitions=`` and ``conflict_pool=``, every other
  setting the provider's default (no ``deferrable`` argument: how a writer waits is the operator's
  default); the typed retry policies as they ship.
* ``deferred``: as ``provider``, with ``deferrable=True`` (a writer always waits in the triggerer).
* ``worker``: as ``provider``, with ``deferrable=False`` (a writer always waits in the worker).
* ``serial``: the provider's operators in an Airflow pool of one slot.
* ``disjoint``: the provider's operators with ``partitions=``, no pool, each writer on its own copy of
  the seed table (the spec's per-writer ``table``), so none conflicts: the achievable bound's run.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, RetryDecision, RetryPolicy
from airflow.sdk.definitions.retry_policy import RetryAction

from airflow_delta_occ.operators.delta import (
    DeltaAppendOperator,
    DeltaDeleteOperator,
    DeltaMergeOperator,
    DeltaOptimizeOperator,
    DeltaUpdateOperator,
)
from airflow_delta_occ.retry.classify import ConflictKind

SPEC_PATH = os.environ.get("DELTA_OCC_BENCH_SPEC")
JOB = str(Path(__file__).resolve().parent.parent / "headline_job.py")
NO_IN_JOB_RETRIES = {kind.value: {"action": "fail"} for kind in ConflictKind}


class AirflowRetries(RetryPolicy):
    """Airflow's own behaviour: every failure is left to ``retries`` and ``retry_delay``."""

    def evaluate(self, exception: BaseException, try_number: int, max_tries: int,
                 context: Any = None) -> RetryDecision:
        return RetryDecision(RetryAction.DEFAULT)


def _provider_task(w: dict[str, Any], table: str, **kwargs: Any) -> Any:
    common = {"task_id": w["task_id"], "table": table, "partitions": w["partitions"], **kwargs}
    if w["op"] == "merge":
        return DeltaMergeOperator(source_query=w["source_query"], merge_condition="t.id = s.id",
                                  clauses=[{"kind": "matched_update", "set": {"m": "s.m"}}], **common)
    if w["op"] == "update":
        return DeltaUpdateOperator(set={"u": "'updated'"}, where=w["where"], **common)
    if w["op"] == "delete":
        return DeltaDeleteOperator(where=w["where"], **common)
    if w["op"] == "append":
        return DeltaAppendOperator(source_query=w["source_query"], **common)
    return DeltaOptimizeOperator(**common)


def _dag(spec: dict[str, Any], entry: dict[str, Any]) -> DAG:
    mode = entry["mode"]
    retries = {"retries": spec["retries"], "retry_delay": dt.timedelta(seconds=spec["retry_delay"])}
    with DAG(dag_id=entry["dag_id"], schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False,
             max_active_tasks=entry["k"], max_active_runs=1, tags=["benchmark"], doc_md=__doc__) as dag:
        for w in entry["writers"]:
            table = w.get("table") or entry["table"]   # its own copy in the disjoint mode
            if mode == "naive":
                from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

                SparkSubmitOperator(task_id=w["task_id"], application=JOB, conn_id="spark_bench",
                                    application_args=[spec["connect_url"], w["naive_sql"]], **retries)
            elif mode == "inject":
                _provider_task(w, table, conflict_policies=NO_IN_JOB_RETRIES, retry_policy=AirflowRetries(),
                               **retries)
            elif mode == "provider":   # the defaults: no deferrable argument
                _provider_task(w, table, conflict_pool=spec["conflict_pool"])
            elif mode == "deferred":
                _provider_task(w, table, conflict_pool=spec["conflict_pool"], deferrable=True)
            elif mode == "worker":
                _provider_task(w, table, conflict_pool=spec["conflict_pool"], deferrable=False)
            elif mode == "disjoint":
                _provider_task(w, table)
            else:
                _provider_task(w, table, pool=spec["serial_pool"])
    return dag


if SPEC_PATH:
    _spec = json.loads(Path(SPEC_PATH).read_text())
    for _entry in _spec["dags"]:
        globals()[_entry["dag_id"]] = _dag(_spec, _entry)
