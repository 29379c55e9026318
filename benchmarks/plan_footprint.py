"""Planning cost: the footprint of an UPDATE on a 100,000-file table, the engine against delta-rs.

Conflict pools re-plan every waiting job whenever the table moves, so what matters is how long it
takes to turn (snapshot, predicate) into the set of files a job will read and rewrite, and how long
it takes to do that again one commit later. The table is ``snapshot_load.build_table``'s (a delta-rs
checkpoint of ``--files`` adds partitioned by ``date``, stats on ``id`` and ``amount``, then JSON
commits); only the log exists, since file selection reads nothing else.

Measured in one process, alternating the engine and delta-rs in every round:

a. ``plan_footprint(snapshot, "UPDATE", "date = '2024-03-15' AND id >= X AND id < Y")`` on a loaded
   snapshot, X/Y chosen so statistics prune the partition down to ``--select`` files;
b. the same file selection on a loaded ``DeltaTable``, three ways: delta-rs 1.6's own stats pruning
   (``file_uris(file_pruning_predicate=...)``), ``get_add_actions(flatten=True)`` filtered with
   pyarrow.compute (partition equality and min/max overlap), and a pyarrow dataset
   (``to_pyarrow_dataset(file_pruning_predicate=...)`` then its fragments). A dataset built once
   without a predicate and listed with ``get_fragments(filter=...)`` is timed too, its build apart,
   since it must be rebuilt whenever the table moves. Every way must select the same paths;
c. one new commit (adds and removes in other partitions), then ``snapshot.update()`` and the plan
   again, against ``update_incremental()`` / ``load_as_version(latest)`` and the same selection.

Run: ``python benchmarks/plan_footprint.py [--files N] [--runs R]``; writes its section of
``docs/benchmarks.md`` with the figures exactly as measured.
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
from collections.abc import Callable, Iterator
from pathlib import Path

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from _report import write_section  # (run as a script: benchmarks/ is on sys.path)
from deltalake import DeltaTable
from snapshot_load import _add, _commit, _remove, build_table

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.planner import plan_footprint
from airflow_delta_occ.engine.snapshot import Snapshot

TARGET = "2024-03-15"
UPDATE_GOAL_MS = 10.0


def _date(i: int) -> str:
    """The partition ``snapshot_load._add(i)`` puts file ``i`` in (read back, so the layout lives in one place)."""
    return str(json.loads(_add(i))["add"]["partitionValues"]["date"])


def _min_id(i: int) -> int:
    return int(json.loads(json.loads(_add(i))["add"]["stats"])["minValues"]["id"])


def _files_outside_target(start: int) -> Iterator[int]:
    """File numbers from ``start`` whose partition is not the target: commits in (c) touch only those."""
    i = start
    while True:
        if _date(i) != TARGET:
            yield i
        i += 1


def _id_range(files: int, select: int) -> tuple[int, int, list[int]]:
    """[X, Y) covering ``select`` consecutive target-partition files from the middle of the checkpoint.

    The middle keeps clear of the files ``build_table``'s commits remove (the first ones); Y is the
    smallest id of the next target file, so min/max pruning keeps exactly ``select`` files.
    """
    picked = []
    i = files // 2
    while len(picked) < select + 1:
        if _date(i) == TARGET:
            picked.append(i)
        i += 1
    if picked[-1] >= files:
        raise SystemExit(f"--files {files} is too small for {select} files of partition {TARGET}")
    return _min_id(picked[0]), _min_id(picked[-1]), picked[:-1]


def _ms(samples: list[float]) -> tuple[float, float, float]:
    """Median, min and max in milliseconds."""
    return statistics.median(samples) * 1000, min(samples) * 1000, max(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--commits", type=int, default=50)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--select", type=int, default=4, help="files the predicate's id range covers")
    parser.add_argument("--no-write", action="store_true", help="print only, do not update docs")
    args = parser.parse_args()

    x, y, picked = _id_range(args.files, args.select)
    predicate = f"date = '{TARGET}' AND id >= {x} AND id < {y}"
    dataset_filter = (ds.field("date") == TARGET) & (ds.field("id") >= x) & (ds.field("id") < y)

    work = Path(tempfile.mkdtemp(prefix="delta-occ-bench-"))
    try:
        table = work / "t"
        t0 = time.perf_counter()
        next_id = build_table(table, args.files, args.commits)
        build_s = time.perf_counter() - t0
        uri = str(table)
        prefix = uri.rstrip("/") + "/"
        expected = {json.loads(_add(i))["add"]["path"] for i in picked}

        def ours(snap: Snapshot) -> set[str]:
            return set(plan_footprint(snap, "UPDATE", predicate).removes)

        def rs_native(dt: DeltaTable) -> set[str]:
            uris = dt.file_uris(file_pruning_predicate=predicate)
            assert all(u.startswith(prefix) for u in uris), uris[:3]
            return {u[len(prefix):] for u in uris}

        def rs_actions(dt: DeltaTable) -> set[str]:
            # Files without statistics must stay selected (null comparison -> kept), as the engine keeps them.
            actions = pa.table(dt.get_add_actions(flatten=True))
            overlap = pc.and_(pc.fill_null(pc.greater_equal(actions["max.id"], x), True),
                              pc.fill_null(pc.less(actions["min.id"], y), True))
            mask = pc.and_(pc.fill_null(pc.equal(actions["partition.date"], TARGET), False), overlap)
            return set(actions.filter(mask)["path"].to_pylist())

        def rs_dataset(dt: DeltaTable) -> set[str]:
            return {f.path for f in dt.to_pyarrow_dataset(file_pruning_predicate=predicate).get_fragments()}

        def rs_prebuilt(dataset: ds.FileSystemDataset) -> set[str]:
            return {f.path for f in dataset.get_fragments(filter=dataset_filter)}

        # (a) + (b): one loaded snapshot and one loaded DeltaTable, each way timed once per round.
        snap = DeltaLog.for_table(uri).snapshot()
        dt = DeltaTable(uri)
        t0 = time.perf_counter()
        prebuilt = dt.to_pyarrow_dataset()
        prebuild_s = time.perf_counter() - t0
        ways: dict[str, Callable[[], set[str]]] = {
            "engine": lambda: ours(snap),
            "native": lambda: rs_native(dt),
            "actions": lambda: rs_actions(dt),
            "dataset": lambda: rs_dataset(dt),
            "prebuilt": lambda: rs_prebuilt(prebuilt),
        }
        for name, way in ways.items():  # also the warm-up call
            got = way()
            if got != expected:
                raise SystemExit(f"{name} selected {sorted(got)}, expected {sorted(expected)}")
        plan_s: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.runs):
            for name, way in ways.items():
                start = time.perf_counter()
                way()
                plan_s[name].append(time.perf_counter() - start)

        # (c): a new commit in other partitions, then bring each reader forward and select again.
        dt_load = DeltaTable(uri)
        version = dt.version()
        assert snap.version == version == dt_load.version()
        new_ids = _files_outside_target(next_id)
        removable = _files_outside_target(10 * args.commits)  # build_table removed the files before this
        upd: dict[str, list[float]] = {k: [] for k in ("engine", "rs_inc", "rs_load")}
        sel: dict[str, list[float]] = {k: [] for k in ("engine", "rs_inc_native", "rs_inc_actions", "rs_load")}
        for _ in range(args.runs):
            version += 1
            _commit(table / "_delta_log", version, [_add(next(new_ids)) for _ in range(3)]
                    + [_remove(next(removable)) for _ in range(2)])

            t0 = time.perf_counter()
            snap = snap.update()
            t1 = time.perf_counter()
            got_ours = ours(snap)
            t2 = time.perf_counter()
            upd["engine"].append(t1 - t0)
            sel["engine"].append(t2 - t1)

            t0 = time.perf_counter()
            dt.update_incremental()
            t1 = time.perf_counter()
            got_native = rs_native(dt)
            t2 = time.perf_counter()
            got_actions = rs_actions(dt)
            t3 = time.perf_counter()
            upd["rs_inc"].append(t1 - t0)
            sel["rs_inc_native"].append(t2 - t1)
            sel["rs_inc_actions"].append(t3 - t2)

            t0 = time.perf_counter()
            dt_load.load_as_version(version)
            t1 = time.perf_counter()
            got_load = rs_actions(dt_load)
            t2 = time.perf_counter()
            upd["rs_load"].append(t1 - t0)
            sel["rs_load"].append(t2 - t1)

            assert snap.version == dt.version() == dt_load.version() == version
            assert snap.num_files == len(dt.file_uris())
            for name, got in (("engine", got_ours), ("native", got_native), ("actions", got_actions),
                              ("load_as_version", got_load)):
                if got != expected:
                    raise SystemExit(f"after update, {name} selected {sorted(got)}, expected {sorted(expected)}")
        live_files = snap.num_files
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def total(u: str, s: str) -> list[float]:
        return [a + b for a, b in zip(upd[u], sel[s], strict=True)]

    def row(name: str, samples: list[float]) -> str:
        med, lo, hi = _ms(samples)
        return f"| {name} | {med:.1f} | {lo:.1f} | {hi:.1f} |"

    engine_plan = _ms(plan_s["engine"])[0]
    rs_ways = {
        "`file_uris(file_pruning_predicate=...)`": plan_s["native"],
        "`get_add_actions(flatten=True)` + pyarrow.compute": plan_s["actions"],
        "`to_pyarrow_dataset(file_pruning_predicate=...)` + fragments": plan_s["dataset"],
    }
    best_rs_name, best_rs = min(((n, _ms(s)[0]) for n, s in rs_ways.items()), key=lambda item: item[1])
    replans = {
        "engine: `snapshot.update()` + `plan_footprint`": (upd["engine"], sel["engine"], total("engine", "engine")),
        "delta-rs: `update_incremental()` + `file_uris(file_pruning_predicate=...)`":
            (upd["rs_inc"], sel["rs_inc_native"], total("rs_inc", "rs_inc_native")),
        "delta-rs: `update_incremental()` + `get_add_actions` filter":
            (upd["rs_inc"], sel["rs_inc_actions"], total("rs_inc", "rs_inc_actions")),
        "delta-rs: `load_as_version(latest)` + `get_add_actions` filter":
            (upd["rs_load"], sel["rs_load"], total("rs_load", "rs_load")),
    }
    engine_replan = _ms(total("engine", "engine"))[0]
    best_rs_replan = min(_ms(t)[0] for name, (_, _, t) in replans.items() if name.startswith("delta-rs"))

    def verdict(ok: bool) -> str:
        return "MET" if ok else "NOT MET"

    lines = [
        f"Table: {args.files:,} files in a checkpoint written by delta-rs + {args.commits} JSON commits, "
        f"partitioned by `date`, stats on `id` and `amount` (built in {build_s:.1f} s); {live_files:,} live files "
        f"after (c). Predicate: `{predicate}`, which statistics prune to {len(expected)} files of one "
        f"partition; every way below selected exactly those paths (checked each round). "
        f"Median (min / max) of {args.runs} rounds, engine and delta-rs alternating.",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, deltalake {deltalake.__version__}, "
        f"pyarrow {pa.__version__}.",
        "",
        "delta-rs 1.6 does prune files on min/max statistics for a SQL predicate "
        "(`file_uris(file_pruning_predicate=...)`), so that is its native way; filtering "
        "`get_add_actions(flatten=True)` with pyarrow.compute (partition equality, min/max overlap) is the "
        "do-it-yourself way.",
        "",
        "| (a, b) select the files of the UPDATE on a loaded table | median (ms) | min (ms) | max (ms) |",
        "|---|---:|---:|---:|",
        row("engine: `plan_footprint(snapshot, \"UPDATE\", predicate)`", plan_s["engine"]),
        *(row(f"delta-rs: {name}", samples) for name, samples in rs_ways.items()),
        row(f"delta-rs: prebuilt `to_pyarrow_dataset()` + `get_fragments(filter=...)` "
            f"(build not included: {prebuild_s * 1000:.0f} ms, once per table version)", plan_s["prebuilt"]),
        "",
        "| (c) one new commit, then bring the table forward and select again | update (ms) | select (ms) "
        "| total median (ms) | total min (ms) | total max (ms) |",
        "|---|---:|---:|---:|---:|---:|",
        *(f"| {name} | {_ms(u)[0]:.1f} | {_ms(s)[0]:.1f} | {_ms(t)[0]:.1f} | {_ms(t)[1]:.1f} | {_ms(t)[2]:.1f} |"
          for name, (u, s, t) in replans.items()),
        "",
        f"- Goal \"planning faster than delta-rs\": engine {engine_plan:.1f} ms vs fastest delta-rs way on a loaded "
        f"table ({best_rs_name}) {best_rs:.1f} ms: **{verdict(engine_plan < best_rs)}**; "
        f"update + re-plan {engine_replan:.1f} ms vs fastest delta-rs {best_rs_replan:.1f} ms: "
        f"**{verdict(engine_replan < best_rs_replan)}**.",
        f"- Goal \"update + re-plan under {UPDATE_GOAL_MS:.0f} ms\": engine {engine_replan:.1f} ms: "
        f"**{verdict(engine_replan < UPDATE_GOAL_MS)}**.",
    ]
    report = "\n".join(lines)
    print(report)
    if not args.no_write:
        write_section("plan_footprint", "Planning cost: footprint on a 100,000-file table", report)


if __name__ == "__main__":
    main()
