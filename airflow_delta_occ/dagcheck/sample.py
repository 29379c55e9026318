"""The Delta task instances of sample DAG runs, rendered and planned as they would run: the Airflow side of the check.

For each DAG a sample run of the given date is built in memory (no metadata database): its logical date
and data interval are the ones ``airflow tasks render DAG TASK DATE`` gives it, and the template context
is the Task SDK's own (``RuntimeTaskInstance.get_template_context``). When the DAG has a schedule and may
run several runs at once, the run after it is sampled too, so a backfill's neighbouring dates are
compared. Each Delta task (each map index of a task mapped over literal values) is rendered on a copy
and planned with the operator's own ``plan_job``: the snapshot the engine reads from the table's log
(no Spark), the job the task would build, and the footprint it would lease.

Whatever cannot be known before the run is reported as unknown, never as safe: a task mapped over
another task's output, a template that needs an XCom, a Variable or a connection the CLI cannot read,
a table given by catalog name (its location is Spark's to say), a table that does not exist yet.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow_delta_occ.exceptions import PoolConfigError
from airflow_delta_occ.jobs.spec import RunIdentity
from airflow_delta_occ.operators.delta import DeltaBaseOperator
from airflow_delta_occ.pools.compare import PlannedJob
from airflow_delta_occ.pools.config import normalize_table

from .judge import PlannedTask, Scheduling
from .report import TaskRef, UnknownTask

if TYPE_CHECKING:
    from airflow.sdk import DAG

    from airflow_delta_occ.engine.planner import Model
    from airflow_delta_occ.pools.config import PoolConfig

#: Map indexes planned per mapped task: every pair of them is judged (quadratic), so a thousand-date
#: backfill is sampled, and the report says so.
DEFAULT_MAX_MAPPED = 64
#: Consecutive scheduled runs compared per DAG (their instances are paired across runs too).
DEFAULT_RUNS = 3


@dataclass(frozen=True)
class SampleRun:
    """A DAG run that exists only for the check: its label in the report and the dates its templates see."""

    label: str
    logical_date: dt.datetime
    interval_start: dt.datetime
    interval_end: dt.datetime

    @property
    def run_id(self) -> str:
        return f"delta_occ_check__{self.logical_date.isoformat()}"


@dataclass(frozen=True)
class Sampled:
    """What sampling DAGs found: planned instances, the ones it could not plan, and what it left out."""

    planned: tuple[PlannedTask, ...]
    unknown: tuple[UnknownTask, ...]
    runs: tuple[str, ...]
    notes: tuple[str, ...]


def sample_runs(dag: DAG, date: dt.datetime, next_date: dt.datetime | None, runs: int
                ) -> tuple[list[SampleRun], str | None]:
    """The runs whose task instances may overlap, and a note on what was left out.

    * ``next_date`` given: the runs of ``date`` and ``next_date``.
    * A DAG with a schedule: ``runs`` consecutive scheduled runs from the first at or after ``date``.
      ``max_active_runs`` does not keep them apart: the scheduler counts a backfill's runs against the
      backfill's own limit, apart from the scheduled ones.
    * Otherwise (no schedule, assets, ``@once``): one run, and a second of the same date when
      ``max_active_runs`` lets two manual runs overlap.
    """
    from airflow.serialization.encoders import coerce_to_core_timetable

    timetable = coerce_to_core_timetable(dag.timetable)
    if next_date is not None:
        if next_date == date:
            raise ValueError("--next-date is --date: give the date of another run")
        return [_manual(timetable, date, _label(date, next_date)),
                _manual(timetable, next_date, _label(next_date, date))], None
    scheduled = _scheduled(timetable, date, runs)
    if scheduled:
        return scheduled, (f"{dag.dag_id}: {len(scheduled)} consecutive scheduled runs compared; runs further apart "
                           "(a backfill runs up to its own max_active_runs at once) were not (--runs)")
    first = _manual(timetable, date, date.date().isoformat())
    if dag.max_active_runs == 1:
        return [first], None
    return [first, replace(first, label=f"{first.label}#2")], None


def _label(when: dt.datetime, other: dt.datetime) -> str:
    return when.isoformat() if when.date() == other.date() else when.date().isoformat()


def _manual(timetable: Any, date: dt.datetime, label: str) -> SampleRun:
    """A run of ``date`` as ``airflow tasks render DAG TASK DATE`` builds it (the manual run's interval)."""
    from airflow._shared.timezones import timezone

    interval = timetable.infer_manual_data_interval(run_after=timezone.coerce_datetime(date))
    return SampleRun(label, date, interval.start, interval.end)


def _scheduled(timetable: Any, date: dt.datetime, count: int) -> list[SampleRun]:
    """The first ``count`` runs the timetable schedules at or after ``date`` (none without a schedule)."""
    from airflow._shared.timezones import timezone
    from airflow.timetables.base import TimeRestriction

    restriction = TimeRestriction(earliest=timezone.coerce_datetime(date), latest=None, catchup=True)
    found: list[SampleRun] = []
    last = None
    while len(found) < count:
        info = timetable.next_dagrun_info(last_automated_data_interval=last, restriction=restriction)
        if info is None or info.data_interval is None:
            break
        logical = getattr(info, "logical_date", None) or info.data_interval.start
        if found and logical <= found[-1].logical_date:
            break   # a timetable that does not move on
        found.append(SampleRun("", logical, info.data_interval.start, info.data_interval.end))
        last = info.data_interval
    # A run's label is its identity in the report (pairs of one label are judged as one run): dates while they
    # tell the runs apart, else full logical dates (several runs a day).
    dates = [run.logical_date.date().isoformat() for run in found]
    unique = len(set(dates)) == len(dates)
    return [replace(run, label=day if unique else run.logical_date.isoformat()) for run, day in zip(found, dates,
                                                                                                      strict=True)]


def sample(dags: Sequence[DAG], *, date: dt.datetime, next_date: dt.datetime | None, model: Model,
           pools: PoolConfig | None, pool_slots: Mapping[str, int], max_mapped: int = DEFAULT_MAX_MAPPED,
           runs: int = DEFAULT_RUNS) -> Sampled:
    """Render and plan every Delta task instance of the sample runs of ``dags``. A DAG whose runs cannot be
    sampled (its timetable fails) is one unknown entry; it never stops the others."""
    planned: list[PlannedTask] = []
    unknown: list[UnknownTask] = []
    labels: list[str] = []
    notes: list[str] = []
    for dag in dags:
        try:
            sampled, note = sample_runs(dag, date, next_date, runs)
        except Exception as exc:  # a custom timetable that fails, dates it refuses
            unknown.append(UnknownTask(TaskRef(dag.dag_id, "*"), f"its runs could not be sampled: {_error_text(exc)}"))
            continue
        try:
            found_planned, found_unknown = _sample_dag(dag, sampled, model, pools, pool_slots, max_mapped)
        except Exception as exc:  # a defect here must not pass the DAG, nor stop the others
            unknown.append(UnknownTask(TaskRef(dag.dag_id, "*"), f"the DAG could not be checked: {_error_text(exc)}"))
            continue
        notes += [note] if note else []
        labels += [run.label for run in sampled if run.label not in labels]
        planned += found_planned
        unknown += found_unknown
    return Sampled(tuple(planned), tuple(unknown), tuple(labels), tuple(notes))


def _sample_dag(dag: DAG, runs: Sequence[SampleRun], model: Model, pools: PoolConfig | None,
                pool_slots: Mapping[str, int], max_mapped: int) -> tuple[list[PlannedTask], list[UnknownTask]]:
    planned: list[PlannedTask] = []
    unknown: list[UnknownTask] = []
    ordered = ordered_upstreams(dag)
    for task in dag.tasks:
        if not _is_delta_task(task):
            continue
        facts = _scheduling(dag, task, pool_slots, ordered)
        for run in runs:
            for found in _instances(dag, task, run, max_mapped):
                if isinstance(found, UnknownTask):
                    unknown.append(found)
                    continue
                ref, rendered = found
                result = _plan(ref, rendered, facts, model, pools)
                (unknown if isinstance(result, UnknownTask) else planned).append(result)  # type: ignore[arg-type]
    return planned, unknown


def _is_delta_task(task: Any) -> bool:
    operator_class = getattr(task, "operator_class", None)   # a mapped task: the class it expands to
    cls = operator_class if isinstance(operator_class, type) else type(task)
    return issubclass(cls, DeltaBaseOperator)


def _scheduling(dag: DAG, task: Any, pool_slots: Mapping[str, int], ordered: Mapping[str, frozenset[str]]
                ) -> Scheduling:
    pool = str(getattr(task, "pool", None) or "default_pool")
    return Scheduling(
        upstream=ordered.get(task.task_id, frozenset()), airflow_pool=pool,
        airflow_pool_slots=pool_slots.get(pool), max_active_tis_per_dag=getattr(task, "max_active_tis_per_dag", None),
        max_active_tis_per_dagrun=getattr(task, "max_active_tis_per_dagrun", None),
        dag_max_active_tasks=dag.max_active_tasks)


#: Trigger rules under which a task runs only once every parent has succeeded (so each parent ran, after what it
#: waits for): the task waits for its parents' lines as well. Under any other rule a parent may end skipped or
#: upstream_failed without having run, while what is upstream of it still runs.
_ALL_SUCCEEDED = frozenset({"all_success"})
#: Rules that start a task once one parent is done (``one_success``: one parent succeeded, and ran).
_ONE_PARENT = frozenset({"one_success", "one_failed", "one_done"})


def ordered_upstreams(dag: DAG) -> dict[str, frozenset[str]]:
    """For each task of ``dag``, the tasks certain to have ended before it starts in the same run.

    * ``all_success``: every parent succeeded, so each parent and what it waits for;
    * ``one_success``: what every parent's line has in common (one succeeded, the others may still run);
    * ``one_failed``, ``one_done``: the parents all of them are (with one parent, that parent);
    * ``always``: nothing;
    * every other rule (``all_done``, ``none_failed`` ...): the parents only, which end before it starts but
      may end skipped or upstream_failed without having run, while their own parents still run.

    Computed once per DAG in topological order (no recursion: deep DAGs are fine).
    """
    tasks = {task.task_id: task for task in dag.tasks}
    found: dict[str, frozenset[str]] = {}
    pending = dict.fromkeys(tasks)
    while pending:
        progressed = False
        for task_id in list(pending):
            task = tasks[task_id]
            parents = [p.task_id for p in task.upstream_list]
            if any(p not in found for p in parents if p in tasks):
                continue
            found[task_id] = _ordered(task, parents, found)
            del pending[task_id]
            progressed = True
        if not progressed:   # not a DAG (cannot happen once parsed): nothing is ordered
            found.update(dict.fromkeys(pending, frozenset()))
            break
    return found


def _ordered(task: Any, parents: list[str], found: dict[str, frozenset[str]]) -> frozenset[str]:
    rule = str(getattr(task.trigger_rule, "value", task.trigger_rule))
    if rule == "always" or not parents:
        return frozenset()
    lines = [frozenset({p}) | found.get(p, frozenset()) for p in parents]
    if rule in _ALL_SUCCEEDED:
        return frozenset.union(*lines)
    if rule == "one_success":
        return frozenset.intersection(*lines)
    if rule in _ONE_PARENT:
        return frozenset.intersection(*(frozenset({p}) for p in parents))
    return frozenset(parents)


def _instances(dag: DAG, task: Any, run: SampleRun, max_mapped: int
               ) -> Iterator[UnknownTask | tuple[TaskRef, DeltaBaseOperator]]:
    """Each instance of ``task`` in ``run``, rendered; an unknown for what cannot be rendered before the run."""
    indexes = [-1]
    if task.get_needs_expansion():
        count = parse_time_map_count(task)
        if count is None:
            yield UnknownTask(TaskRef(dag.dag_id, task.task_id, -1, run.label),
                              "mapped over values known only when the DAG runs (another task's output, or a mapped "
                              "task group)")
            return
        indexes = list(range(min(count, max_mapped)))
        if count > max_mapped:
            yield UnknownTask(TaskRef(dag.dag_id, task.task_id, max_mapped, run.label),
                              f"map indexes {max_mapped} to {count - 1} of its {count} were not judged (--max-mapped)")
    for index in indexes:
        ref = TaskRef(dag.dag_id, task.task_id, index, run.label)
        try:
            yield ref, _render(dag, task, run, index)
        except Exception as exc:  # a template needs what only a run has (XCom, Variable), or a bad template
            yield UnknownTask(ref, f"its arguments did not render for the sample run: {_error_text(exc)}")


def parse_time_map_count(task: Any) -> int | None:
    """How many instances a mapped task has when it is mapped over literal values only (``expand(x=[...])``,
    ``expand_kwargs([...])``); ``None`` when a value comes from another task (an XCom), known only in the run."""
    value = getattr(getattr(task, "expand_input", None), "value", None)
    if isinstance(value, (list, tuple)):          # expand_kwargs over a literal list of argument sets
        return len(value)
    if not isinstance(value, Mapping) or not value:
        return None
    count = 1
    for values in value.values():                 # expand(): the product of the literal lists' lengths
        if not isinstance(values, (list, tuple, Mapping)):
            return None
        count *= len(values)
    return count


def _render(dag: DAG, task: Any, run: SampleRun, map_index: int) -> DeltaBaseOperator:
    """``task``'s instance ``map_index`` of ``run``, its templates filled in as the Task SDK fills them."""
    from airflow.sdk.api.datamodels._generated import DagRun, DagRunState, DagRunType, TIRunContext
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    dag_run = DagRun(dag_id=dag.dag_id, run_id=run.run_id, logical_date=run.logical_date,
                     data_interval_start=run.interval_start, data_interval_end=run.interval_end,
                     run_after=run.interval_end, start_date=None, end_date=None, run_type=DagRunType.MANUAL,
                     state=DagRunState.RUNNING, consumed_asset_events=[], partition_key=None, conf={})
    copied = task if task.get_needs_expansion() else copy.deepcopy(task)  # a mapped task renders a new one
    ti = RuntimeTaskInstance.model_construct(
        id=uuid.uuid4(), task_id=task.task_id, dag_id=dag.dag_id, run_id=run.run_id, try_number=1,
        map_index=map_index, dag_version_id=uuid.uuid4(), task=copied, max_tries=0,
        _ti_context_from_server=TIRunContext(dag_run=dag_run, max_tries=0, variables=[], connections=[]))
    context = ti.get_template_context()
    # A Variable or a connection is the deployment's, not the CLI's: a template that reads one (even with a
    # default) cannot be judged here.
    context["var"] = _Unavailable("a Variable")
    context["conn"] = _Unavailable("a connection")
    with _without_variables_or_connections():   # a macro that calls Variable.get or Connection.get
        copied.render_template_fields(context)
    rendered = context["task"]
    if not isinstance(rendered, DeltaBaseOperator):
        raise TypeError(f"{task.task_id} rendered to a {type(rendered).__name__}")
    return rendered


def _plan(ref: TaskRef, task: DeltaBaseOperator, scheduling: Scheduling, model: Model,
          pools: PoolConfig | None) -> PlannedTask | UnknownTask:
    from airflow_delta_occ.engine.planner import TableState
    from airflow_delta_occ.hooks.leases import pooled_table

    if task.table is None:
        return UnknownTask(ref, f"the table is given by catalog name ({task.table_name!r}): its location is known "
                           "only to Spark's catalog, which the check does not start", str(task.table_name))
    try:
        table = normalize_table(task.table)
        pool = None
        if task.conflict_pool is not None:   # what the run checks before it asks for a lease
            if pools is None:
                raise PoolConfigError(f"conflict_pool={task.conflict_pool!r}: no pool file (give --pool-file or "
                                      "[delta_occ] pool_file); the task would fail when it runs")
            pool = pools.get(task.conflict_pool)
            pooled_table(pool, task.table)
        prepared = task.plan_job(RunIdentity(ref.dag_id, ref.task_id, f"delta_occ_check__{ref.run}", ref.map_index))
        footprint = prepared.footprint
    except Exception as exc:  # no such pool or table, the table is unreadable, or the job cannot be built
        return UnknownTask(ref, _error_text(exc), str(task.table))
    return PlannedTask(ref, table, PlannedJob(footprint, TableState.of(prepared.snapshot)),
                       pool.model if pool is not None else model, task.conflict_pool, scheduling)


@contextlib.contextmanager
def _without_variables_or_connections() -> Iterator[None]:
    """While templates render, the Task SDK's ``Variable.get`` and ``Connection.get`` fail (user macros call them)."""
    from airflow.sdk import Connection, Variable

    def refuse(what: str) -> Any:
        def get(cls: Any, *args: Any, **kwargs: Any) -> Any:
            raise LookupError(f"the template reads {what} ({args[0] if args else '?'}), which only the deployment has")
        return classmethod(get)

    saved = Variable.__dict__["get"], Connection.__dict__["get"]
    Variable.get, Connection.get = refuse("a Variable"), refuse("a connection")  # type: ignore[method-assign]
    try:
        yield
    finally:
        Variable.get, Connection.get = saved  # type: ignore[method-assign]


class _Unavailable:
    """Stands for ``var`` and ``conn`` in the sample run's context: any use fails the rendering."""

    def __init__(self, what: str) -> None:
        self._what = what

    def __getattr__(self, name: str) -> Any:
        raise LookupError(f"the template reads {self._what} ({name}), which only the deployment has")


def _error_text(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__
