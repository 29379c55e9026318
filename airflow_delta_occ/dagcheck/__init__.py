"""``airflow delta-occ check``: which Delta tasks of a DAG can conflict, before anything runs.

``sample`` renders and plans the Delta task instances of sample runs (the Airflow side), ``judge`` pairs
them with the conflict pools' own verdict and the scheduler's facts (pure), and ``report`` is the typed
result the command prints as a table or JSON. ``check_dags`` ties them together.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .judge import Advice, PlannedTask, conflicting_pairs
from .report import CheckReport, UnknownTask
from .sample import DEFAULT_MAX_MAPPED, DEFAULT_RUNS, sample

if TYPE_CHECKING:
    from airflow.sdk import DAG

    from airflow_delta_occ.engine.planner import Model
    from airflow_delta_occ.pools.config import PoolConfig


def check_dags(dags: Sequence[DAG], *, date: dt.datetime, next_date: dt.datetime | None = None,
               model: Model = "delta", pools: PoolConfig | None = None, pool_slots: Mapping[str, int] | None = None,
               max_mapped: int = DEFAULT_MAX_MAPPED, runs: int = DEFAULT_RUNS, notes: Sequence[str] = (),
               unknown: Sequence[UnknownTask] = ()) -> CheckReport:
    """Every pair of Delta task instances of ``dags``' sample runs that can conflict, and what keeps it apart.
    ``unknown``: what the caller could not judge already (DAG files that did not import)."""
    sampled = sample(dags, date=date, next_date=next_date, model=model, pools=pools, pool_slots=pool_slots or {},
                     max_mapped=max_mapped, runs=runs)
    pairs, disjoint = conflicting_pairs(sampled.planned, _advice(pools))
    return CheckReport(dags=tuple(dag.dag_id for dag in dags), runs=sampled.runs, judged=len(sampled.planned),
                       conflicts=tuple(pairs), disjoint=disjoint, unknown=(*unknown, *sampled.unknown),
                       notes=(*notes, *sampled.notes))


def _advice(pools: PoolConfig | None) -> Advice:
    def advise(a: PlannedTask, b: PlannedTask) -> str:
        try:
            pool = pools.pool_for(a.table) if pools is not None else None
        except Exception:   # two pools match: the pool file is the platform's to fix
            pool = None
        fix = (f"set conflict_pool={pool.name!r} on both (the pool of this table in the pool file)" if pool is not None
               else "add the table to a conflict pool of the pool file ([delta_occ] pool_file) and set "
                    "conflict_pool= on both")
        if a.ref.dag_id != b.ref.dag_id:
            return fix
        if a.ref.run != b.ref.run:
            return (f"{fix}; or max_active_tis_per_dag=1 on {a.ref.task_id}"
                    if a.ref.task_id == b.ref.task_id else fix)
        if a.ref.task_id == b.ref.task_id:
            return f"{fix}; or max_active_tis_per_dagrun=1 on {a.ref.task_id}"
        return f"{fix}; or make one depend on the other ({a.ref.task_id} >> {b.ref.task_id})"
    return advise
