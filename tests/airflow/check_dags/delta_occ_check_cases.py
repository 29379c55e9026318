"""DAGs written for ``airflow delta-occ check`` (``tests/airflow/test_check.py``): one case each.

Tables under ``$DELTA_OCC_CHECK_ROOT`` (the test writes their logs): ``sales`` is partitioned by ``date``
(a DATE) and ``country``; ``events`` is not partitioned. The pool file the test sets has the conflict
pool ``check`` for ``sales``.

* ``check_unprotected``: ``fix_de`` (UPDATE) and ``purge_de`` (DELETE) rewrite the same partition, with
  nothing between them; ``fix_fr`` works on another partition.
* ``check_dependency``: the same pair, ``fix_de >> purge_de``.
* ``check_always``: the same dependency, but ``purge_de`` has trigger rule ``always``: it does not wait.
* ``check_one_success``: ``[fix_de, fix_fr] >> purge_de`` with ``one_success``: it starts once either is done.
* ``check_manual_runs``: no schedule, four runs at a time: two manual runs of one day meet.
* ``check_pooled``: the same pair, both in conflict pool ``check``.
* ``check_airflow_pool``: the same pair, both in Airflow pool ``single`` (one slot, made by the test).
* ``check_mapped``: ``by_day`` is mapped over three days of IT (disjoint); ``same_day`` over three countries'
  worth of the same partition (its instances conflict); ``same_day_limited`` likewise, one at a time.
* ``check_daily``: scheduled daily, ``max_active_runs=1`` (a backfill's runs still overlap): ``day`` is
  confined to ``{{ ds }}`` (runs never meet), ``compact_events`` compacts the whole unpartitioned table (each
  run's meets the others'). ``check_daily_in_order``: the same compaction with ``depends_on_past=True`` (a
  backfill's first run does not wait: still unprotected); ``check_daily_one_at_a_time``: with
  ``max_active_tis_per_dag=1``. ``check_twice_a_day``: two runs a day.
* ``check_failed_parent``: ``[validate, fix_de] >> purge_de >> cleanup`` (``all_done``): cleanup does not wait
  for fix_de when validate fails.
* ``check_unknowns``: what cannot be judged before a run: a task mapped over another task's output, a
  catalog table name, a table that does not exist, a template that reads a Variable (with a default), a
  templated table outside the task's conflict pool.
* ``check_other_dag``: a writer of ``events`` in another DAG (``--all`` pairs it with ``check_daily``'s).
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from pathlib import Path

from airflow.sdk import DAG, task

from airflow_delta_occ.operators.delta import DeltaDeleteOperator, DeltaOptimizeOperator, DeltaUpdateOperator

ROOT = Path(os.environ.get("DELTA_OCC_CHECK_ROOT", os.path.join(tempfile.gettempdir(), "delta-occ-check")))
SALES, EVENTS = str(ROOT / "sales"), str(ROOT / "events")
START = dt.datetime(2024, 1, 1)


def _dag(dag_id: str, **kwargs: object) -> DAG:
    """Without a schedule and one run at a time, unless a case says otherwise: one sample run."""
    settings = {"schedule": None, "start_date": START, "catchup": False, "max_active_runs": 1, **kwargs}
    return DAG(dag_id=dag_id, **settings)  # type: ignore[arg-type]


def _pair(**kwargs: object) -> tuple[DeltaUpdateOperator, DeltaDeleteOperator]:
    day_de = {"date": "{{ ds }}", "country": "DE"}
    return (DeltaUpdateOperator(task_id="fix_de", table=SALES, partitions=day_de, set={"amount": "amount * 2"},
                                **kwargs),  # type: ignore[arg-type]
            DeltaDeleteOperator(task_id="purge_de", table=SALES, partitions=day_de, where="amount < 0",
                                **kwargs))  # type: ignore[arg-type]


with _dag("check_unprotected"):
    _pair()
    DeltaUpdateOperator(task_id="fix_fr", table=SALES, partitions={"date": "{{ ds }}", "country": "FR"},
                        set={"amount": "amount * 2"})

with _dag("check_dependency"):
    fix, purge = _pair()
    fix >> purge

with _dag("check_always"):
    fix, purge = _pair(trigger_rule="always")
    fix >> purge

with _dag("check_one_success"):
    fix, purge = _pair(trigger_rule="one_success")
    fix_fr = DeltaUpdateOperator(task_id="fix_fr", table=SALES, partitions={"date": "{{ ds }}", "country": "FR"},
                                 set={"amount": "amount * 2"})
    [fix, fix_fr] >> purge

with _dag("check_manual_runs", max_active_runs=4):
    DeltaOptimizeOperator(task_id="compact_de", table=SALES, partitions={"date": "{{ ds }}", "country": "DE"})

with _dag("check_pooled"):
    _pair(conflict_pool="check")

with _dag("check_airflow_pool"):
    _pair(pool="single")

with _dag("check_mapped"):
    DeltaUpdateOperator.partial(task_id="by_day", table=SALES, set={"amount": "0"}).expand(
        partitions=[{"date": d, "country": "IT"} for d in ("2024-03-01", "2024-03-02", "2024-03-03")])
    DeltaUpdateOperator.partial(task_id="same_day", table=SALES, partitions={"date": "{{ ds }}", "country": "DE"}
                                ).expand(set=[{"amount": str(n)} for n in range(3)])
    DeltaUpdateOperator.partial(task_id="same_day_limited", table=SALES, max_active_tis_per_dagrun=1,
                                partitions={"date": "{{ ds }}", "country": "FR"}
                                ).expand(set=[{"amount": str(n)} for n in range(3)])

with _dag("check_daily", schedule="@daily"):
    DeltaUpdateOperator(task_id="day", table=SALES, partitions={"date": "{{ ds }}", "country": "IT"},
                        set={"amount": "0"})
    DeltaOptimizeOperator(task_id="compact_events", table=EVENTS)

with _dag("check_daily_in_order", schedule="@daily"):
    DeltaOptimizeOperator(task_id="compact_events", table=EVENTS, depends_on_past=True)

with _dag("check_daily_one_at_a_time", schedule="@daily"):
    DeltaOptimizeOperator(task_id="compact_events", table=EVENTS, max_active_tis_per_dag=1)

with _dag("check_twice_a_day", schedule="0 0,12 * * *"):
    DeltaOptimizeOperator(task_id="compact_events", table=EVENTS)

with _dag("check_failed_parent"):
    validate = DeltaUpdateOperator(task_id="validate", table=SALES, partitions={"date": "{{ ds }}", "country": "FR"},
                                   set={"amount": "amount"})
    fix, purge = _pair()
    [validate, fix] >> purge   # all_success: purge runs only once fix has succeeded
    cleanup = DeltaDeleteOperator(task_id="cleanup", table=SALES, where="amount < 0", trigger_rule="all_done",
                                  partitions={"date": "{{ ds }}", "country": "DE"})
    purge >> cleanup           # all_done: purge may end upstream_failed (validate failed) while fix still runs

def _lake_day() -> str:
    from airflow.sdk import Variable

    return str(Variable.get("delta_occ_check_day", default="2024-03-01"))


with _dag("check_unknowns", user_defined_macros={"lake_day": _lake_day}):
    @task
    def days() -> list[dict[str, str]]:
        return [{"date": "2024-03-01", "country": "DE"}]

    DeltaUpdateOperator.partial(task_id="from_upstream", table=SALES, set={"amount": "0"}).expand(partitions=days())
    DeltaOptimizeOperator(task_id="by_name", table_name="main.sales")
    DeltaOptimizeOperator(task_id="missing_table", table=str(ROOT / "missing"))
    DeltaOptimizeOperator(task_id="needs_a_variable", table=SALES,
                          partitions={"date": "{{ var.value.get('delta_occ_check_day', '2024-03-01') }}",
                                      "country": "DE"})
    DeltaOptimizeOperator(task_id="variable_in_a_macro", table=SALES,
                          partitions={"date": "{{ lake_day() }}", "country": "DE"})
    DeltaOptimizeOperator(task_id="outside_its_pool", table="{{ params.table }}", conflict_pool="check",
                          params={"table": EVENTS})

with _dag("check_other_dag"):
    DeltaDeleteOperator(task_id="trim_events", table=EVENTS, where="id < 0")
