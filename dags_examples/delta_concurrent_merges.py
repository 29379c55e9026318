"""One MERGE per country into one Delta table, all at once, then a compaction.

Each mapped MERGE is confined to its own partition (``partitions=``), so Delta's conflict check sees
disjoint reads and the MERGEs commit side by side; were two to collide anyway, the typed retry
policy would retry the ConcurrentAppendException inside the Spark job. The table lives at
``$DELTA_OCC_DEMO_TABLE`` (default: a folder under the system temp directory).

The day written is the run's logical date when it has one (a scheduled run, a backfill,
``airflow dags test DAG 2024-01-01``) and otherwise the date of ``dag_run.run_after``: in Airflow 3 a
manual run (``airflow dags trigger DAG`` without ``-l``, or the UI's trigger button) has no logical
date, so ``{{ ds }}`` is undefined for it, while every run has ``run_after``.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile

from airflow.sdk import DAG, task

from airflow_delta_occ.operators.delta import DeltaMergeOperator, DeltaOptimizeOperator

ROOT = os.environ.get("DELTA_OCC_DEMO_ROOT", os.path.join(tempfile.gettempdir(), "airflow-delta-occ-demo"))
TABLE = os.environ.get("DELTA_OCC_DEMO_TABLE", os.path.join(ROOT, "sales"))
COUNTRIES = ["DE", "FR", "IT", "ES"]
#: The run's day as YYYY-MM-DD, for every kind of run (see the module docstring).
RUN_DATE = "{{ (dag_run.logical_date or dag_run.run_after) | ds }}"

with DAG(
    dag_id="delta_concurrent_merges",
    schedule=None,
    start_date=dt.datetime(2024, 1, 1),
    catchup=False,
    max_active_tasks=4,
    tags=["delta", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def prepare_table_and_sources(run_date: str) -> list[dict[str, str]]:
        """Create the target (partitioned by date, country) and one source table per country."""
        from airflow_delta_occ.hooks.delta import DeltaSparkHook

        spark = DeltaSparkHook().get_spark()
        spark.sql(f"CREATE TABLE IF NOT EXISTS delta.`{TABLE}` (id INT, amount DOUBLE, date DATE, country STRING) "
                  "USING delta PARTITIONED BY (date, country)")
        sources = []
        for i, country in enumerate(COUNTRIES):
            path = os.path.join(ROOT, "incoming", country)
            rows = [(i * 100 + n, float(n), run_date, country) for n in range(5)]
            spark.createDataFrame(rows, "id INT, amount DOUBLE, date STRING, country STRING") \
                .selectExpr("id", "amount", "CAST(date AS DATE) AS date", "country") \
                .write.format("delta").mode("overwrite").save(path)
            sources.append({"source": path, "country": country})
        return sources

    sources = prepare_table_and_sources(RUN_DATE)  # TaskFlow arguments are templates: rendered per run

    merges = DeltaMergeOperator.partial(
        task_id="merge_country",
        table=TABLE,
        merge_condition="t.id = s.id",
        conflict_policies={"ConcurrentAppendException": {"max_attempts": 8, "initial_delay": 0.5}},
    ).expand_kwargs(sources.map(lambda s: {"source": s["source"],
                                           "partitions": {"date": RUN_DATE, "country": s["country"]}}))

    compact = DeltaOptimizeOperator(task_id="compact_day", table=TABLE, partitions={"date": RUN_DATE})

    merges >> compact
