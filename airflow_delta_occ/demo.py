"""``make demo``: run the example DAG through Airflow on embedded Spark, then show what happened.

The DAG (``dags_examples/delta_concurrent_merges.py``) merges one source per country into one
Delta table, each MERGE confined to its partition by ``partitions=``, then compacts the day. The
demo runs it with ``airflow dags test`` in a throwaway AIRFLOW_HOME (SQLite), then reads the
table's log with the engine, without Spark: every commit, the run that made it, its attempts, and
the file set each partition-confined job reads (the footprint a conflict pool compares).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    from airflow_delta_occ.engine import DeltaLog
    from airflow_delta_occ.engine.planner import Operation, can_conflict, plan_footprint

    work = Path(tempfile.mkdtemp(prefix="delta-occ-demo-"))
    env = {**os.environ, "AIRFLOW_HOME": str(work / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags_examples"), "DELTA_OCC_DEMO_ROOT": str(work / "lake")}
    airflow = [sys.executable, "-m", "airflow"]
    print(f"Airflow home and lake in {work}")
    subprocess.run([*airflow, "db", "migrate"], env=env, check=True, capture_output=True)
    print("running DAG delta_concurrent_merges with `airflow dags test` (embedded Spark + delta-spark) ...")
    started = time.perf_counter()
    run = subprocess.run([*airflow, "dags", "test", "delta_concurrent_merges", "2024-01-01"], env=env,
                         capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stdout[-5000:], run.stderr[-5000:], sep="\n")
        raise SystemExit(f"the DAG failed (exit {run.returncode})")
    print(f"  DAG run succeeded in {time.perf_counter() - started:.0f} s\n")

    log = DeltaLog.for_table(str(work / "lake" / "sales"))
    snapshot = log.snapshot()
    print(f"table {log.table_uri}: version {snapshot.version}, {snapshot.num_files} files, "
          f"partitioned by {', '.join(snapshot.partition_columns)}")
    print("commits (read with the engine, no Spark):")
    for commit in reversed(log.history()):
        info = commit.commit_info
        if info is None:
            continue
        tag = json.loads(info.user_metadata).get("airflow", {}) if info.user_metadata else {}
        who = f"{tag['task_id']}[{tag['map_index']}] try {tag['try_number']}" if tag else "-"
        metrics = info.operation_metrics
        rows = metrics.get("numTargetRowsInserted") or metrics.get("numOutputRows") or ""
        read = f"v{info.read_version}" if info.read_version is not None else "-"
        print(f"  v{commit.version:<3} {info.operation:<14} by {who:<24} read {read}, "
              f"isolation {info.isolation_level}" + (f", rows inserted {rows}" if rows else ""))
    de = plan_footprint(snapshot, Operation.MERGE, "date = DATE'2024-01-01' AND country = 'DE'",
                        write_partitions=[{"date": "2024-01-01", "country": "DE"}], label="MERGE DE")
    fr = plan_footprint(snapshot, Operation.MERGE, "date = DATE'2024-01-01' AND country = 'FR'",
                        write_partitions=[{"date": "2024-01-01", "country": "FR"}], label="MERGE FR")
    whole = plan_footprint(snapshot, Operation.MERGE, None, label="MERGE without partitions")
    print(f"\na MERGE confined to DE reads {len(de.read_files)} of {snapshot.num_files} files")
    for a, b in ((de, fr), (de, whole)):
        verdict = can_conflict(a, b, snapshot)
        print(f"  {a.label} vs {b.label}: {'CONFLICT' if verdict.conflict else 'no conflict'} "
              f"({verdict.exception or 'commits side by side'})")


if __name__ == "__main__":
    main()
