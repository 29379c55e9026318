"""Six writers into one Delta table at once, kept apart by a conflict pool only where they would conflict.

What ``make demo`` runs. The table (partitioned by date and country) is seeded with three small files
per country; then, all at the same time and all in conflict pool ``demo``:

* ``merge_de`` upserts the day's DE rows and ``fix_de`` doubles older DE amounts: both rewrite files
  of partition DE, so Delta would fail one of them with a conflict. The pool grants one lease and
  makes the other wait (deferred, no worker slot) until the first has committed;
* ``merge_fr`` (FR) and ``purge_it`` (a DELETE in IT) touch partitions nobody else writes: they run
  beside everything;
* ``compact_es`` (OPTIMIZE) and ``append_es`` (a blind append) share partition ES, yet run side by
  side: a compaction commits only files with ``dataChange=false``, so Delta never fails it, or a
  blind append, over the other.

``check_table`` then reads the table with Spark and compares every partition's row count and sum of
``amount`` with what the six writers must leave in any commit order (``expected_table``).

Needs the conflict pool ``demo`` in ``[delta_occ] pool_file`` and the ``delta_occ_leases`` connection
(``make demo`` sets both up in a throwaway Airflow; see docs/pools.md). The table lives under
``$DELTA_OCC_DEMO_ROOT``.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile

from airflow.sdk import DAG, task

from airflow_delta_occ.engine.sql_parser import render_identifier
from airflow_delta_occ.operators.delta import (
    DeltaAppendOperator,
    DeltaDeleteOperator,
    DeltaMergeOperator,
    DeltaOptimizeOperator,
    DeltaUpdateOperator,
)

ROOT = os.environ.get("DELTA_OCC_DEMO_ROOT", os.path.join(tempfile.gettempdir(), "airflow-delta-occ-demo"))
TABLE = os.path.join(ROOT, "orders")
POOL = os.environ.get("DELTA_OCC_DEMO_POOL", "demo")
#: The first id of each country's rows; every country is seeded with ids base .. base + 29.
BASES = {"DE": 0, "FR": 1000, "IT": 2000, "ES": 3000}
SEED_FILES, SEED_ROWS = 3, 10
#: The run's day as YYYY-MM-DD, for every kind of run (a manual run has no logical date).
RUN_DATE = "{{ (dag_run.logical_date or dag_run.run_after) | ds }}"


def table_sql() -> str:
    """The table in Spark SQL, its path quoted (a backtick in the path cannot end the identifier)."""
    return f"delta.{render_identifier(TABLE)}"


def day_sql(run_date: str) -> str:
    """The run's day as a DATE literal; ValueError unless it is a YYYY-MM-DD date (never spliced as text)."""
    return f"DATE'{dt.date.fromisoformat(run_date).isoformat()}'"


def seed_amount(row_id: int) -> float:
    return float(row_id % 10)


def upsert_query(country: str) -> str:
    """Five existing ids get amount 100, five new ids arrive with amount 50."""
    base = BASES[country]
    return (f"SELECT id, CASE WHEN id < {base + 100} THEN 100.0D ELSE 50.0D END AS amount, "
            f"DATE'{RUN_DATE}' AS date, '{country}' AS country "
            f"FROM (SELECT id FROM range({base}, {base + 5}) "
            f"UNION ALL SELECT id FROM range({base + 100}, {base + 105}))")


APPEND_QUERY = (f"SELECT id, 7.0D AS amount, DATE'{RUN_DATE}' AS date, 'ES' AS country "
                f"FROM range({BASES['ES'] + 100}, {BASES['ES'] + 110})")


def expected_table() -> dict[str, tuple[int, float]]:
    """``{country: (rows, sum of amount)}`` after the six writers, whatever order they commit in."""
    seeded = {c: {b + i: seed_amount(b + i) for i in range(SEED_FILES * SEED_ROWS)} for c, b in BASES.items()}
    for country in ("DE", "FR"):          # the upserts
        base = BASES[country]
        seeded[country].update({base + i: 100.0 for i in range(5)})
        seeded[country].update({base + 100 + i: 50.0 for i in range(5)})
    for i in range(5, 30):                # fix_de doubles ids 5 .. 29 of DE, which no upsert touches
        seeded["DE"][i] *= 2
    seeded["IT"] = {k: v for k, v in seeded["IT"].items() if v >= 3}   # purge_it
    seeded["ES"].update({BASES["ES"] + 100 + i: 7.0 for i in range(10)})  # append_es
    return {c: (len(rows), sum(rows.values())) for c, rows in seeded.items()}


with DAG(
    dag_id="delta_conflict_pool",
    schedule=None,
    start_date=dt.datetime(2024, 1, 1),
    catchup=False,
    max_active_tasks=6,
    tags=["delta", "example", "conflict-pool"],
    doc_md=__doc__,
) as dag:

    @task
    def seed_table(run_date: str) -> None:
        """Create the table and write SEED_FILES small files into each country's partition of the day.

        The first file replaces the day (``replaceWhere``), so a retry or a second run of the day
        starts from the same seed instead of adding to it.
        """
        from airflow_delta_occ.hooks.delta import DeltaSparkHook

        with DeltaSparkHook().job_session() as spark:
            spark.sql(f"CREATE TABLE IF NOT EXISTS {table_sql()} (id BIGINT, amount DOUBLE, date DATE, "
                      "country STRING) USING delta PARTITIONED BY (date, country)")
            for f in range(SEED_FILES):
                rows = [(b + f * SEED_ROWS + i, seed_amount(b + f * SEED_ROWS + i), run_date, c)
                        for c, b in BASES.items() for i in range(SEED_ROWS)]
                writer = spark.createDataFrame(rows, "id BIGINT, amount DOUBLE, date STRING, country STRING") \
                    .selectExpr("id", "amount", "CAST(date AS DATE) AS date", "country") \
                    .repartition(1).write.format("delta")
                if f == 0:
                    writer = writer.mode("overwrite").option("replaceWhere", f"date = {day_sql(run_date)}")
                else:
                    writer = writer.mode("append")
                writer.save(TABLE)

    def day(country: str) -> dict[str, str]:
        return {"date": RUN_DATE, "country": country}

    common = {"table": TABLE, "conflict_pool": POOL}
    writers = [
        DeltaMergeOperator(task_id="merge_de", source_query=upsert_query("DE"), merge_condition="t.id = s.id",
                           partitions=day("DE"), **common),
        DeltaUpdateOperator(task_id="fix_de", set={"amount": "amount * 2"}, where="id >= 5 AND id < 30",
                            partitions=day("DE"), **common),
        DeltaMergeOperator(task_id="merge_fr", source_query=upsert_query("FR"), merge_condition="t.id = s.id",
                           partitions=day("FR"), **common),
        DeltaDeleteOperator(task_id="purge_it", where="amount < 3", partitions=day("IT"), **common),
        DeltaOptimizeOperator(task_id="compact_es", partitions=day("ES"), **common),
        DeltaAppendOperator(task_id="append_es", source_query=APPEND_QUERY, partitions=day("ES"), **common),
    ]

    @task
    def check_table(run_date: str) -> dict[str, list[float]]:
        """Every partition's rows and sum of amount, read with Spark; fails unless they are the expected ones."""
        from airflow_delta_occ.hooks.delta import DeltaSparkHook

        with DeltaSparkHook().job_session() as spark:
            found = {r["country"]: (int(r["n"]), float(r["total"])) for r in spark.sql(
                f"SELECT country, count(*) AS n, sum(amount) AS total FROM {table_sql()} "
                f"WHERE date = {day_sql(run_date)} GROUP BY country").collect()}
        expected = expected_table()
        if found != expected:
            raise ValueError(f"the table is not what the writers must leave: found {found}, expected {expected}")
        return {country: [rows, total] for country, (rows, total) in sorted(found.items())}

    seed_table(RUN_DATE) >> writers >> check_table(RUN_DATE)
