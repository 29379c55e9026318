"""The headline benchmark's workload: K concurrent writers to one Delta table, and what they must leave.

Pure Python (no Spark, no Airflow): the orchestrator (``headline.py``), the DAG file
(``headline_dags/headline.py``, through the JSON this module writes) and the naive job
(``headline_job.py``) all take their writers from here.

Two tables, the same rows, ``(id BIGINT, p INT, m STRING, u STRING)``:

* ``partitioned``: partitioned by ``p``; partitions ``0 .. P-1`` of ``ROWS`` rows each, ``FILES`` files
  per partition.
* ``dv``: not partitioned, deletion vectors on (``delta.enableDeletionVectors``). OSS delta-spark has
  no row-level concurrency, so every pair of non-blind writers can conflict here.

Writer ``i`` of ``K`` runs ``OPS[i % 5]`` (MERGE, OPTIMIZE, UPDATE, append, DELETE). The first half of
the writers share partitions two by two (writers 0 and 1 on partition 0, ...): that is the
overlapping part; the second half each get a partition of their own. Every writer touches its own
id range, and each changes one column or removes or adds rows, so the final table is the same in any
commit order (what lets every mode be checked against one expected table).

The ``disjoint`` mode runs the same K writers so that none conflicts: each on its own copy of the
seed table (``table_template(...)/<task_id>``). Copies rather than partitions: on the unpartitioned
table every non-blind pair conflicts whatever rows it touches, so only separate tables take the
conflicts away there, and a copy of the whole seed table keeps each job's data volume (what a job on
the unpartitioned table scans is the whole table) exactly the real run's. Each copy must then hold
the seed plus that one writer's change (``expected_groups(k, table, only=task_id)``).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROWS = 200_000           # rows per partition
FILES = 4                # files per partition in the seed table (what OPTIMIZE compacts)
HALF = ROWS // 2         # the id range one writer touches
APPEND_BASE = 100_000_000
OPS = ("merge", "optimize", "update", "append", "delete")
TABLES = ("partitioned", "dv")
MODES = ("serial", "disjoint", "naive", "inject", "provider", "deferred", "worker")
#: The modes whose writers take a conflict pool's lease (their hand-overs are measured).
POOL_MODES = ("provider", "deferred", "worker")
MODE_LABELS = {"naive": "(a) naive", "inject": "(b) injection only", "provider": "(c) provider, default settings",
               "deferred": "(c'') provider, forced deferred", "worker": "(c') provider, forced worker",
               "serial": "(d) serial", "disjoint": "(e) disjoint (no conflicts)"}
MODE_TITLES = {
    "naive": "(a) naive: SparkSubmitOperator, the author's conditions, Airflow retries",
    "inject": "(b) predicate injection only (provider operators, no pool, no in-job retries)",
    "provider": "(c) the full provider with its default settings: injection, conflict pool, typed retries "
                "(no `deferrable` argument passed)",
    "deferred": "(c'') the same with `deferrable=True`: a writer always waits for its lease deferred, in the "
                "triggerer",
    "worker": "(c') the same with `deferrable=False`: a writer always waits for its lease in the worker",
    "serial": "(d) everything serial: one Airflow pool slot",
    "disjoint": "(e) the same K writers, none conflicting: each on its own copy of the seed table (the same "
                "data volume per job), all at once, provider operators without a pool (what the achievable bound "
                "is measured with)",
}


@dataclass(frozen=True)
class Writer:
    """One concurrent job: its operation, the partition it writes (None on the unpartitioned table)
    and the id range ``[lo, hi)`` it changes or adds."""

    task_id: str
    op: str
    partition: int
    lo: int
    hi: int
    partitioned: bool

    # -- the provider's operators --------------------------------------------------------------------
    def range_sql(self) -> str:
        return f"id >= {self.lo} AND id < {self.hi}"

    def source_query(self) -> str:
        if self.op == "merge":
            return f"SELECT id, {self.partition} AS p, 'merged' AS m FROM range({self.lo}, {self.hi})"
        if self.op == "append":
            return (f"SELECT id, {self.partition} AS p, 'appended' AS m, CAST(NULL AS STRING) AS u "
                    f"FROM range({self.lo}, {self.hi})")
        raise ValueError(f"{self.op} has no source")

    def where(self) -> str:
        if self.op == "update":
            return self.range_sql()
        if self.op == "delete":
            return f"{self.range_sql()} AND id % 7 = 0"
        raise ValueError(f"{self.op} has no WHERE")

    def partitions(self) -> dict[str, int] | None:
        return {"p": self.partition} if self.partitioned else None

    # -- what a DAG author writes without the provider -------------------------------------------------
    def naive_sql(self, table: str) -> str:
        """The statement as an author writes it: the join or row condition only, no partition predicate
        (OPTIMIZE names its partition, as its syntax invites)."""
        target = f"delta.`{table}`"
        if self.op == "merge":
            return (f"MERGE INTO {target} t USING ({self.source_query()}) s ON t.id = s.id "
                    "WHEN MATCHED THEN UPDATE SET m = s.m")
        if self.op == "update":
            return f"UPDATE {target} SET u = 'updated' WHERE {self.where()}"
        if self.op == "delete":
            return f"DELETE FROM {target} WHERE {self.where()}"
        if self.op == "append":
            return f"INSERT INTO {target} (id, p, m, u) {self.source_query()}"
        return f"OPTIMIZE {target}" + (f" WHERE p = {self.partition}" if self.partitioned else "")


def writers(k: int, table: str) -> list[Writer]:
    """The ``k`` writers of the workload on ``table`` (``partitioned`` or ``dv``)."""
    if k < 2 or k % 4:
        raise ValueError(f"K must be a positive multiple of 4, got {k}")
    out = []
    for i in range(k):
        op = OPS[i % len(OPS)]
        shared = i < k // 2
        partition = i // 2 if shared else i - k // 4
        if op == "append":
            lo = APPEND_BASE + i * HALF
        else:
            lo = partition * ROWS + (HALF if shared and i % 2 else 0)
        out.append(Writer(f"w{i:02d}_{op}_p{partition}", op, partition, lo, lo + HALF, table == "partitioned"))
    return out


def partition_count(k: int) -> int:
    return 3 * k // 4


def conflicts(a: Writer, b: Writer) -> bool:
    """Whether Delta (OSS, Serializable, file-level) can fail one of the two when they overlap in time.

    On the partitioned table only writers of one partition meet; on the unpartitioned one everyone
    does. Blind appends never conflict with each other nor with a compaction (whose commit holds only
    ``dataChange=false`` files); every other pair that meets can.
    """
    if a.partitioned and a.partition != b.partition:
        return False
    harmless = {frozenset(("append",)), frozenset(("append", "optimize"))}
    return frozenset((a.op, b.op)) not in harmless


def planned_conflicts(ws: list[Writer], snapshot: Any) -> set[frozenset[str]]:
    """The pairs the provider's planner (what a conflict pool consults, model ``delta``) says can
    conflict, in either order, on ``snapshot`` (the seed table): to set beside ``conflicts``.

    Each writer is planned as the provider's operator plans it: its partition ANDed into its
    condition and its writes pinned to that partition (on the partitioned table), a MERGE's join
    conjunct left out (it neither narrows nor widens what a MERGE reads).
    """
    from airflow_delta_occ.engine.planner import Operation, can_conflict, plan_footprint

    kinds = {"merge": Operation.MERGE, "update": Operation.UPDATE, "delete": Operation.DELETE,
             "append": Operation.INSERT, "optimize": Operation.OPTIMIZE}
    plans = {}
    for w in ws:
        parts = [f"p = {w.partition}"] if w.partitioned else []
        if w.op in ("update", "delete"):
            parts.append(w.where())
        predicate = " AND ".join(parts) or None
        plans[w.task_id] = plan_footprint(snapshot, kinds[w.op], None if w.op == "append" else predicate,
                                          label=w.task_id, write_partitions=[{"p": w.partition}] if w.partitioned
                                          else None)
    return {frozenset((a.task_id, b.task_id)) for a, b in itertools.combinations(ws, 2)
            if can_conflict(plans[a.task_id], plans[b.task_id], snapshot).conflict}


def heaviest_conflict_chain(ws: list[Writer], work: dict[str, float]) -> tuple[float, list[str]]:
    """The heaviest set of mutually conflicting writers (they can only run one after another) and its
    total work: a lower bound on any schedule's makespan. Brute force: K <= 16 here."""
    best: tuple[float, list[str]] = (0.0, [])
    for size in range(1, len(ws) + 1):
        for group in itertools.combinations(ws, size):
            if all(conflicts(a, b) for a, b in itertools.combinations(group, 2)):
                total = sum(work[w.task_id] for w in group)
                if total > best[0]:
                    best = (total, [w.task_id for w in group])
    return best


def ideal_makespan(ws: list[Writer], work: dict[str, float], spark: dict[str, float], slots: int) -> dict[str, Any]:
    """The old bound (kept beside the achievable one), the largest of: total work over the parallel slots, the
    heaviest chain of mutually conflicting jobs, the longest single job.

    ``work`` is each task's whole run alone (what holds an Airflow slot); ``spark`` is its Spark job
    alone, read to commit (``run_seconds``): only that part of two conflicting jobs must not overlap,
    so the chain adds up ``spark``, not ``work``.
    """
    total = sum(work[w.task_id] for w in ws)
    chain, members = heaviest_conflict_chain(ws, spark)
    longest = max(work[w.task_id] for w in ws)
    return {"bound": max(total / slots, chain, longest), "total_work": total, "slots": slots,
            "chain": chain, "chain_members": members, "longest": longest}


def achievable_bound(ws: list[Writer], disjoint_makespan: float, alone_work: dict[str, float],
                     alone_spark: dict[str, float], concurrent_spark: dict[str, float] | None = None) -> dict[str, Any]:
    """The achievable bound of one repetition, every term measured in that repetition: the largest of

    * the makespan of its ``disjoint`` run (the same K writers, none conflicting, all at once through
      the same Airflow and Spark, no pool): what the writers take when nothing waits for anything;
    * the heaviest chain of mutually conflicting writers, adding up each member's Spark time read to
      commit (``run_seconds``) in its serial run (``alone_spark``, each job alone on Spark): only that
      part of two conflicting jobs must not overlap (a lease is held around the Spark job; planning,
      the session and the confirmation may overlap), and no job takes less than it does alone;
    * the longest task of its serial run (``alone_work``, start to end of the task alone).

    Why not the disjoint run's own ``run_seconds`` for the chain: those jobs ran beside each other, so
    each one's time includes its wait for the cores the others held; one after another they take less,
    and the sum of times that overlapped is no lower bound (measured: on the unpartitioned table at
    K=4, 62 s of "chain" from a disjoint run that itself took 24 s). That sum is still reported, as
    ``chain_concurrent``, beside the bound.
    """
    chain, members = heaviest_conflict_chain(ws, alone_spark)
    longest = max(alone_work[w.task_id] for w in ws)
    terms = {"disjoint makespan": disjoint_makespan, "conflict chain": chain, "longest job": longest}
    out = {"bound": max(terms.values()), "binding": max(terms, key=lambda t: terms[t]),
           "disjoint_makespan": disjoint_makespan, "chain": chain, "chain_members": members, "longest": longest}
    if concurrent_spark is not None and all(m in concurrent_spark for m in members):
        out["chain_concurrent"] = sum(concurrent_spark[m] for m in members)
    return out


def _multiples_of_7(lo: int, hi: int) -> tuple[int, int]:
    """Count and sum of the multiples of 7 in ``[lo, hi)``."""
    first = -(-lo // 7) * 7
    if first >= hi:
        return 0, 0
    n = (hi - 1 - first) // 7 + 1
    return n, n * first + 7 * n * (n - 1) // 2


def _range_sum(lo: int, hi: int) -> int:
    return (hi - lo) * (lo + hi - 1) // 2


def expected_groups(k: int, table: str, only: str | None = None) -> dict[tuple[str, str | None], tuple[int, int]]:
    """``{(m, u): (rows, sum of ids)}`` the writers leave, in any commit order; with ``only`` (a task
    id), what that one writer leaves on its own copy of the seed table (the ``disjoint`` mode)."""
    groups: dict[tuple[str, str | None], list[int]] = {("seed", "seed"): [partition_count(k) * ROWS,
                                                                           _range_sum(0, partition_count(k) * ROWS)]}

    def move(key: tuple[str, str | None], count: int, total: int) -> None:
        seed = groups[("seed", "seed")]
        seed[0] -= count
        seed[1] -= total
        if count:
            into = groups.setdefault(key, [0, 0])
            into[0] += count
            into[1] += total

    for w in writers(k, table):
        if only is not None and w.task_id != only:
            continue
        if w.op == "merge":
            move(("merged", "seed"), HALF, _range_sum(w.lo, w.hi))
        elif w.op == "update":
            move(("seed", "updated"), HALF, _range_sum(w.lo, w.hi))
        elif w.op == "delete":
            n, total = _multiples_of_7(w.lo, w.hi)
            move(("gone", None), n, total)
        elif w.op == "append":
            into = groups.setdefault(("appended", None), [0, 0])
            into[0] += HALF
            into[1] += _range_sum(w.lo, w.hi)
    groups.pop(("gone", None), None)
    return {key: (value[0], value[1]) for key, value in groups.items()}


def dag_id(table: str, k: int, mode: str) -> str:
    return f"headline_{table}_k{k}_{mode}"


def table_template(root: str, dag: str) -> str:
    """Where a DAG's run writes: one table per run (``run_id`` is rendered by Airflow)."""
    return f"{root}/{dag}/{{{{ run_id }}}}"


def copy_location(table: str, task_id: str) -> str:
    """Where writer ``task_id`` writes in the ``disjoint`` mode: its own copy of the run's seed table."""
    return f"{table}/{task_id}"


def task_spec(w: Writer, table: str, own_copy: bool = False) -> dict[str, Any]:
    """What the DAG file needs to build writer ``w``'s task in any mode, as JSON data; ``own_copy``:
    the writer writes its own copy of the table (``copy_location``), not ``table``."""
    return {"task_id": w.task_id, "op": w.op, "partitions": w.partitions(),
            "table": copy_location(table, w.task_id) if own_copy else table,
            "source_query": w.source_query() if w.op in ("merge", "append") else None,
            "where": w.where() if w.op in ("update", "delete") else None,
            "naive_sql": w.naive_sql(table)}


def write_spec(path: Path, *, root: str, connect_url: str, ks: list[int], tables: list[str],
               serial_pool: str, conflict_pool: str, retries: int, retry_delay: float,
               modes: tuple[str, ...] | list[str] = MODES) -> None:
    """The JSON the DAG file builds its DAGs from: one DAG per table, K and mode (of ``modes``)."""
    dags = []
    for table in tables:
        for k in ks:
            for mode in MODES:
                if mode not in modes:
                    continue
                name = dag_id(table, k, mode)
                location = table_template(root, name)
                dags.append({"dag_id": name, "mode": mode, "k": k, "table": location,
                             "writers": [task_spec(w, location, own_copy=mode == "disjoint")
                                         for w in writers(k, table)]})
    path.write_text(json.dumps({"connect_url": connect_url, "serial_pool": serial_pool,
                                "conflict_pool": conflict_pool, "retries": retries, "retry_delay": retry_delay,
                                "dags": dags}, indent=1))
