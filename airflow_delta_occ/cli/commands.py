"""The ``airflow delta-occ`` commands: Airflow pools from the pool file, and the lease store's state.

Why the Airflow pools: a Delta task waiting for a lease is deferred, and a pool with
``include_deferred=False`` does not count it, so the pool's slots (``max_writers``) bound the writers
that run, not the ones that wait. The pool file is the source of truth: ``sync`` rewrites slots,
``include_deferred`` and the description of the Airflow pools it names (and deletes nothing). A Delta
task routed to a pool that does not exist is never run by the scheduler, and nothing warns about it,
so ``sync`` looks for such tasks in the serialized DAGs of the metadata database and fails loudly.

Loaded only when a command runs (``lazy_load_command``). Exit codes: 0 ok; 1 Delta tasks in missing
pools (without ``--no-fail``) or the lease store failed; 2 an unusable pool file, option or argument.
Errors are printed as one line, without a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.utils import cli as airflow_cli
from airflow.utils.cli import suppress_logs_and_warning
from airflow.utils.providers_configuration_loader import providers_configuration_loaded

from airflow_delta_occ.exceptions import LeaseError, PoolConfigError, ProviderConfigError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from airflow_delta_occ.dagcheck.report import UnknownTask
    from airflow_delta_occ.pools.config import Pool, PoolConfig
    from airflow_delta_occ.pools.requests import Blocker

#: Airflow's own "unlimited" (``slot_pool.slots = -1``, counted as infinity by the scheduler): the slots of
#: a conflict pool without ``max_writers``. Its leases still keep conflicting writers apart.
UNLIMITED_SLOTS = -1
#: Every description ``sync`` writes starts so; it marks the Airflow pools this provider manages.
DESCRIPTION_PREFIX = "airflow-delta-occ conflict pool"
#: ``DeltaBaseOperator.template_fields``: how a Delta operator subclassed in a DAG file is recognized once
#: serialized (its ``_task_module`` is then the DAG file). Kept here so the CLI does not import the operators.
DELTA_TEMPLATE_FIELDS = frozenset({"table", "table_name", "partitions"})
EXIT_MISSING_POOLS = 1
EXIT_STORE = 1
EXIT_USAGE = 2
DETAIL_WIDTH = 60
#: The most audit events ``leases --history`` reads: a larger count would overflow the database's integer.
MAX_HISTORY = 100_000


def _fail(message: str, code: int) -> None:
    print(f"airflow delta-occ: error: {message}", file=sys.stderr)
    raise SystemExit(code)


Command = Callable[[argparse.Namespace], None]


def _logged(func: Command) -> Command:
    """Airflow's action log (the ``log`` table) records who changed the pools, as for ``airflow pools set``."""
    action_cli: Callable[[Command], Command] = airflow_cli.action_cli  # untyped in Airflow
    return action_cli(func)


def _reports_errors(func: Command) -> Command:
    """Configuration and store errors as one line and an exit code: they are the operator's to fix, not ours."""
    @functools.wraps(func)
    def wrapper(args: argparse.Namespace) -> None:
        try:
            func(args)
        except ProviderConfigError as exc:  # PoolConfigError included
            _fail(str(exc), EXIT_USAGE)
        except LeaseError as exc:
            _fail(str(exc), EXIT_STORE)
    return wrapper


# --- the pool file and the Airflow pools ----------------------------------------------------------

def _pool_config(args: argparse.Namespace) -> PoolConfig:
    """``--pool-file``, else ``[delta_occ] pool_file``.

    Raises:
        PoolConfigError: no pool file, or an unusable one (the message names the file and the entry).
    """
    from airflow_delta_occ import config
    from airflow_delta_occ.pools.config import load_pool_config

    if args.pool_file:
        return load_pool_config(args.pool_file)
    loaded = config.pool_config()
    if loaded is None:
        raise PoolConfigError("no pool file: set [delta_occ] pool_file (AIRFLOW__DELTA_OCC__POOL_FILE) or pass "
                              "--pool-file")
    return loaded


@dataclass(frozen=True)
class AirflowPool:
    """The fields of an Airflow pool that ``sync`` manages (and the team it keeps)."""

    name: str
    slots: int
    include_deferred: bool
    description: str
    team_name: str | None = None


def _airflow_pools(session: Session) -> dict[str, AirflowPool]:
    from airflow.models.pool import Pool as PoolModel

    return {str(p.pool): AirflowPool(str(p.pool), int(p.slots), bool(p.include_deferred), p.description or "",
                                     p.team_name)
            for p in PoolModel.get_pools(session=session)}


def slots_for(pool: Pool) -> int:
    """The Airflow pool's slots: ``max_writers``, or Airflow's unlimited."""
    return UNLIMITED_SLOTS if pool.max_writers is None else pool.max_writers


def description_for(pool: Pool) -> str:
    text = f"{DESCRIPTION_PREFIX} {pool.name!r}, managed by 'airflow delta-occ pools sync'"
    return f"{text}: {pool.description}" if pool.description else text


def _slots_text(slots: int) -> str:
    return "unlimited (-1)" if slots == UNLIMITED_SLOTS else str(slots)


@dataclass(frozen=True)
class PoolSync:
    """What ``sync`` does to one conflict pool's Airflow pool."""

    pool: Pool
    action: str                      # created | updated | unchanged
    before: AirflowPool | None
    changes: tuple[str, ...] = ()

    @property
    def slots(self) -> int:
        return slots_for(self.pool)


def plan_sync(config: PoolConfig, existing: dict[str, AirflowPool]) -> list[PoolSync]:
    """What ``sync`` would change, pool by pool (pure: the dry run prints it, the real run applies it).

    Raises:
        PoolConfigError: a conflict pool names ``default_pool``: every task without a pool runs there, so
            its slots are not this provider's to set.
    """
    from airflow.models.pool import Pool as PoolModel

    plan = []
    for pool in config.pools:
        if pool.airflow_pool == PoolModel.DEFAULT_POOL_NAME:
            raise PoolConfigError(f"{config.source}: pools.{pool.name}.airflow_pool: {pool.airflow_pool!r} is the "
                                  "pool of every task that names none; give the conflict pool its own Airflow pool")
        before = existing.get(pool.airflow_pool)
        if before is None:
            plan.append(PoolSync(pool, "created", None))
            continue
        changes = []
        if before.slots != slots_for(pool):
            changes.append(f"slots {_slots_text(before.slots)} -> {_slots_text(slots_for(pool))}")
        if before.include_deferred:
            changes.append("include_deferred True -> False")
        if before.description != description_for(pool):
            changes.append("description")
        plan.append(PoolSync(pool, "updated" if changes else "unchanged", before, tuple(changes)))
    return plan


def _apply(plan: Sequence[PoolSync], session: Session) -> None:
    from airflow.models.pool import Pool as PoolModel

    for item in plan:
        if item.action != "unchanged":
            PoolModel.create_or_update_pool(item.pool.airflow_pool, item.slots, description_for(item.pool),
                                            include_deferred=False,
                                            team_name=item.before.team_name if item.before else None,
                                            session=session)


# --- Delta tasks of the serialized DAGs -----------------------------------------------------------

@dataclass(frozen=True)
class DeltaTask:
    dag_id: str
    task_id: str
    task_type: str
    pool: str


def is_delta_task(task: Any) -> bool:
    """Whether a deserialized task runs one of this provider's operators (or says it belongs to a conflict pool)."""
    if str(getattr(task, "_task_module", "") or "").startswith("airflow_delta_occ."):
        return True
    partial_kwargs = getattr(task, "partial_kwargs", None)  # a mapped task keeps its fixed arguments here
    if getattr(task, "conflict_pool", None) or (isinstance(partial_kwargs, dict)
                                                and partial_kwargs.get("conflict_pool")):
        return True
    return DELTA_TEMPLATE_FIELDS <= set(getattr(task, "template_fields", None) or ())


def delta_tasks(session: Session) -> tuple[list[DeltaTask], int, list[str]]:
    """The Delta tasks of the latest serialized version of every DAG whose file still exists.

    Returns the tasks, the number of DAGs read, and one message per DAG that could not be deserialized.
    """
    from airflow.models.dag import DagModel
    from airflow.models.serialized_dag import SerializedDagModel
    from sqlalchemy import select

    dag_ids = list(session.scalars(select(DagModel.dag_id).where(DagModel.is_stale.is_(False))))
    found: list[DeltaTask] = []
    unreadable: list[str] = []
    rows = SerializedDagModel.get_latest_serialized_dags(dag_ids=dag_ids, session=session) if dag_ids else []
    for row in rows:
        row.load_op_links = False  # links import plugins; only the tasks' pools are read here
        try:
            dag = row.dag
        except Exception as exc:  # one unreadable DAG must not hide the others' tasks
            unreadable.append(f"{row.dag_id}: {type(exc).__name__}: {exc}")
            continue
        found.extend(DeltaTask(row.dag_id, task.task_id, str(task.task_type), str(task.pool))
                     for task in dag.tasks if is_delta_task(task))
    return found, len(rows), unreadable


def _report_missing(tasks: Sequence[DeltaTask], dags: int, unreadable: Sequence[str], pools: Iterable[str],
                    *, dry_run: bool, fail: bool) -> None:
    known = set(pools)
    missing = sorted((t for t in tasks if t.pool not in known), key=lambda t: (t.dag_id, t.task_id))
    for message in unreadable:
        print(f"WARNING: could not read serialized DAG {message}", file=sys.stderr)
    if not missing:
        print(f"Delta tasks: {len(tasks)} in {dags} DAGs; every one is routed to an existing Airflow pool"
              + (" (counting the pools this sync would create)" if dry_run else ""))
        return
    level = "ERROR" if fail else "WARNING"
    noun = "task is" if len(missing) == 1 else "tasks are"
    lines = [f"{level}: {len(missing)} Delta {noun} routed to an Airflow pool that does not exist; "
             "the scheduler will never run them:"]
    lines += [f"  DAG {t.dag_id!r} task {t.task_id!r} ({t.task_type}): pool {t.pool!r}" for t in missing]
    lines.append("Add the pool to the pool file and run 'airflow delta-occ pools sync', create it with "
                 "'airflow pools set', or route the task to an existing pool (pool=).")
    print("\n".join(lines), file=sys.stderr)
    if fail:
        raise SystemExit(EXIT_MISSING_POOLS)


# --- commands -------------------------------------------------------------------------------------

@_reports_errors
@providers_configuration_loaded
@_logged
@suppress_logs_and_warning
def pools_sync(args: argparse.Namespace) -> None:
    """``airflow delta-occ pools sync``: Airflow pools from the pool file, then the missing-pool report."""
    from airflow.utils.session import create_session

    config = _pool_config(args)  # before the database: a bad file changes nothing
    with create_session() as session:  # one transaction: every pool is written, or none
        plan = plan_sync(config, _airflow_pools(session))
        if not args.dry_run:
            _apply(plan, session)
    verb = {"created": "would create", "updated": "would update"} if args.dry_run else {}
    dry = " - dry run, nothing changed" if args.dry_run else ""
    print(f"pool file: {config.source} ({len(config.pools)} pools){dry}")
    _print_table([{"action": verb.get(p.action, p.action), "airflow_pool": p.pool.airflow_pool,
                   "slots": _slots_text(p.slots), "include_deferred": "False", "conflict_pool": p.pool.name,
                   "changes": ", ".join(p.changes)} for p in plan])
    with create_session() as session:
        existing = _airflow_pools(session)
        tasks, dags, unreadable = delta_tasks(session)
    managed = {p.airflow_pool for p in config.pools}
    for name, pool in sorted(existing.items()):
        if pool.description.startswith(DESCRIPTION_PREFIX) and name not in managed:
            print(f"note: Airflow pool {name!r} was made by sync for a conflict pool no longer in the pool file; "
                  "left in place (delete it with 'airflow pools delete' once no task uses it)")
    planned = {p.pool.airflow_pool for p in plan} if args.dry_run else set()
    _report_missing(tasks, dags, unreadable, set(existing) | planned, dry_run=args.dry_run, fail=not args.no_fail)


@_reports_errors
@providers_configuration_loaded
@suppress_logs_and_warning
def pools_list(args: argparse.Namespace) -> None:
    """``airflow delta-occ pools list``: each conflict pool, its Airflow pool, and whether they agree."""
    from airflow.utils.session import create_session

    config = _pool_config(args)
    with create_session() as session:
        existing = _airflow_pools(session)
    rows: list[dict[str, Any]] = []
    text: list[dict[str, Any]] = []
    for pool in config.pools:
        found = existing.get(pool.airflow_pool)
        row = {"pool": pool.name, "airflow_pool": pool.airflow_pool, "model": pool.model,
               "max_writers": pool.max_writers, "exists": found is not None,
               "slots": None if found is None else found.slots,
               "include_deferred": None if found is None else found.include_deferred,
               "in_sync": found is not None and found.slots == slots_for(pool) and not found.include_deferred,
               "tables": list(pool.tables)}
        rows.append(row)
        text.append({**row, "max_writers": _cell(pool.max_writers, "unlimited"),
                     "slots": "-" if found is None else _slots_text(found.slots),
                     "include_deferred": "-" if found is None else str(found.include_deferred),
                     "tables": ", ".join(pool.tables)})
    if args.output == "json":
        print(json.dumps(rows, indent=2))
        return
    print(f"pool file: {config.source}")
    _print_table(text)


@_reports_errors
@providers_configuration_loaded
@suppress_logs_and_warning
def leases(args: argparse.Namespace) -> None:
    """``airflow delta-occ leases``: who holds and who waits, and the latest audit events."""
    from airflow_delta_occ.hooks.leases import DeltaLeaseStoreHook
    from airflow_delta_occ.pools.config import normalize_table
    from airflow_delta_occ.pools.requests import utc_text

    table = None
    if args.table is not None:
        try:
            table = normalize_table(args.table)
        except ValueError as exc:
            _fail(f"--table: {exc}", EXIT_USAGE)
    if not 0 <= args.history <= MAX_HISTORY:
        _fail(f"--history must be from 0 to {MAX_HISTORY}, got {args.history}", EXIT_USAGE)
    store = DeltaLeaseStoreHook(args.conn_id, metadata_database=True).get_store()
    try:
        held = store.holders(pool=args.pool, table=table)
        waiting = store.waiters(pool=args.pool, table=table)
        blockers: dict[str, tuple[Blocker, ...]] = {}   # whom each waiter waits for, read (no heartbeat) pool by pool
        for pool in sorted({r.pool for r in waiting}):
            blockers.update(store.waiting_for(pool=pool))
        events = store.history(pool=args.pool, table=table, limit=args.history) if args.history else []
    finally:
        store.close()
    if args.output == "json":
        print(json.dumps({"conn_id": args.conn_id, "pool": args.pool, "table": table,
                          "holders": [r.to_json() for r in held],
                          "waiters": [{**r.to_json(),
                                       "waits_for": [b.to_json() for b in blockers.get(r.request_id, ())]}
                                      for r in waiting],
                          "history": [e.to_json() for e in events]}, indent=2))
        return
    print(f"Holders ({len(held)})")
    _print_table([{"pool": r.pool, "table": r.table, "owner": r.owner, "seq": r.seq,
                   "granted_at": utc_text(r.granted_at), "expires_at": utc_text(r.expires_at), "summary": r.summary}
                  for r in held])
    print(f"\nWaiters ({len(waiting)}, in arrival order)")
    _print_table([{"pool": r.pool, "table": r.table, "owner": r.owner, "seq": r.seq,
                   "requested_at": utc_text(r.requested_at), "summary": r.summary,
                   "waits_for": _waits_for(blockers.get(r.request_id, ()))} for r in waiting])
    print(f"\nHistory (latest {len(events)}, oldest first)")
    _print_table([{"at": utc_text(e.at), "kind": e.kind.value, "pool": e.pool, "table": e.table, "owner": e.owner,
                   "summary": e.summary, "detail": _shorten(e.detail)} for e in events])


@_reports_errors
@providers_configuration_loaded
@suppress_logs_and_warning
def check(args: argparse.Namespace) -> None:
    """``airflow delta-occ check``: the pairs of Delta tasks that can conflict, before the DAGs run.

    Exit 0 when every pair that can conflict is kept apart; 1 when one is not (or, with
    ``--fail-on-unknown``, something could not be judged: a task, a DAG, with ``--all`` a DAG file that
    does not import); 2 on a usage error (no such DAG, a bad date or option, an unusable pool file).
    """
    from airflow_delta_occ.dagcheck import check_dags

    date, next_date = _date_arg(args.date, "--date") or _today(), _date_arg(args.next_date, "--next-date")
    if next_date is not None and next_date == date:
        _fail("--next-date must be another run's date than --date", EXIT_USAGE)
    for option, value in (("--max-mapped", args.max_mapped), ("--runs", args.runs)):
        if value < 1:
            _fail(f"{option} must be at least 1, got {value}", EXIT_USAGE)
    # What DAG files print while they are parsed goes to stderr: stdout is the report (JSON with -o json).
    with contextlib.redirect_stdout(sys.stderr):
        dags, broken = _dags_to_check(args)
        pools = _optional_pool_config(args)
        slots, slot_note = _airflow_pool_slots()
        report = check_dags(dags, date=date, next_date=next_date, model=args.model, pools=pools, pool_slots=slots,
                            max_mapped=args.max_mapped, runs=args.runs, notes=[slot_note] if slot_note else [],
                            unknown=broken)
    if args.output == "json":
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.text())
    code = report.exit_code(fail_on_unknown=args.fail_on_unknown)
    if code:
        raise SystemExit(code)


def _dags_to_check(args: argparse.Namespace) -> tuple[list[Any], list[UnknownTask]]:
    """The DAGs parsed from ``--subdir`` (default: the DAGs folder): ``DAG_ID``'s, or all with ``--all``; with
    ``--all``, each DAG file that did not import is a thing not judged (its tasks may write the same tables)."""
    from airflow import settings
    from airflow.dag_processing.dagbag import DagBag

    from airflow_delta_occ.dagcheck.report import TaskRef, UnknownTask

    if bool(args.dag_id) == bool(args.all):
        _fail("give a DAG_ID or --all (not both)", EXIT_USAGE)
    folder = args.subdir or settings.DAGS_FOLDER
    bag = DagBag(dag_folder=folder)
    broken = [UnknownTask(TaskRef(f"<{path}>", "*"), f"the DAG file did not import: {_last_line(error)}")
              for path, error in sorted(bag.import_errors.items())]
    if args.all:
        if not bag.dags and not broken:   # a mistyped -S, an empty folder: nothing checked is not a pass
            _fail(f"no DAG files under {folder}", EXIT_USAGE)
        return [bag.dags[dag_id] for dag_id in sorted(bag.dags)], broken
    if args.dag_id not in bag.dags:
        errors = f"; {len(broken)} DAG file(s) did not import: {broken[0].task.dag_id} {broken[0].reason}" \
            if broken else ""
        _fail(f"no DAG {args.dag_id!r} under {folder}{errors}", EXIT_USAGE)
    return [bag.dags[args.dag_id]], []


def _last_line(error: object) -> str:
    """The exception line of a traceback (what went wrong), not its first frames."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:300]


def _optional_pool_config(args: argparse.Namespace) -> PoolConfig | None:
    """The pool file when there is one (it names the pool that would keep a pair apart); a bad one is an error."""
    from airflow_delta_occ import config

    try:
        return _pool_config(args) if args.pool_file else config.pool_config()
    except PoolConfigError as exc:
        _fail(str(exc), EXIT_USAGE)
        raise   # unreachable: _fail exits


def _airflow_pool_slots() -> tuple[dict[str, int], str | None]:
    """The slots of each Airflow pool, from the metadata database when it can be read (else a note saying so)."""
    from airflow.utils.session import create_session

    try:
        with create_session() as session:
            return {name: pool.slots for name, pool in _airflow_pools(session).items()}, None
    except Exception as exc:   # no metadata database here (a CI job): an Airflow pool of one slot is not counted
        return {}, (f"Airflow pools not read ({type(exc).__name__}): a shared Airflow pool of one slot is not counted "
                    "as keeping a pair apart")


def _date_arg(value: str | None, option: str) -> Any:
    import datetime as dt

    if value is None:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        _fail(f"{option}: expected a date as YYYY-MM-DD (or an ISO date and time), got {value!r}", EXIT_USAGE)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def _today() -> Any:
    import datetime as dt

    now = dt.datetime.now(dt.UTC)
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


# --- text output ----------------------------------------------------------------------------------

def _print_table(rows: Sequence[dict[str, Any]]) -> None:
    """Left-aligned columns, nothing cut (Rich tables wrap at 80 columns when stdout is not a terminal)."""
    if not rows:
        print("  (none)")
        return
    columns = list(rows[0])
    cells = [[str(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    for line in [[c.upper() for c in columns], *cells]:
        print("  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip())


def _cell(value: object, none: str) -> str:
    return none if value is None else str(value)


def _waits_for(blockers: Sequence[Blocker]) -> str:
    """The first blocker's owner and reason (and how many more), for the listing's one line per waiter."""
    if not blockers:
        return "- (a grant is due)"
    first = blockers[0]
    who = first.owner or ("the pool's writer limit" if first.request_id is None else first.request_id)
    more = f" (+{len(blockers) - 1} more)" if len(blockers) > 1 else ""
    return _shorten(f"{who}: {first.reason}{more}")


def _shorten(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= DETAIL_WIDTH else line[:DETAIL_WIDTH - 3] + "..."
