"""Early abort: a long MERGE, and a foreign commit that lands early in it, with and without early abort.

    .venv/bin/python benchmarks/early_abort.py                 # 3 rounds, a MERGE of about a minute here
    .venv/bin/python benchmarks/early_abort.py --rows 8000000 --rounds 1 --no-write   # a quick look
    .venv/bin/python benchmarks/early_abort.py --mode connect  # the MERGE on a Spark Connect server

One partitioned table: partition p=1 holds ``--rows`` rows in ``FILES`` files, and the MERGE (through
``DeltaMergeOperator``, embedded mode, or with ``--mode connect`` on a Spark Connect server the benchmark starts,
``local[2]``) updates one row in each file and inserts one, so it rewrites the whole partition. A calibration
run (no foreign commit) gives the MERGE's own duration D. Each round then runs the MERGE twice on a fresh copy
of the table, once with ``early_abort=False`` and once with ``early_abort=True`` (the order alternates with the
round); at 10% of D another session commits one row into p=1 (a plain ``INSERT``, as a streaming job or another
team's tool would), which makes the MERGE's commit certain to fail.

Reported per run: the time from the MERGE's start to its committed result; the Spark seconds thrown away (the
attempt the conflict ended: ``ConflictRecord.seconds``); attempts; whether the first attempt was stopped early.
The table is checked after every run (every row once, the updates and the insert applied once).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from _report import machine, write_section  # noqa: E402

FILES = 8
INTERVAL = 1.0
FOREIGN_AT = 0.10


def build(spark: Any, path: str, rows: int) -> None:
    spark.range(0, rows, 1, FILES).selectExpr("CAST(id AS INT) AS id", "1 AS p", "0 AS v") \
        .write.format("delta").partitionBy("p").save(path)
    spark.createDataFrame([(-1, 2, 0)], "id INT, p INT, v INT").write.format("delta").mode("append").save(path)


def touched_ids(rows: int) -> list[int]:
    """One id in each file of p=1 (updated) and one new id (inserted)."""
    return [i * (rows // FILES) + 7 for i in range(FILES)] + [rows + 100]


def source(spark: Any, path: str, rows: int) -> None:
    ids = touched_ids(rows)
    spark.createDataFrame([(i, 1, 5) for i in ids], "id INT, p INT, v INT").write.format("delta").save(path)


CONNECT_CONN_ID = "delta_occ_early_abort_bench"


def merge(table: str, src: str, early: bool, task: str, conn_id: str | None) -> dict[str, Any]:
    from airflow_delta_occ.operators.delta import DeltaMergeOperator

    op = DeltaMergeOperator(
        task_id=task, table=table, source=src, merge_condition="t.id = s.id", partitions={"p": 1},
        **({"delta_conn_id": conn_id} if conn_id else {}),
        clauses=[{"kind": "matched_update", "set": {"v": "s.v"}}, {"kind": "not_matched_insert_all"}],
        conflict_policies={"ConcurrentAppendException": {"initial_delay": 0.0, "jitter": 0.0}},
        early_abort=early, early_abort_interval=INTERVAL)
    ti = SimpleNamespace(dag_id="early_abort_bench", task_id=task, map_index=-1, try_number=1)
    return op.execute({"ti": ti, "run_id": f"bench__{task}"})


def run_once(spark: Any, base: str, work: Path, src: str, rows: int, early: bool, foreign_after: float | None,
             name: str, conn_id: str | None = None) -> dict[str, Any]:
    table = str(work / name)
    shutil.copytree(base, table)
    done: dict[str, Any] = {}

    def job() -> None:
        try:
            done["result"] = merge(table, src, early, name, conn_id)
        except BaseException as exc:   # reported below
            done["error"] = exc

    thread = threading.Thread(target=job)
    started, wall = time.monotonic(), time.time()
    thread.start()
    landed = None
    if foreign_after is not None:
        time.sleep(foreign_after)
        spark.newSession().sql(f"INSERT INTO delta.`{table}` VALUES (-4242, 1, 0)").collect()
        landed = os.path.getmtime(os.path.join(table, "_delta_log", f"{2:020d}.json")) - wall
    thread.join()
    seconds = time.monotonic() - started
    if "error" in done:
        raise done["error"]
    result = done["result"]
    extra = 1 if foreign_after is not None else 0
    got = spark.sql(f"SELECT count(*) AS n, sum(v) AS s FROM delta.`{table}`").collect()[0]
    touched = ", ".join(str(i) for i in [*touched_ids(rows), -4242])
    twice = spark.sql(f"SELECT id FROM delta.`{table}` WHERE id IN ({touched}) GROUP BY id HAVING count(*) > 1"
                      ).collect()
    if (got["n"], got["s"]) != (rows + 2 + extra, 5 * (FILES + 1)) or twice:
        raise AssertionError(f"{name}: table is {tuple(got)} (rows written twice: {twice}), expected "
                             f"{(rows + 2 + extra, 5 * (FILES + 1))}")
    shutil.rmtree(table, ignore_errors=True)
    conflicts = result["conflicts"]
    return {"seconds": seconds, "attempts": result["attempts"], "landed": landed,
            "wasted": sum(c["seconds"] for c in conflicts), "early": bool(conflicts and conflicts[0]["early"]),
            "kinds": [c["kind"] for c in conflicts]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=48_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=("embedded", "connect"), default="embedded",
                        help="where the MERGE runs: this process's session, or a Spark Connect server")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="early_abort_airflow_"))
    from airflow_delta_occ.spark.session import local_delta_session

    # The tables are built, the foreign commit made and the results checked in this process's session.
    spark = local_delta_session("early-abort-bench", conf={"spark.driver.memory": "6g"})
    work = Path(tempfile.mkdtemp(prefix="early_abort_bench_"))
    try:
        with contextlib.ExitStack() as stack:
            conn_id = stack.enter_context(connect_conn(work)) if args.mode == "connect" else None
            duration, runs = measure(spark, work, args, conn_id)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    report = render(args, duration, runs)
    print(report)
    if not args.no_write:
        marker, where = ("early-abort", "") if args.mode == "embedded" else (f"early-abort-{args.mode}",
                                                                              " over Spark Connect")
        write_section(marker, f"Early abort: a doomed MERGE stopped early{where} (issue #25)", report)


@contextlib.contextmanager
def connect_conn(work: Path) -> Iterator[str]:
    """A Spark Connect server (``local[2]``, delta-spark, the MERGE's memory) and a ``delta_occ`` connection to
    it. The server runs a MERGE in one transaction (``maxAttempts=1``), as early abort needs over Connect."""
    from airflow_delta_occ.spark.connect_server import local_connect_server
    from airflow_delta_occ.spark.early_abort import MATERIALIZED_SOURCE_ATTEMPTS
    from airflow_delta_occ.spark.session import delta_submit_conf

    conf = {**delta_submit_conf(), "spark.driver.memory": "6g", "spark.ui.enabled": "false",
            MATERIALIZED_SOURCE_ATTEMPTS: "1"}
    with local_connect_server(work / "connect", conf) as server:
        os.environ[f"AIRFLOW_CONN_{CONNECT_CONN_ID.upper()}"] = json.dumps(
            {"conn_type": "delta_occ", "extra": {"mode": "connect", "connect_url": server.url}})
        print(f"Spark Connect server at {server.url} (started in {server.start_seconds} s)", file=sys.stderr)
        yield CONNECT_CONN_ID


def measure(spark: Any, work: Path, args: argparse.Namespace, conn_id: str | None
            ) -> tuple[float, dict[bool, list[dict[str, Any]]]]:
    """The calibration run's duration and every round's runs, by whether early abort was on."""
    base, src = str(work / "base"), str(work / "src")
    t0 = time.monotonic()
    build(spark, base, args.rows)
    source(spark, src, args.rows)
    print(f"built {args.rows:,} rows in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    calibration = run_once(spark, base, work, src, args.rows, False, None, "calibration", conn_id)
    duration = float(calibration["seconds"])
    print(f"the MERGE alone: {duration:.1f} s", file=sys.stderr)
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for r in range(args.rounds):
        for early in ((False, True) if r % 2 == 0 else (True, False)):
            run = run_once(spark, base, work, src, args.rows, early, FOREIGN_AT * duration,
                           f"round{r}_{'early' if early else 'plain'}", conn_id)
            runs[early].append(run)
            print(f"round {r} early_abort={early}: {run}", file=sys.stderr)
    return duration, runs


def render(args: argparse.Namespace, duration: float, runs: dict[bool, list[dict[str, Any]]]) -> str:
    def median(early: bool, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[early]))

    def spread(early: bool, key: str) -> str:
        values = [r[key] for r in runs[early]]
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}; `python benchmarks/early_abort.py --rows {args.rows} "
        f"--rounds {args.rounds} --mode {args.mode}`. A MERGE through `DeltaMergeOperator` ("
        f"{'embedded' if args.mode == 'embedded' else 'on a Spark Connect server'}, `local[2]`) rewrites partition "
        f"p=1 ({args.rows:,} rows in {FILES} files): {duration:.1f} s alone (calibration run). At "
        f"{FOREIGN_AT:.0%} of that, another session commits one row into p=1, which dooms the MERGE's commit "
        f"(ConcurrentAppendException). Watch interval {INTERVAL:g} s. Medians (min-max) over {args.rounds} "
        "round(s); each round runs both, alternating which goes first, on a fresh copy of the table.",
        "",
        "| early abort | runs | to the committed result (s) | Spark seconds thrown away | foreign commit landed (s "
        "into the MERGE) | attempts | stopped early |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for early in (False, True):
        lines.append(f"| {'on' if early else 'off'} | {len(runs[early])} | {spread(early, 'seconds')} | "
                     f"{spread(early, 'wasted')} | {spread(early, 'landed')} | {median(early, 'attempts'):g} | "
                     f"{sum(r['early'] for r in runs[early])} of {len(runs[early])} |")
    lines += ["",
              f"- Time to the committed result: {median(False, 'seconds') / median(True, 'seconds'):.2f}x shorter "
              "with early abort (medians).",
              f"- Spark seconds thrown away: {median(False, 'wasted'):.1f} s without, {median(True, 'wasted'):.1f} s "
              "with early abort (medians)."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
