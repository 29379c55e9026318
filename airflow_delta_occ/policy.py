"""The provider's cluster policy: every Delta task (and sensor) runs in its conflict pool's Airflow pool.

Registered through the ``airflow.policy`` entry point (``pyproject.toml``), so installing the provider
is enough: no ``airflow_local_settings`` is needed. Airflow calls ``task_policy`` on each task when a
DAG file is parsed, in the DAG processor and again in the worker that runs the task (the task runner
re-parses the file), so the scheduler caps concurrent writers per pool before any worker starts and
the worker's task takes its lease in the same pool.

A *Delta task* is any task with a ``conflict_pool`` attribute (every ``DeltaBaseOperator``, the
``DeltaConflictSensor``), or a mapped task whose operator class comes from this provider. Other tasks
are never read or changed.

- A task that names a ``conflict_pool`` runs in that pool's Airflow pool. A task left in
  ``default_pool`` is moved there; one whose author chose another ``pool=`` (or ``default_args``) keeps
  it with a warning, unless ``[delta_occ] enforce_pools = True``, when the policy moves it.
- A task that names none, whose ``table`` is a literal location (no Jinja) matched by the pool file,
  gets that pool (``conflict_pool`` is set, so it takes leases) when ``[delta_occ] assign_pools = True``,
  then is routed as above. A templated table, a mapped (``expand``) table, or a catalog table
  (``table_name=``, whose location is only known at run time) cannot be matched at parse time and is left.

The policy reads the pool file only when a Delta task needs it; a file that cannot be used raises
``PoolConfigError`` naming the file and the task, which Airflow reports as the DAG's import error.
It imports neither pyarrow nor the operators. Running it twice changes nothing more.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.policies import hookimpl

from airflow_delta_occ import config
from airflow_delta_occ.exceptions import PoolConfigError
from airflow_delta_occ.jobs.checks import templated

if TYPE_CHECKING:
    from airflow_delta_occ.pools.config import Pool

log = logging.getLogger(__name__)

DEFAULT_AIRFLOW_POOL = "default_pool"  # Airflow's Pool.DEFAULT_POOL_NAME: a task left there chose no pool
_PROVIDER_PACKAGE = "airflow_delta_occ."


@hookimpl
def task_policy(task: Any) -> None:
    """Airflow's ``task_policy`` hook: route a Delta task to its conflict pool's Airflow pool.

    Raises:
        PoolConfigError: the task needs the pool file and it cannot be used, or names an unknown pool.
        ProviderConfigError: ``assign_pools`` or ``enforce_pools`` is not a boolean.
    """
    route_task(task)


def route_task(task: Any) -> str | None:
    """Apply the policy to one task (an operator or a mapped operator); the conflict pool it ends in.

    None for a task that is not a Delta task, or a Delta task without a conflict pool.

    Raises:
        PoolConfigError: as ``task_policy``.
    """
    view = _DeltaTask.of(task)
    if view is None:
        return None
    try:
        name = view.conflict_pool
        if name is None:
            pool = _assigned_pool(view)
            if pool is None:
                return None
            view.conflict_pool = pool.name
            log.debug("task %r: table %r is in conflict pool %r ([delta_occ] assign_pools)", view.task_id,
                      view.table, pool.name)
        else:
            pools = config.pool_config()
            if pools is None:  # no pool file here: nothing to route by (the task fails at run time)
                return str(name)
            pool = pools.get(str(name))
        _route(view, pool)
        return pool.name
    except PoolConfigError as exc:
        raise PoolConfigError(f"task {view.task_id!r} (airflow-delta-occ cluster policy): {exc}") from exc


def _assigned_pool(view: _DeltaTask) -> Pool | None:
    """The pool of the pool file whose patterns match the task's literal table, under ``assign_pools``."""
    if not config.assign_pools():
        return None
    table = view.table
    if not isinstance(table, str) or not table.strip() or templated(table):
        log.debug("task %r: no literal table to match against the pool file (table=%r)", view.task_id, table)
        return None
    pools = config.pool_config()
    if pools is None:
        return None
    try:
        return pools.pool_for(table)
    except ValueError as exc:  # not a table identifier the pool file can match (a relative path)
        log.debug("task %r: table %r is not matched against the pool file: %s", view.task_id, table, exc)
        return None


def _route(view: _DeltaTask, pool: Pool) -> None:
    """Put the task in ``pool``'s Airflow pool unless its author chose another (and pools are not enforced)."""
    current = view.pool
    if current == pool.airflow_pool:
        return
    if current in (None, "", DEFAULT_AIRFLOW_POOL) or config.enforce_pools():
        if current not in (None, "", DEFAULT_AIRFLOW_POOL):
            log.info("task %r: pool %r replaced by %r, the Airflow pool of conflict pool %r "
                     "([delta_occ] enforce_pools)", view.task_id, current, pool.airflow_pool, pool.name)
        view.pool = pool.airflow_pool
        return
    log.warning("task %r of conflict pool %r runs in Airflow pool %r set by its author, not in %r: the scheduler "
                "does not count it among the pool's writers (remove pool=, or set [delta_occ] enforce_pools = "
                "True)", view.task_id, pool.name, current, pool.airflow_pool)


class _DeltaTask:
    """The attributes the policy reads and writes, on an operator or on a mapped operator's partial kwargs."""

    def __init__(self, task: Any, partial_kwargs: dict[str, Any] | None) -> None:
        self.task = task
        self._partial = partial_kwargs

    @classmethod
    def of(cls, task: Any) -> _DeltaTask | None:
        """The view of a Delta task, or None for any other task."""
        partial = getattr(task, "partial_kwargs", None)
        if getattr(task, "_is_mapped", False) and isinstance(partial, dict):
            if "conflict_pool" in partial or _is_provider_class(getattr(task, "operator_class", None)):
                return cls(task, partial)
            return None
        try:
            has_pool = hasattr(task, "conflict_pool")
        except Exception:  # a property of someone else's operator that fails: not a Delta task
            return None
        return cls(task, None) if has_pool else None

    @property
    def task_id(self) -> str:
        return str(getattr(self.task, "task_id", "?"))

    def _get(self, name: str) -> Any:
        return self._partial.get(name) if self._partial is not None else getattr(self.task, name, None)

    @property
    def conflict_pool(self) -> Any:
        return self._get("conflict_pool")

    @conflict_pool.setter
    def conflict_pool(self, value: str) -> None:
        if self._partial is not None:
            self._partial["conflict_pool"] = value  # the worker builds each mapped task from these
        else:
            self.task.conflict_pool = value

    @property
    def table(self) -> Any:
        return self._get("table")  # a mapped (expand) table is not among the partial kwargs

    @property
    def pool(self) -> Any:
        return getattr(self.task, "pool", None)

    @pool.setter
    def pool(self, value: str) -> None:
        self.task.pool = value  # a mapped operator stores it in its partial kwargs


def _is_provider_class(cls: Any) -> bool:
    """Whether ``cls`` is (or subclasses) a class of this provider, judged without importing its modules."""
    return any(str(getattr(c, "__module__", "")).startswith(_PROVIDER_PACKAGE) for c in getattr(cls, "__mro__", ()))
