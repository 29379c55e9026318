"""What early abort costs a job that no commit dooms: the same small jobs with it off and on, alternating.

    .venv/bin/python benchmarks/early_abort_overhead.py             # 8 rounds, then docs/benchmarks.md
    .venv/bin/python benchmarks/early_abort_overhead.py --rounds 2 --no-write

One table partitioned by ``p`` (``--rows`` rows in p=1, a few in p=2), embedded mode. Each round runs each job
twice on the same table, once with ``early_abort=False`` and once with ``early_abort=True`` (the order alternates
with the round), and nothing else writes: the watch has nothing to stop, so any difference is its cost (pinning
the read version: the watch's own listing of the log, then a history read; the helper thread; the ``LIMIT 1``
query of an UPDATE or a DELETE whose condition the log's statistics cannot show a row meets). The UPDATE of p=1
is certain to commit from the log alone; the UPDATE of one row needs the query; the MERGE's source check counts
its rows, so it asks Spark nothing more. Reported per job: the median time through ``execute`` off and on, and
the difference.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from _report import machine, write_section  # noqa: E402


def jobs(table: str, source: str) -> dict[str, Any]:
    """Job name -> a function of ``early`` that builds its operator (p=1 only; each run changes the table, so
    every run has work to do)."""
    from airflow_delta_occ.operators.delta import DeltaMergeOperator, DeltaUpdateOperator

    common: dict[str, Any] = {"table": table, "partitions": {"p": 1}}
    return {
        "UPDATE of p=1": lambda early: DeltaUpdateOperator(task_id="update", set={"v": "v + 1"},
                                                           early_abort=early, **common),
        "UPDATE of one row of p=1 (id = 4242)": lambda early: DeltaUpdateOperator(
            task_id="update_row", set={"v": "v + 1"}, where="id = 4242", early_abort=early, **common),
        "MERGE of 10 rows into p=1": lambda early: DeltaMergeOperator(
            task_id="merge", source=source, merge_condition="t.id = s.id", early_abort=early,
            clauses=[{"kind": "matched_update", "set": {"v": "s.v"}}, {"kind": "not_matched_insert_all"}],
            **common),
    }


def run(op: Any, run_id: str) -> float:
    ti = SimpleNamespace(dag_id="early_abort_overhead", task_id=op.task_id, map_index=-1, try_number=1)
    started = time.monotonic()
    op.execute({"ti": ti, "run_id": run_id})
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="early_abort_overhead_airflow_"))
    from airflow_delta_occ.spark.session import local_delta_session

    spark = local_delta_session("early-abort-overhead")
    work = Path(tempfile.mkdtemp(prefix="early_abort_overhead_"))
    times: dict[tuple[str, bool], list[float]] = {}
    try:
        table, source = str(work / "t"), str(work / "src")
        spark.range(0, args.rows, 1, 2).selectExpr("CAST(id AS INT) AS id", "1 AS p", "0 AS v") \
            .write.format("delta").partitionBy("p").save(table)
        spark.createDataFrame([(-1, 2, 0)], "id INT, p INT, v INT").write.format("delta").mode("append").save(table)
        spark.createDataFrame([(i * 997, 1, 5) for i in range(10)], "id INT, p INT, v INT") \
            .write.format("delta").save(source)
        builders = jobs(table, source)
        for name, build in builders.items():   # warm-up, not counted
            run(build(False), f"warm__{name}")
        for r in range(args.rounds):
            for name, build in builders.items():
                for early in ((False, True) if r % 2 == 0 else (True, False)):
                    times.setdefault((name, early), []).append(run(build(early), f"r{r}__{name}__{early}"))
            print(f"round {r}: " + ", ".join(f"{k[0]} {'on' if k[1] else 'off'} {v[-1]:.2f} s"
                                             for k, v in times.items()), flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = ["| job | early abort off | on | on - off |", "|---|---:|---:|---:|"]
    for name in builders:
        off, on = statistics.median(times[(name, False)]), statistics.median(times[(name, True)])
        rows.append(f"| {name} | {off:.2f} s | {on:.2f} s | {on - off:+.2f} s ({(on - off) / off:+.0%}) |")
    report = "\n".join([
        f"Measured by `benchmarks/early_abort_overhead.py` on {machine()}: a table of {args.rows:,} rows in p=1, "
        f"embedded mode, {args.rounds} rounds, each job once off and once on per round (order alternating), no "
        "other writer. Medians of the time through `execute` (planning, the Spark job, the commit check).",
        "",
        *rows,
    ])
    print(report)
    if not args.no_write:
        write_section("early-abort-overhead", "Early abort: what it costs a job nothing dooms", report)


if __name__ == "__main__":
    main()
