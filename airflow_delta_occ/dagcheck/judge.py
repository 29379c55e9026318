"""Which planned Delta task instances can conflict, and whether something keeps each such pair apart. Pure.

The verdict is the conflict pools' own (``pools.compare.lease_verdict``): each footprint lifted to the
partitions it can touch, so a pair judged disjoint stays disjoint whenever each job reads the table,
and a pair the pool would serialize is exactly a pair reported here. What keeps a pair apart comes
from the scheduling facts Airflow applies, in this order: a shared conflict pool, a shared Airflow
pool of one slot, the task limits, a dependency path in the same run. Nothing else keeps two runs apart:
a backfill's runs count against the backfill's own ``max_active_runs``, and its first run (like a manual
one) does not wait for the run before under ``depends_on_past``.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from airflow_delta_occ.engine.planner import Model, Verdict, verdict
from airflow_delta_occ.pools.compare import PlannedJob, lease_verdict, order_verdict

from .report import ConflictingPair, KeptApart, Outcome, Separation, TaskRef


@dataclass(frozen=True)
class Scheduling:
    """What the scheduler knows of a task that decides whether two of its instances may overlap."""

    upstream: frozenset[str] = frozenset()    # every task upstream of it in its DAG (transitively)
    airflow_pool: str = "default_pool"
    airflow_pool_slots: int | None = None     # None: not read (no metadata database)
    max_active_tis_per_dag: int | None = None
    max_active_tis_per_dagrun: int | None = None
    dag_max_active_tasks: int | None = None


@dataclass(frozen=True)
class PlannedTask:
    """A Delta task instance planned on its table: its lease key, footprint and what the scheduler knows."""

    ref: TaskRef
    table: str
    job: PlannedJob
    model: Model
    conflict_pool: str | None
    scheduling: Scheduling


#: Advice for an unprotected pair: ``advise(a, b)`` -> what would keep them apart.
Advice = Callable[[PlannedTask, PlannedTask], str]


def conflicting_pairs(tasks: Sequence[PlannedTask], advise: Advice) -> tuple[list[ConflictingPair], int]:
    """Every pair of ``tasks`` on one table that can conflict, and how many pairs on a shared table cannot."""
    by_table: dict[str, list[PlannedTask]] = defaultdict(list)
    for task in tasks:
        by_table[task.table].append(task)
    pairs: list[ConflictingPair] = []
    disjoint = 0
    for table, members in sorted(by_table.items()):
        for a, b in itertools.combinations(sorted(members, key=lambda t: t.ref), 2):
            try:
                verdict = _verdict(a, b)
                if not verdict.conflict:
                    disjoint += 1
                    continue
                outcomes = tuple(o for o in (_outcome(a, b, verdict.model), _outcome(b, a, verdict.model)) if o)
            except Exception as exc:  # a pair that cannot be judged is never passed as disjoint
                outcomes = (Outcome(a.ref, b.ref, None, f"could not be judged ({type(exc).__name__}: {exc}); "
                                    "counted as able to conflict", exact=False),)
            kept = kept_apart(a, b)
            advice = None if kept is not None else advise(a, b)
            pairs.append(ConflictingPair(a.ref, b.ref, table, outcomes, kept, advice))
    return pairs, disjoint


def _outcome(winner: PlannedTask, loser: PlannedTask, model: Model) -> Outcome | None:
    """What happens to ``loser`` when ``winner`` commits first, or ``None`` when it commits too.

    On the table as both were planned, the planner's exact verdict (delta-spark's own check, file by file)
    names the exception. Where only the lifted verdict finds a conflict (once other commits add files to
    the partitions both touch), the outcome says so: it is what can happen, not what happens today.
    """
    if winner.job.table == loser.job.table:
        exact = verdict(winner=winner.job.footprint, loser=loser.job.footprint, snapshot=winner.job.table, model=model)
        if exact.conflict:
            return Outcome(winner.ref, loser.ref, _name(exact), exact.reason)
    lifted = order_verdict(winner.job, loser.job, model)
    if not lifted.conflict:
        return None
    return Outcome(winner.ref, loser.ref, _name(lifted), f"once files are added to the partitions both touch "
                   f"(on the table as it is now, {loser.ref.task_id} would commit): {lifted.reason}", exact=False)


def _name(found: Verdict) -> str | None:
    return None if found.exception is None else found.exception.value


def _verdict(a: PlannedTask, b: PlannedTask) -> Verdict:
    """Under each task's model (its pool's, or the check's): a conflict under either is a conflict."""
    verdict = lease_verdict(a.job, b.job, a.model)
    if verdict.conflict or a.model == b.model:
        return verdict
    return lease_verdict(a.job, b.job, b.model)


def kept_apart(a: PlannedTask, b: PlannedTask) -> KeptApart | None:
    """What keeps ``a`` and ``b`` from running at the same time, or ``None``."""
    if a.conflict_pool is not None and a.conflict_pool == b.conflict_pool:
        return KeptApart(Separation.CONFLICT_POOL, f"both in conflict pool {a.conflict_pool!r}: its leases let one "
                         "of them write at a time")
    sa, sb = a.scheduling, b.scheduling
    if sa.airflow_pool == sb.airflow_pool and sa.airflow_pool_slots == 1:
        return KeptApart(Separation.AIRFLOW_POOL, f"both in Airflow pool {sa.airflow_pool!r}, which has one slot")
    if a.ref.dag_id != b.ref.dag_id:
        return None
    same_task = a.ref.task_id == b.ref.task_id
    if same_task and sa.max_active_tis_per_dag == 1:
        return KeptApart(Separation.TASK_LIMIT, f"{a.ref.task_id} has max_active_tis_per_dag=1")
    if a.ref.run == b.ref.run:
        return _within_run(a, b, same_task)
    # Two runs: neither max_active_runs (a backfill's runs count against the backfill's own limit) nor
    # depends_on_past (a backfill's first run, and manual runs, do not wait for the run before) keeps them apart.
    return None


def _within_run(a: PlannedTask, b: PlannedTask, same_task: bool) -> KeptApart | None:
    sa = a.scheduling
    if a.ref.task_id in b.scheduling.upstream:
        return KeptApart(Separation.DEPENDENCY, f"{a.ref.task_id} is upstream of {b.ref.task_id}")
    if b.ref.task_id in sa.upstream:
        return KeptApart(Separation.DEPENDENCY, f"{b.ref.task_id} is upstream of {a.ref.task_id}")
    if same_task and sa.max_active_tis_per_dagrun == 1:
        return KeptApart(Separation.TASK_LIMIT, f"{a.ref.task_id} has max_active_tis_per_dagrun=1")
    if sa.dag_max_active_tasks == 1:
        return KeptApart(Separation.TASK_LIMIT, f"DAG {a.ref.dag_id} has max_active_tasks=1")
    return None

