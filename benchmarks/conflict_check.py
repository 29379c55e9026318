"""Conflict checking and commit latency of the engine.

1. Check one transaction against 100 winning commits of 1,000 add actions each (all in partitions
   the transaction did not read, so every winner is checked and the commit is rebased). Baseline in
   the same process: only reading the 100 commit files and ``json.loads`` of every line, the floor
   any checker in Python pays.
2. Commit latency with 8 competing local writers (separate processes, each appending 25 times to
   the same table), against one writer committing alone on the same machine.

Run: ``python benchmarks/conflict_check.py``; writes its section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from _report import write_section  # (run as a script: benchmarks/ is on sys.path)

from airflow_delta_occ.engine import DeltaLog, Transaction, check_winning_commit
from airflow_delta_occ.engine.actions import AddFile
from airflow_delta_occ.engine.conflicts import WinningCommit

SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "country", "type": "string", "nullable": True, "metadata": {}},
]})


def _create(root: Path) -> None:
    log = root / "_delta_log"
    log.mkdir(parents=True)
    lines = [
        {"commitInfo": {"operation": "CREATE TABLE", "isBlindAppend": True}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                      "schemaString": SCHEMA, "partitionColumns": ["country"], "configuration": {},
                      "createdTime": 0}},
        {"add": {"path": "country=DE/seed.parquet", "partitionValues": {"country": "DE"}, "size": 1,
                 "modificationTime": 0, "dataChange": True}},
    ]
    (log / f"{0:020d}.json").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def _winners(root: Path, commits: int, actions: int) -> None:
    log = root / "_delta_log"
    for v in range(1, commits + 1):
        lines = [json.dumps({"commitInfo": {"operation": "MERGE", "isBlindAppend": False, "readVersion": v - 1}})]
        for i in range(actions):
            country = f"C{i % 50:02d}"
            lines.append(json.dumps({"add": {
                "path": f"country={country}/part-{v:04d}-{i:05d}-{uuid.uuid4()}.parquet",
                "partitionValues": {"country": country}, "size": 1234, "modificationTime": 0, "dataChange": True,
                "stats": json.dumps({"numRecords": 10, "minValues": {"id": i}, "maxValues": {"id": i + 9},
                                     "nullCount": {"id": 0}})}}))
        (log / f"{v:020d}.json").write_text("\n".join(lines) + "\n")


def bench_check(runs: int) -> tuple[float, float, int]:
    root = Path(tempfile.mkdtemp(prefix="occ-bench-")) / "t"
    try:
        _create(root)
        log = DeltaLog.for_table(str(root))
        txn = Transaction(log, log.snapshot(), operation="MERGE")
        txn.remove_files(txn.read_files("country = 'DE'"))
        txn.add_files([AddFile("country=DE/new.parquet", {"country": "DE"}, 1, 0, True)])
        pending, level = txn.prepare()
        _winners(root, 100, 1000)
        files = sorted((root / "_delta_log").glob("0*.json"))[1:]

        def baseline() -> int:
            n = 0
            for f in files:
                for line in f.read_bytes().splitlines():
                    json.loads(line)
                    n += 1
            return n

        def engine() -> int:
            p = pending
            commits = log.commits_after(0)
            for c in commits:
                p = check_winning_commit(p, WinningCommit.of(c), level)
            return len(commits)

        base_t, eng_t = [], []
        for _ in range(runs):
            t = time.perf_counter()
            baseline()
            base_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            checked = engine()
            eng_t.append(time.perf_counter() - t)
        return statistics.median(eng_t) * 1000, statistics.median(base_t) * 1000, checked
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


def _writer(root: str, commits: int, start: mp.synchronize.Event, out: mp.Queue) -> None:  # type: ignore[type-arg]
    start.wait()
    latencies, attempts = [], []
    for _ in range(commits):
        t = time.perf_counter()
        txn = Transaction.start(root)
        txn.add_files([AddFile(f"country=DE/{uuid.uuid4()}.parquet", {"country": "DE"}, 1, 0, True)])
        result = txn.commit()
        latencies.append(time.perf_counter() - t)
        attempts.append(result.attempts)
    out.put((latencies, attempts))


def bench_writers(writers: int, commits: int) -> tuple[list[float], list[int], float]:
    root = Path(tempfile.mkdtemp(prefix="occ-bench-")) / "t"
    try:
        _create(root)
        ctx = mp.get_context("spawn")
        start, out = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_writer, args=(str(root), commits, start, out)) for _ in range(writers)]
        for p in procs:
            p.start()
        time.sleep(1.0)  # let every interpreter import before the race starts
        t = time.perf_counter()
        start.set()
        results = [out.get() for _ in procs]
        wall = time.perf_counter() - t
        for p in procs:
            p.join()
        latencies = [x for r in results for x in r[0]]
        attempts = [x for r in results for x in r[1]]
        versions = DeltaLog.for_table(str(root)).latest_version()
        assert versions == writers * commits, f"lost commits: {versions} != {writers * commits}"
        return latencies, attempts, wall
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--commits", type=int, default=25)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    eng, base, checked = bench_check(args.runs)
    solo, solo_attempts, solo_wall = bench_writers(1, args.commits * 2)
    many, many_attempts, many_wall = bench_writers(8, args.commits)

    def pct(xs: list[float], q: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1000

    report = "\n".join([
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}; median of {args.runs} runs.",
        "",
        "| check one transaction against winning commits | engine (ms) | read + json.loads only (ms) | ratio |",
        "|---|---:|---:|---:|",
        f"| {checked} commits x 1,000 add actions, all checked, then rebased | {eng:.1f} | {base:.1f} | "
        f"{eng / base:.2f} |",
        "",
        "| commit latency, blind appends to one local table | commits | p50 (ms) | p95 (ms) | "
        "mean attempts | commits/s |",
        "|---|---:|---:|---:|---:|---:|",
        f"| 1 writer alone (baseline) | {len(solo)} | {pct(solo, 0.5):.1f} | {pct(solo, 0.95):.1f} | "
        f"{statistics.mean(solo_attempts):.2f} | {len(solo) / solo_wall:.0f} |",
        f"| 8 competing writers (processes) | {len(many)} | {pct(many, 0.5):.1f} | {pct(many, 0.95):.1f} | "
        f"{statistics.mean(many_attempts):.2f} | {len(many) / many_wall:.0f} |",
        "",
        f"p50 latency with 8 writers / alone: {pct(many, 0.5) / pct(solo, 0.5):.1f}x; every commit landed "
        "(versions contiguous, none lost).",
    ])
    print(report)
    if not args.no_write:
        write_section("conflict_check", "Conflict check and commit latency (`benchmarks/conflict_check.py`)", report)


if __name__ == "__main__":
    main()
