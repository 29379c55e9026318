"""Snapshot load and incremental update: the engine against delta-rs (``deltalake``) on the same log.

The table has 100,000 live files: version 0 adds them, delta-rs writes the checkpoint at version 0
(so the checkpoint is not in a format of our own making), then 50 JSON commits each add 20 files and
remove 10. Data files are not written: both readers only read the log.

Measured in one process, alternating the two readers, median of several runs:
- full load: open the table at its newest version and list the live file paths;
- one-commit update: a loaded snapshot brought forward by one new commit.

Run: ``python benchmarks/snapshot_load.py [--files N] [--runs R]``; writes ``docs/benchmarks.md``
(the section between the markers) with the figures exactly as measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import deltalake
from _report import write_section  # (run as a script: benchmarks/ is on sys.path)
from deltalake import DeltaTable

from airflow_delta_occ.engine import DeltaLog

SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "amount", "type": "double", "nullable": True, "metadata": {}},
    {"name": "date", "type": "string", "nullable": True, "metadata": {}},
]})


def _add(i: int) -> str:
    date = f"2024-{(i % 12) + 1:02d}-{(i % 28) + 1:02d}"
    stats = json.dumps({"numRecords": 1000, "minValues": {"id": i * 1000, "amount": 0.5},
                        "maxValues": {"id": i * 1000 + 999, "amount": 99.5}, "nullCount": {"id": 0, "amount": 3}})
    return json.dumps({"add": {"path": f"date={date}/part-{i:07d}.parquet", "partitionValues": {"date": date},
                               "size": 123456, "modificationTime": 1700000000000, "dataChange": True,
                               "stats": stats}})


def _remove(i: int) -> str:
    """The remove action for the file ``_add(i)`` wrote: other benchmarks append commits that drop files."""
    return json.dumps({"remove": {"path": json.loads(_add(i))["add"]["path"], "dataChange": True,
                                  "deletionTimestamp": 1700000000000}})


def _commit(log_dir: Path, version: int, lines: list[str]) -> None:
    info = json.dumps({"commitInfo": {"timestamp": 1700000000000 + version, "operation": "WRITE",
                                      "operationParameters": {"mode": "Append"}, "isBlindAppend": False}})
    (log_dir / f"{version:020d}.json").write_text("\n".join([info, *lines]) + "\n")


def build_table(root: Path, files: int, commits: int) -> int:
    log_dir = root / "_delta_log"
    log_dir.mkdir(parents=True)
    header = [
        json.dumps({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}),
        json.dumps({"metaData": {"id": "bench", "format": {"provider": "parquet", "options": {}},
                                 "schemaString": SCHEMA, "partitionColumns": ["date"], "configuration": {},
                                 "createdTime": 1700000000000}}),
    ]
    _commit(log_dir, 0, header + [_add(i) for i in range(files)])
    DeltaTable(str(root)).create_checkpoint()
    next_id = files
    for version in range(1, commits + 1):
        lines = [_add(next_id + k) for k in range(20)]
        next_id += 20
        removed = [(version - 1) * 10 + k for k in range(10)]
        lines += [_remove(r) for r in removed]
        _commit(log_dir, version, lines)
    return next_id


def _time(fn: Callable[[], object], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--commits", type=int, default=50)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--no-write", action="store_true", help="print only, do not update docs")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="delta-occ-bench-"))
    try:
        table = work / "t"
        t0 = time.perf_counter()
        next_id = build_table(table, args.files, args.commits)
        build_s = time.perf_counter() - t0
        uri = str(table)
        expected = args.files + 10 * args.commits

        def ours_full() -> int:
            snap = DeltaLog.for_table(uri).snapshot()
            return len(snap.file_paths())

        def rs_full() -> int:
            return len(DeltaTable(uri).file_uris())

        assert ours_full() == expected, ours_full()
        assert rs_full() == expected, rs_full()
        ours_full_s: list[float] = []
        rs_full_s: list[float] = []
        for _ in range(args.runs):  # alternate so both see the same machine state
            ours_full_s += _time(ours_full, 1)
            rs_full_s += _time(rs_full, 1)

        ours_open_s = _time(lambda: DeltaLog.for_table(uri).snapshot(), args.runs)
        rs_open_s = _time(lambda: DeltaTable(uri), args.runs)

        # One-commit incremental update.
        ours_update_s: list[float] = []
        rs_update_s: list[float] = []
        version = args.commits
        for _ in range(args.runs):
            snap = DeltaLog.for_table(uri).snapshot()
            rs = DeltaTable(uri)
            version += 1
            _commit(table / "_delta_log", version, [_add(next_id)])
            next_id += 1
            start = time.perf_counter()
            snap = snap.update()
            ours_update_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            rs.update_incremental()
            rs_update_s.append(time.perf_counter() - start)
            assert snap.version == rs.version() == version
            assert snap.num_files == len(rs.file_uris())
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def ms(samples: list[float]) -> float:
        return statistics.median(samples) * 1000

    rows = [
        ("full load + list file paths", ms(ours_full_s), ms(rs_full_s)),
        ("open snapshot only", ms(ours_open_s), ms(rs_open_s)),
        ("update by one commit", ms(ours_update_s), ms(rs_update_s)),
    ]
    lines = [
        f"Table: {args.files:,} files in a checkpoint written by delta-rs + {args.commits} JSON commits "
        f"(+20/-10 files each), {expected:,} live files; median of {args.runs} runs; "
        f"table built in {build_s:.1f} s.",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, deltalake {deltalake.__version__}.",
        "",
        "| operation | airflow-delta-occ engine (ms) | delta-rs (ms) | engine / delta-rs |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.2f} |" for name, a, b in rows),
    ]
    report = "\n".join(lines)
    print(report)
    if not args.no_write:
        write_section("snapshot_load", "Snapshot load (`benchmarks/snapshot_load.py`)", report)


if __name__ == "__main__":
    main()
