"""``make demo``: write a Delta table with real delta-spark, then read it with the engine (no Spark).

Shows what the provider's scheduler-side code sees: the table's version, partitioning and
isolation level, which files a partition-scoped job would read (the footprint a conflict pool
compares), and the commits that landed after a given version.
"""

from __future__ import annotations

import tempfile
import time


def main() -> None:
    from airflow_delta_occ.engine import DeltaLog
    from airflow_delta_occ.spark.session import local_delta_session

    print("starting a local Spark session with delta-spark (first run downloads the jars) ...")
    started = time.perf_counter()
    spark = local_delta_session("airflow-delta-occ-demo")
    print(f"  ready in {time.perf_counter() - started:.1f} s")
    path = tempfile.mkdtemp(prefix="delta-occ-demo-") + "/sales"
    table = f"delta.`{path}`"
    spark.sql(f"CREATE TABLE {table} (id BIGINT, amount DOUBLE, date DATE, country STRING) "
              "USING delta PARTITIONED BY (date, country)")
    for day in (1, 2, 3):
        for country in ("DE", "FR"):
            spark.sql(f"INSERT INTO {table} SELECT id, id * 1.5, DATE'2024-01-0{day}', '{country}' "
                      f"FROM range({day * 10}, {day * 10 + 5})")
    spark.sql(f"""MERGE INTO {table} t USING (SELECT 11 AS id, 99.0 AS amount) s
                  ON t.id = s.id AND t.date = DATE'2024-01-02' AND t.country = 'DE'
                  WHEN MATCHED THEN UPDATE SET t.amount = s.amount""")
    spark.stop()

    log = DeltaLog.for_table(path)
    snapshot = log.snapshot()
    print(f"\ntable {path}")
    print(f"  version {snapshot.version}, {snapshot.num_files} live files, partitioned by "
          f"{', '.join(snapshot.partition_columns)}, isolation level {snapshot.isolation_level}")
    for predicate in ("date = '2024-01-02' AND country = 'DE'", "country = 'FR'", "amount > 100"):
        files = snapshot.files_matching(predicate)
        print(f"  a job filtering on {predicate!r} reads {len(files)} of {snapshot.num_files} files")
    print("  commits after version 3:")
    for commit in log.commits_after(3):
        info = commit.commit_info
        print(f"    v{commit.version}: {info.operation if info else '?'} "
              f"(read version {info.read_version if info else '?'}, "
              f"blind append {info.is_blind_append if info else '?'})")
    old = log.snapshot(2)
    print(f"  time travel: version 2 had {old.num_files} files; update() brings it to "
          f"version {old.update().version}")


if __name__ == "__main__":
    main()
