"""Operators that write to Delta tables with injected partition predicates and typed conflict retries.

Every operator renders its templates, validates the job against the table's own metadata (read by
the engine, without Spark), injects the partition predicate, runs the job through
``DeltaSparkHook`` and confirms the commit in the Delta log before it reports success. The result
(table, operation, committed version, Delta's operation metrics, attempts and every conflict seen,
run time, and the final condition that ran) is the task's XCom return value.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException, TaskDeferred

from airflow_delta_occ import config
from airflow_delta_occ.exceptions import (
    CommitNotConfirmedError,
    CommitOutsidePartitionsError,
    ConflictSkipped,
    JobKilledAfterCommitError,
    JobKilledError,
    JobSpecError,
    JobStoppedEarly,
    LeaseError,
    LeaseLostError,
    LeaseStoreError,
    PoolConfigError,
    StatementRefusedError,
)
from airflow_delta_occ.hooks.delta import DeltaSparkHook
from airflow_delta_occ.hooks.leases import (
    DeltaLeaseStoreHook,
    check_pooled_literal,
    configured_pool,
    lease_owner,
    pooled_table,
    required_pool,
    route_to_airflow_pool,
)
from airflow_delta_occ.hooks.storage import mask_secret_confs
from airflow_delta_occ.jobs.build import (
    SOURCE_OUTSIDE_ACTIONS,
    AppendArguments,
    DeleteArguments,
    MergeArguments,
    OperationArguments,
    OptimizeArguments,
    OverwritePartitionsArguments,
    SourceArguments,
    TargetArguments,
    UpdateArguments,
    build_spec,
)
from airflow_delta_occ.jobs.checks import check_clauses, check_one_source, check_sql_text, sql_file, templated
from airflow_delta_occ.jobs.operations import JobOperation
from airflow_delta_occ.jobs.partitions import parse_expression, partitions_mapping
from airflow_delta_occ.jobs.refusal import point_into_arguments
from airflow_delta_occ.jobs.result import JobLease, JobResult
from airflow_delta_occ.jobs.spec import JobSpec, RunIdentity, TableRef, check_source_format, commit_identity_confs
from airflow_delta_occ.jobs.text import refuse_substitution, strings_in
from airflow_delta_occ.operators.lineage import DeltaJobLineage, lineage_of, operator_lineage, schema_columns
from airflow_delta_occ.operators.links import SparkUILink
from airflow_delta_occ.operators.retry_policy import DeltaConflictRetryPolicy
from airflow_delta_occ.pools import holding
from airflow_delta_occ.pools.holding import HeldLease
from airflow_delta_occ.retry.policy import layer_overrides

if TYPE_CHECKING:  # the engine loads pyarrow: imported when a table is read, not with the operator
    import jinja2
    from airflow.sdk import Context

    from airflow_delta_occ.engine import Snapshot
    from airflow_delta_occ.engine.planner import Footprint
    from airflow_delta_occ.jobs.footprint import ReadPlan
    from airflow_delta_occ.pools.config import Pool
    from airflow_delta_occ.pools.leases.base import LeaseStore
    from airflow_delta_occ.spark.early_abort import TableWatch


@dataclass(frozen=True)
class PreparedJob:
    """Everything decided before Spark starts: the table's location and snapshot, the job, and what it
    reads (``read_plan``, which the commit check judges the commit by). A conflict lease is taken on
    the job's ``footprint`` between ``prepare`` and ``run``: planned on first use, since listing the
    files it reads and writes is needed only for a lease."""

    location: str
    snapshot: Snapshot
    spec: JobSpec
    read_plan: ReadPlan

    @cached_property
    def footprint(self) -> Footprint:
        from airflow_delta_occ.jobs.footprint import footprint_of

        return footprint_of(self.spec, self.snapshot)


def _stopped_early_note(error: BaseException) -> str:
    """The lease's release note for a job that ended in ``error``: the early stop of its last attempt, when one is
    in the error's chain (a conflict skipped or failed by its policy is raised from the attempt's error)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, JobStoppedEarly):
            return f"stopped early by version {current.version} ({current.operation}): {current.kind.value}"
        current = current.__cause__ or current.__context__
    return ""


class DeltaBaseOperator(BaseOperator):
    """Shared parameters: the target table, partitions to constrain the job to, retries, connection.

    :param table: target table path or URI (``/lake/sales``, ``s3://bucket/sales``).
    :param table_name: target table by catalog name instead of ``table``.
    :param partitions: ``{"date": "{{ ds }}", "country": ["DE", "FR"]}``; typed by the table's schema
        and ANDed into the job's condition so concurrent jobs on other partitions do not conflict.
        A value that renders to nothing (``None``, ``''``, ``'None'``) is refused; the NULL partition
        is asked for with ``airflow_delta_occ.jobs.partitions.NULL_PARTITION``.
    :param strict_partitions: fail instead of warning when a job on a partitioned table does not
        confine its partitions (``country = 'DE' OR 1 = 1`` confines nothing).
    :param source_outside_partitions: what to do with source rows that would be written outside
        ``partitions``: ``"fail"`` (default, nothing is written) or ``"drop"`` (left out, counted in
        the result as ``dropped_source_rows``).
    :param conflict_policies: per-exception overrides, e.g.
        ``{"ConcurrentAppendException": {"max_attempts": 8}, "ConcurrentDeleteDeleteException": "skip"}``.
        Not templated: the task-level retry policy Airflow asks after a failure is built from them when
        the DAG is parsed, and it must decide as the job's own retries do.
    :param delta_conn_id: the ``delta_occ`` connection (mode, Spark connection); optional. Templated.
    :param spark_conf: Spark settings for this task's job, over the connection's ``spark_conf`` extra
        (``{"spark.sql.shuffle.partitions": "{{ params.parts }}"}``). Templated, like ``SparkSubmitOperator``'s
        ``conf``.
    :param idempotent: write with Delta's transaction identifiers (``txnAppId`` of the task run, one
        ``txnVersion``), so a retry of the same run that finds its first try's commit does not write again.
    :param retries: Airflow's ``retries``. A Delta task that sets none (nor its ``default_args``) gets
        ``[delta_occ] task_retries`` (2 unless the platform changed it), not Airflow's 0: a task-level
        conflict retry can only happen within ``retries``. The task log says which it got, at its start.
    :param conflict_pool: a pool of the pool file (``[delta_occ] pool_file``): the job first takes a
        lease on its footprint from the pool's lease store, waiting (see ``deferrable``) while a
        conflicting job holds one, and the task runs in the pool's Airflow pool unless ``pool=`` is set.
        Not templated: the Airflow pool it picks is decided when the DAG is parsed.
    :param deferrable: how a pooled task waits for its lease. ``None`` (default): deferred when
        Airflow's ``[operators] default_deferrable`` is True, else adaptive: in the worker while the expected
        wait is at most ``[delta_occ] worker_wait`` seconds (30), deferred when it is longer, and back
        in a worker a few seconds before the grant is expected (a pool with ``max_writers`` always
        defers). ``True`` always defers to the triggerer (no worker slot held while it waits; the
        hand-over costs the trigger, the scheduler and a new task process, seconds); ``False`` always
        waits in the worker, which sees its grant within 50 ms and starts its job at once (it holds
        its slot meanwhile). See docs/pools.md, "Where a task waits".
    :param lease_poll_interval: seconds between full polls of the lease store while waiting (each
        is the request's heartbeat); default 2 s deferred, 0.5 s in the worker. A grant is noticed
        sooner: the pool's revision is read every 50 ms in the worker, 0.25 s in the triggerer.
    :param lease_conn_id: the ``delta_occ_leases`` connection of the lease store.
    :param storage_conn_id: the connection with the credentials of the table's object store (types
        ``aws``, ``wasb``, ``adls``, ``google_cloud_platform``), used both to read the table's log
        before Spark starts and by the Spark job; default: the ``delta_occ`` connection's
        ``storage_conn_id`` extra, else the stores' default credential chains.
    :param openlineage_inject_parent_job_info: give the Spark job the OpenLineage parent job
        properties (``spark.openlineage.parent*``), as ``SparkSubmitOperator`` does; default:
        ``[openlineage] spark_inject_parent_job_info``.
    :param openlineage_inject_transport_info: give it the OpenLineage transport too; default:
        ``[openlineage] spark_inject_transport_info``.
    :param early_abort: watch the table's log while the job runs (in every mode) and, as soon
        as a commit that landed makes the job's own commit certain to fail, cancel its Spark work and retry
        it as that conflict at once, instead of after all the doomed work. Acts only where the verdict is as
        sure as Delta's own check, and only for a job certain to commit (see docs/early-abort.md). Default:
        ``[delta_occ] early_abort`` (True).
    :param early_abort_interval: seconds between two looks at the log (default ``[delta_occ]
        early_abort_interval``, 1 s): a doomed job is stopped within about two of them.
    """

    template_fields: Sequence[str] = ("table", "table_name", "partitions", "spark_conf", "delta_conn_id")
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "partitions": "json", "merge_condition": "sql", "where": "sql", "source_query": "sql", "set": "json",
        "clauses": "json", "spark_conf": "json"}
    # The SQL text fields that may name a .sql file (under the DAG folder or template_searchpath).
    # Not ``template_ext``: Airflow applies that to every string of every field, nested ones too, so
    # an UPDATE's ``set={"v": "s.sql"}`` (column ``sql`` of the source) would be read as a file.
    sql_file_fields: ClassVar[tuple[str, ...]] = ("merge_condition", "where", "source_query")
    ui_color = "#00add4"
    operator_extra_links = (SparkUILink(),)
    operation = ""

    def __init__(self, *, table: str | None = None, table_name: str | None = None,
                 partitions: Mapping[str, Any] | str | None = None, strict_partitions: bool = False,
                 source_outside_partitions: str = "fail",
                 conflict_policies: Mapping[str, Any] | None = None,
                 delta_conn_id: str | None = DeltaSparkHook.default_conn_name,
                 spark_conf: Mapping[str, str] | None = None, idempotent: bool = True,
                 conflict_pool: str | None = None, deferrable: bool | None = None,
                 lease_poll_interval: float | None = None,
                 lease_conn_id: str = DeltaLeaseStoreHook.default_conn_name,
                 storage_conn_id: str | None = None, openlineage_inject_parent_job_info: bool | None = None,
                 openlineage_inject_transport_info: bool | None = None, early_abort: bool | None = None,
                 early_abort_interval: float | None = None, **kwargs: Any) -> None:
        # Everything that does not need the table is checked here, when the DAG file is parsed.
        if (table is None) == (table_name is None):
            raise JobSpecError(f"{type(self).__name__} needs exactly one of table= (path) or table_name=")
        for label, value in (("table", table), ("table_name", table_name)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise JobSpecError(f"{label} must be a non-empty string, got {value!r}")
            refuse_substitution(value, label, rendered=False)
        partitions_mapping(partitions, rendered=False)
        fixed: tuple[tuple[str, object, str], ...] = (
            ("conflict_pool", conflict_pool, "it picks the task's Airflow pool"),
            ("conflict_policies", conflict_policies, "the task-level retry policy is built from it"))
        for label, fixed_value, why in fixed:
            try:
                holds = _holds_template(fixed_value)
            except RecursionError:   # nested deeper than Python walks: the value's own check says so, typed
                holds = False
            if holds:
                raise JobSpecError(f"{label} is not templated: {why} when the DAG is parsed; give it as a "
                                   f"literal, got {fixed_value!r:.80}")
        if spark_conf is not None and (not isinstance(spark_conf, Mapping)
                                       or not all(isinstance(k, str) and k.strip() for k in spark_conf)):
            raise JobSpecError(f"spark_conf must be a mapping of Spark setting names to values, got {spark_conf!r:.80}")
        if owned := commit_identity_confs(spark_conf or {}):
            raise JobSpecError(f"spark_conf sets {', '.join(owned)}: the provider names each commit after the task run "
                               "itself (userMetadata, and txnAppId/txnVersion with idempotent=True); remove it")
        for key, value in (spark_conf or {}).items():
            if isinstance(value, str) and (found := _SPARK_PLACEHOLDER.search(_RAW_BLOCK.sub("", value))):
                raise JobSpecError(
                    f"spark_conf[{key!r}]: {found.group(0)} is Spark's own placeholder, but spark_conf is rendered by "
                    f"Airflow's Jinja first; write it as {{{{ '{found.group(0)}' }}}} or inside "
                    "{% raw %}...{% endraw %}")
        if delta_conn_id is not None and (not isinstance(delta_conn_id, str) or not delta_conn_id.strip()):
            raise JobSpecError(f"delta_conn_id must be a connection id or None, got {delta_conn_id!r}")
        if source_outside_partitions not in SOURCE_OUTSIDE_ACTIONS:
            raise JobSpecError(f"source_outside_partitions must be one of {', '.join(SOURCE_OUTSIDE_ACTIONS)}, "
                               f"got {source_outside_partitions!r}")
        try:
            self._policy_overrides = layer_overrides(conflict_policies)
        except (ValueError, TypeError) as exc:
            raise JobSpecError(f"conflict_policies: {exc}") from exc
        # One retry decision at both levels: the task-level policy resolves the same layers (platform
        # defaults, then this task's conflict_policies) as the runner's in-job loop.
        # `partial()` fills retry_policy=None for mapped tasks: None means unset here too.
        for where, policy in (("retry_policy", kwargs.get("retry_policy")),
                              ("default_args['retry_policy']", (kwargs.get("default_args") or {}).get("retry_policy"))):
            _check_retry_policy(where, policy)
        if kwargs.get("retry_policy") is None and (kwargs.get("default_args") or {}).get("retry_policy") is None:
            kwargs["retry_policy"] = DeltaConflictRetryPolicy(self.operation, self._policy_overrides)
        _default_retries(kwargs, kwargs.get("default_args"))
        holding.check_poll_interval(lease_poll_interval)
        if early_abort is not None and not isinstance(early_abort, bool):
            raise JobSpecError(f"early_abort must be True, False or None ([delta_occ] early_abort), "
                               f"got {early_abort!r}")
        if early_abort_interval is not None:
            config.check_early_abort_interval(early_abort_interval, "early_abort_interval")
        route_to_airflow_pool(kwargs, kwargs.get("default_args"), conflict_pool)
        if deferrable is not None and not isinstance(deferrable, bool):
            raise PoolConfigError(f"deferrable must be True, False or None (adaptive), got {deferrable!r}")
        if conflict_pool is not None and (known := configured_pool(conflict_pool)) is not None:
            holding.WaitRule.of(deferrable, known, default_deferrable=config.default_deferrable())
        check_pooled_literal(conflict_pool, table)
        super().__init__(**kwargs)
        self.table = table
        self.table_name = table_name
        self.partitions = partitions
        self.strict_partitions = strict_partitions
        self.source_outside_partitions = source_outside_partitions
        self.delta_conn_id = delta_conn_id
        self.spark_conf = dict(spark_conf or {})
        self.idempotent = idempotent
        self.conflict_pool = conflict_pool
        self.deferrable = deferrable
        self.lease_poll_interval = lease_poll_interval
        self.lease_conn_id = lease_conn_id
        self.storage_conn_id = storage_conn_id
        self.openlineage_inject_parent_job_info = openlineage_inject_parent_job_info
        self.openlineage_inject_transport_info = openlineage_inject_transport_info
        self.early_abort = early_abort
        self.early_abort_interval = early_abort_interval
        # (request id, owner) of the lease (or resumed request) this try gives back if killed
        self._held_lease: tuple[str, str] | None = None
        self._warming = False   # the Spark client's warm-up started in this task process
        self._lineage: DeltaJobLineage | None = None  # what the run wrote, for OpenLineage
        # The OpenLineage properties this try hands to its Spark job, kept apart from the author's
        # spark_conf: the provider's helper keeps parent properties already present, so writing them
        # into spark_conf would hand a later try (same operator object) the first try's run.
        self._openlineage_conf: dict[str, str] = {}

    def render_template_fields(self, context: Context, jinja_env: jinja2.Environment | None = None) -> None:
        """Read a ``.sql`` file named by a SQL text field, then render every field as usual.

        Raises:
            JobSpecError: the file is not under the DAG folder or ``template_searchpath``.
        """
        env = jinja_env or self.get_template_env(self.get_dag())
        for name in self.sql_file_fields:
            value = getattr(self, name, None)
            if name in self.template_fields and sql_file(value) and env.loader is not None:
                try:
                    setattr(self, name, env.loader.get_source(env, str(value))[0])
                except Exception as exc:  # jinja2.TemplateNotFound, or an unreadable file
                    raise JobSpecError(f"{name}: cannot read the SQL file {value!r} (looked under the DAG folder and "
                                       f"template_searchpath): {type(exc).__name__}: {exc}") from exc
        super().render_template_fields(context, env)
        if isinstance(self.spark_conf, Mapping):   # shown rendered in the UI: a secret conf's value is masked
            mask_secret_confs(self.spark_conf)

    @classmethod
    def partial(cls, **kwargs: Any) -> Any:
        """Mapped Delta tasks get the provider's default ``retries`` too (the scheduler reads it here)."""
        from airflow.sdk.bases.operator import get_merged_defaults
        from airflow.sdk.definitions._internal.contextmanager import DagContext, TaskGroupContext

        dag = kwargs.get("dag") or DagContext.get_current()
        group = kwargs.get("task_group") or (TaskGroupContext.get_current(dag) if dag else None)
        defaults, _ = get_merged_defaults(dag=dag, task_group=group, task_params=None,
                                          task_default_args=kwargs.get("default_args"))
        _check_retry_policy("retry_policy", kwargs.get("retry_policy"))
        _default_retries(kwargs, defaults)
        route_to_airflow_pool(kwargs, defaults, kwargs.get("conflict_pool"))
        check_pooled_literal(kwargs.get("conflict_pool"), kwargs.get("table"))
        return super().partial(**kwargs)

    # -- building the job -------------------------------------------------------------------------
    @cached_property
    def hook(self) -> DeltaSparkHook:
        """Built on first use, in the worker (never at DAG parse time)."""
        return DeltaSparkHook(self.delta_conn_id, spark_conf={**self.spark_conf, **self._openlineage_conf},
                              storage_conn_id=self.storage_conn_id)

    def _location(self) -> str:
        if self.table is not None:
            refuse_substitution(self.table, "table")  # as rendered; the name is checked by the hook
            return self.table
        return self.hook.table_location(str(self.table_name))

    def _run_identity(self, context: Any) -> RunIdentity:
        ti = context["ti"]
        try_number = int(getattr(ti, "try_number", 1) or 1)
        max_tries = getattr(ti, "max_tries", None)
        # Airflow sets max_tries = try_number + retries when a task instance is cleared, and keeps it
        # across retries: the first try of the current series is max_tries - retries + 1 (as the
        # Task SDK computes it for reschedules). Clamped, in case retries changed since.
        first_try = 1
        if max_tries is not None:
            first_try = int(max_tries) - int(self.retries or 0) + 1
            if not 1 <= first_try <= try_number:
                # retries changed in the DAG file since Airflow set max_tries: the series cannot be
                # told apart, and guessing could write twice or skip a clear's redo.
                raise JobSpecError(
                    f"cannot tell which series of tries this is: max_tries={max_tries} and retries={self.retries} "
                    f"at try {try_number} (retries changed since the task instance was created or cleared); clear "
                    "the task to start a new series")
        return RunIdentity(dag_id=ti.dag_id, task_id=ti.task_id, run_id=context["run_id"],
                           map_index=getattr(ti, "map_index", -1), try_number=try_number, first_try=first_try)

    def build_spec(self, snapshot: Snapshot, run: RunIdentity) -> JobSpec:
        """The job this task runs on ``snapshot`` (pure: see ``jobs/build.py``)."""
        return build_spec(self.target_arguments(), self.arguments(), snapshot, run, warn=self.log.warning)

    def target_arguments(self) -> TargetArguments:
        """The rendered arguments every operation shares, with the layered retry policies."""
        table = TableRef(path=self.table) if self.table is not None else TableRef(name=self.table_name)
        return TargetArguments(table=table, partitions=self.partitions, strict_partitions=self.strict_partitions,
                               source_outside=self.source_outside_partitions, idempotent=self.idempotent,
                               retry_policies=self.retry_policies())

    def retry_policies(self) -> dict[str, dict[str, Any]]:
        """The platform's ``[delta_occ] conflict_policies`` under this task's ``conflict_policies=``."""
        return layer_overrides(config.conflict_policies(), self._policy_overrides)

    def arguments(self) -> OperationArguments:
        """This operation's own rendered arguments."""
        raise NotImplementedError

    # -- running: prepare -> run -> confirm -------------------------------------------------------
    def execute(self, context: Any) -> dict[str, Any]:
        started = time.monotonic()
        self._kill_requested = threading.Event()   # set by on_kill: a lease wait or a granted lease stops
        self.log.info("retries: %s (a Delta task that sets none gets [delta_occ] task_retries); conflicts are "
                      "retried by %s", self.retries, type(self.retry_policy).__name__
                      if getattr(self, "retry_policy", None) is not None else "Airflow's retries only")
        self._warm_up_early(context)
        prepared = self.prepare(context)
        if self.conflict_pool is not None:
            return self._lease_and_run(context, prepared, started).to_dict()
        return self._run_prepared(prepared, started).to_dict()

    def _run_prepared(self, prepared: PreparedJob, started: float) -> JobResult:
        """Run the prepared job in Spark and confirm its commit."""
        return self._finish(prepared, self._run_in_spark(prepared), started)

    def _run_in_spark(self, prepared: PreparedJob) -> JobResult:
        """Hand the prepared job to Spark; its result as the runner reported it (not yet confirmed)."""
        self.log.info("Delta %s on %s at version %s, condition: %s", prepared.spec.operation,
                      prepared.spec.target.label, prepared.snapshot.version,
                      prepared.spec.condition_sql or "none (every row)")
        run_started_at = time.time()
        try:
            result = self.hook.run(prepared.spec, watch=self._table_watch(prepared))
        except ConflictSkipped as exc:
            raise AirflowSkipException(str(exc)) from exc
        except JobKilledError as exc:
            self._raise_if_committed(prepared, exc)
            raise
        except StatementRefusedError as exc:
            # Spark's position is in the statement the provider rendered: point into the author's own text.
            try:
                pointed = point_into_arguments(str(exc), self.arguments())
            except Exception:   # never hide Spark's refusal behind a defect of the pointer
                raise exc from None
            raise StatementRefusedError(pointed) from exc
        return replace(result, run_started_at=round(run_started_at, 3))

    def _table_watch(self, prepared: PreparedJob) -> TableWatch | None:
        """How the job reads its table's log while it runs, when early abort is on for this task (its
        ``early_abort=``, else ``[delta_occ] early_abort``; an OPTIMIZE only with ``early_abort=True``: a
        later commit that puts back a file it rewrites would let delta-spark's retry commit it after all, so its
        verdict is not as sure as Delta's own check, and the default does not stop it)."""
        from airflow_delta_occ.engine import DeltaLog
        from airflow_delta_occ.spark.early_abort import TableWatch

        if prepared.spec.operation is JobOperation.OPTIMIZE and self.early_abort is None:
            if config.early_abort():
                self.log.info("Early abort does not watch this optimize: a compaction is watched only when its task "
                              "asks (early_abort=True)")
            return None
        if not (self.early_abort if self.early_abort is not None else config.early_abort()):
            return None
        interval = self.early_abort_interval if self.early_abort_interval is not None else config.early_abort_interval()
        location, credentials = prepared.location, self.hook.credentials_for(prepared.location)
        return TableWatch(open_log=lambda: DeltaLog.for_table(location, credentials=credentials), interval=interval)

    def _raise_if_committed(self, prepared: PreparedJob, killed: JobKilledError) -> None:
        """A kill can land after the job's commit (the job stops while it reports): read the Delta log, and if
        this run's commit is there, say so where users look, so nobody runs a write again that happened.

        Raises:
            JobKilledAfterCommitError: the log holds a commit of this run after the job's snapshot.
        """
        from airflow_delta_occ.engine import DeltaLog
        from airflow_delta_occ.jobs.verify import run_commits

        try:
            log = DeltaLog.for_table(prepared.location, credentials=self.hook.credentials_for(prepared.location))
            ours = run_commits(prepared.spec, log.commits_after(prepared.snapshot.version))
        except Exception as exc:   # unknown: the kill's own error stands, and says so
            self.log.warning("the task was killed; whether its job committed could not be read from the Delta log "
                             "of %s (%s): look for a commit of this run before running it again", prepared.location,
                             exc)
            return
        if ours:
            version = min(c.version for c in ours)   # the job's own; Delta's auto-compaction after it carries its tag
            idempotent = prepared.spec.idempotent
            message = (f"the task was killed after its job committed version {version} of {prepared.location}: the "
                       "write is in the table; do not run it again" + (
                           " (a retry of this task run finds it and writes nothing)" if idempotent else
                           " (idempotent=False: a retry would write it again, so this failure is not retried)"))
            self.log.warning("%s", message)
            raise JobKilledAfterCommitError(message, version=version, idempotent=idempotent) from killed

    def _finish(self, prepared: PreparedJob, result: JobResult, started: float) -> JobResult:
        """Confirm the commit in the Delta log, record lineage and log the outcome."""
        result = self.confirm(prepared, result)
        result = replace(result, task_seconds=round(time.monotonic() - started, 3))  # with Spark start-up
        self.record_lineage(result)
        self.log.info("committed version %s after %s attempt(s), conflicts: %s", result.version, result.attempts,
                      [c.kind.value for c in result.conflicts])
        return result

    # -- conflict pools: lease -> run -> release (see pools/holding.py) --------------------------
    def execute_complete(self, context: Any, event: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        """Resume after the triggerer saw the lease granted: plan the job again (the table may have moved
        while it waited) and run it with the lease.

        Raises:
            LeaseStoreError: the trigger reported an error (no usable store, the request unreadable).
        """
        self._warm_up_early(context)
        if event and event.get("status") == "near":
            # The grant is expected within seconds: wait the rest here, with the job prepared and its
            # session opening, so it starts as soon as the lease is granted (the request kept its place).
            self.log.info("conflict pool %s: lease request %s expected to be granted in about %.1f s; waiting "
                          "the rest in the worker", self.conflict_pool, event.get("request_id"),
                          float(event.get("expected") or 0.0))
            started = time.monotonic()
            self._kill_requested = threading.Event()
            owner, request_id = lease_owner(context), str(event.get("request_id") or "")
            self._held_lease = (request_id, owner) if request_id else None   # on_kill gives its place back
            try:
                return self._lease_and_run(context, self.prepare(context), started, came_back=True,
                                           seen=list(event.get("blockers_seen") or [])).to_dict()
            except TaskDeferred:
                raise   # the request moves to the trigger again, in its place
            except BaseException:
                # Failed before a wait or a lease took the request over (a plan that fails, the store):
                # its place is given back now rather than held until its TTL.
                self._cancel_request(owner, request_id)
                raise
            finally:
                self._held_lease = None
        if not event or event.get("status") != "granted":
            message = (event or {}).get("message") or f"unexpected lease trigger event {event!r}"
            if event and event.get("request_id"):   # the trigger gave up: its request keeps no place
                self._cancel_request(lease_owner(context), str(event["request_id"]))
            raise LeaseStoreError(f"conflict pool {self.conflict_pool!r}: waiting for a lease failed: {message}")
        started = time.monotonic()
        self._kill_requested = threading.Event()
        pool = required_pool(str(self.conflict_pool))
        lease = HeldLease(pool.name, str(event["request_id"]), lease_owner(context),
                          float(event.get("waited") or 0.0), holding.blocker_names(event.get("blockers_seen") or []))
        store = self._lease_store()
        try:
            return self._run_granted(context, store, pool, lease, started).to_dict()
        finally:
            store.close()

    def _lease_and_run(self, context: Any, prepared: PreparedJob, started: float, *,
                       came_back: bool = False, seen: list[dict[str, Any]] | None = None) -> JobResult:
        """Ask the pool for a lease on ``prepared``'s footprint: run at once if granted, else wait for it
        where the task's ``WaitRule`` says (in the worker, deferred, or adaptive: each in turn). A task
        the trigger sent back (``came_back``: its grant is near) waits in the worker for up to
        ``worker_wait`` seconds whatever the estimate says now, so the two never hand it back and forth.
        ``seen``: whom the wait was blocked by before (the trigger's ``blockers_seen``); the lease's
        ``waited_for`` keeps naming them whichever part of the wait ends it.

        Raises:
            PoolConfigError: no pool file, no such pool, or the table is not in it.
            TaskDeferred: the request waits; the task resumes in ``execute_complete``.
            JobKilledError: the task was killed while it waited in the worker.
        """
        pool = required_pool(str(self.conflict_pool))
        rule = self._wait_rule(pool)
        owner = lease_owner(context)
        table = pooled_table(pool, prepared.location)
        store = self._lease_store()
        try:
            # How long this table's leases of each kind were held: the request says what it expects to
            # hold (the arbiter may grant it beside a holder, ahead of a request that waits longer), and
            # an adaptive wait weighs its expected wait with it.
            estimate = holding.WaitEstimate.read(store, table, self.log)
            request = holding.request_for(pool, table=table, owner=owner, footprint=prepared.footprint,
                                          snapshot=prepared.snapshot, estimate=estimate)
            state = store.acquire(request)
            account = holding.BlockersSeen(seen or [])
            account.update(state.blockers)
            seen = account.seen()
            if state.granted:
                lease = HeldLease(pool.name, state.request_id, owner, state.waited or 0.0,
                                  holding.blocker_names(seen))
                if state.record is not None and (state.record.granted_at or 0.0) < state.checked_at:
                    # granted before this call (while the task came back from the triggerer): renew first
                    return self._run_granted(context, store, pool, lease, started, earlier=prepared)
                return self._run_leased(store, pool, lease, prepared, started)
            self.log.info("conflict pool %s: lease request %s on %s waits for %s (waiting: %s)", pool.name,
                          state.request_id, request.table, holding.describe_wait(state), rule.where.value)
            if rule.where is not holding.WaitWhere.DEFERRED:
                waited = holding.wait_in_worker(store, request, state, self._poll_interval(deferred=False),
                                                self.log, self._kill_requested, rule=rule,
                                                estimate=None if came_back else estimate,
                                                staying=self._warm_up, seen=seen)
                if waited.granted:
                    lease = HeldLease(pool.name, waited.state.request_id, owner, waited.state.waited or 0.0,
                                      waited.waited_for)
                    return self._run_granted(context, store, pool, lease, started, earlier=prepared)
                state, seen = waited.state, waited.blockers_seen
        finally:
            store.close()
        from airflow_delta_occ.triggers.lease import DeltaLeaseTrigger, settle_seconds

        holding.show_wait(context["ti"], holding.wait_record(pool.name, request.table, state), self.log)
        self.defer(trigger=DeltaLeaseTrigger(lease_conn_id=self.lease_conn_id, request_id=state.request_id,
                                             owner=owner, request=request.to_json(),
                                             poll_interval=self._poll_interval(deferred=True),
                                             resume_ahead=rule.comes_back, blockers_seen=seen,
                                             settle=settle_seconds()),
                   method_name="execute_complete", timeout=None)

    def _cancel_request(self, owner: str, request_id: str) -> None:
        """Give up ``request_id`` (a wait this try no longer pursues); never raises (it expires anyway)."""
        if not request_id:
            return
        try:
            store = self._lease_store()
        except LeaseError as exc:
            self.log.warning("could not cancel lease request %s of %s (it is abandoned after its TTL): %s",
                             request_id, owner, exc)
            return
        try:
            holding.cancel_requests(store, owner, {request_id}, table=None, log=self.log)
        finally:
            store.close()

    def _wait_rule(self, pool: Pool) -> holding.WaitRule:
        """Where this task waits for its lease (``deferrable``, Airflow's default, or adaptive)."""
        return holding.WaitRule.of(self.deferrable, pool, default_deferrable=config.default_deferrable(),
                                   worker_wait=config.worker_wait())

    def _warm_up_early(self, context: Any) -> None:
        """Load what the job's Spark client needs while the table is read and the job planned, when the
        mode's warm-up only loads code (Spark Connect's client: about half a second that was otherwise
        spent after the lease was granted, on a chain of conflicting writers' critical path).

        Never raises: it runs before the steps that give a lease or a place in line back when they
        fail, so a hook that cannot be built fails there (in ``prepare``), where that is handled.
        The OpenLineage properties go first: the hook built here is the job's (they are part of it).
        """
        try:
            self._inject_openlineage_properties(context)
            light = self.hook.light_warm_up
        except Exception as exc:
            self.log.debug("no early warm-up (the job meets this again where it is handled): %s", exc)
            return
        if light:
            self._warm_up()

    def _warm_up(self) -> None:
        """Start the job's Spark session while the lease is awaited in the worker (in a thread: the wait
        goes on), so a granted job starts its Spark work at once. A failure is left to the job itself.
        Once per task process: a second call does nothing."""
        if self._warming:
            return
        self._warming = True

        def warm() -> None:
            try:
                self.hook.warm_up()
            except Exception as exc:  # the job opens its own session and reports what fails there
                self.log.debug("warming the Spark session up failed: %s", exc)

        threading.Thread(target=warm, name="delta-occ-warm-up", daemon=True).start()

    def _run_granted(self, context: Any, store: LeaseStore, pool: Pool, lease: HeldLease,
                     started: float, earlier: PreparedJob | None = None) -> JobResult:
        """Run the job with a lease granted after a wait: plan it again (the table may have moved while it
        waited), renew the lease (its TTL ran since the grant: one that expired meanwhile is asked for
        again from scratch), then run it. Whatever fails or kills the task before the job starts gives
        the lease back, so the next writer need not wait for its TTL.

        Raises:
            JobKilledError: ``on_kill`` ran before the job started.
        """
        self._held_lease = (lease.request_id, lease.owner)   # on_kill releases it from here on
        try:
            prepared = self.prepare(context, earlier=earlier)
            pooled_table(pool, prepared.location)  # a table_name may now resolve elsewhere
            if self._kill_requested.is_set():
                raise JobKilledError(f"the task was killed after its lease {lease.request_id} was granted, "
                                     "before its job started; the lease is released")
            store.renew(lease.request_id, lease.owner)
        except LeaseLostError as exc:
            self._held_lease = None
            if self._kill_requested.is_set():   # on_kill released it
                raise JobKilledError(f"the task was killed after its lease {lease.request_id} was granted, "
                                     "before its job started; the lease is released") from exc
            self.log.warning("conflict pool %s: the granted lease %s expired before the job could start (%s); "
                             "asking again", pool.name, lease.request_id, exc)
            return self._lease_and_run(context, prepared, started)
        except BaseException:
            self._held_lease = None
            holding.release_quietly(store, lease.request_id, lease.owner, self.log)
            raise
        return self._run_leased(store, pool, lease, prepared, started)

    def _poll_interval(self, *, deferred: bool) -> float:
        if self.lease_poll_interval is not None:
            return float(self.lease_poll_interval)
        return holding.DEFERRED_POLL_SECONDS if deferred else holding.WORKER_POLL_SECONDS

    def _run_leased(self, store: LeaseStore, pool: Pool, lease: HeldLease, prepared: PreparedJob,
                    started: float) -> JobResult:
        """Run the job in Spark while the lease is renewed; release it when Spark is done (success or
        failure), then confirm the commit."""
        self.log.info("conflict pool %s: lease %s held by %s (waited %.3f s for %s)", pool.name, lease.request_id,
                      lease.owner, lease.waited, lease.waited_for or "nobody")
        self._held_lease = (lease.request_id, lease.owner)
        try:
            # Released as soon as Spark is done (committed or not): confirming the commit reads the log
            # and needs no lease, and the next writer's Spark work should not wait for it.
            with holding.holding(store, lease, pool.heartbeat, self.log):
                try:
                    ran = self._run_in_spark(prepared)
                except BaseException as exc:   # skipped, or failed once its attempts ran out: say so in the audit too
                    lease.release_note = _stopped_early_note(exc)
                    raise
                lease.release_note = "; ".join(
                    f"attempt {c.attempt} stopped early by version {c.winning_version} ({c.winning_operation}): "
                    f"{c.kind.value}" for c in ran.conflicts if c.early)
        finally:
            self._held_lease = None
        result = self._finish(prepared, ran, started)
        return replace(result, lease=JobLease(pool=lease.pool, request_id=lease.request_id, waited=lease.waited,
                                              waited_for=tuple(lease.waited_for), lost=lease.lost))

    def _lease_store(self) -> LeaseStore:
        store: LeaseStore = DeltaLeaseStoreHook(self.lease_conn_id).get_store()
        return store

    def on_kill(self) -> None:
        """Stop the killed task's Spark job, then release its lease, so the next writer need not wait
        for the TTL. The job is stopped first: a writer granted the lease must not race a job that
        could still commit."""
        killed: threading.Event | None = self.__dict__.get("_kill_requested")
        if killed is not None:
            killed.set()   # a wait in the worker cancels its request; a granted lease is not used
        hook: DeltaSparkHook | None = self.__dict__.get("hook")  # built by prepare(); never here
        if hook is not None:
            hook.on_kill()
        held, self._held_lease = self._held_lease, None
        if held is not None:
            store = self._lease_store()
            try:
                holding.release_quietly(store, *held, self.log)
            finally:
                store.close()
        super().on_kill()

    def prepare(self, context: Any, earlier: PreparedJob | None = None) -> PreparedJob:
        """Read the table's snapshot (no Spark), build the job and plan what it reads. Given the job as
        prepared ``earlier`` in this try (before a wait for its lease), only the commits since are read.

        Raises:
            TableNotFoundError: before Spark starts; JobSpecError: the job cannot be built.
        """
        self._inject_openlineage_properties(context)
        prepared = self.plan_job(self._run_identity(context), earlier)
        spec = prepared.spec
        # Before any lease or Spark: the job's storage settings, and the refusal of commits that S3
        # could lose.
        self.hook.use_storage(prepared.location, spec.source.path if spec.source is not None else None)
        self._lineage = lineage_of(prepared.location, spec, prepared.snapshot)
        return prepared

    def plan_job(self, run: RunIdentity, earlier: PreparedJob | None = None) -> PreparedJob:
        """The job of ``run`` on the table as it is now, from the rendered arguments: what ``prepare`` runs and
        what ``airflow delta-occ check`` judges before anything runs (the same path, so the check sees the
        footprint the task would lease). Reads the table's log with the engine; starts no Spark for a ``table``
        path (a ``table_name`` is looked up in Spark's catalog).

        Raises:
            TableNotFoundError: no Delta table there; JobSpecError: the job cannot be built.
        """
        from airflow_delta_occ.engine import DeltaLog
        from airflow_delta_occ.jobs.footprint import read_plan_of

        location = self._location()
        if earlier is not None and earlier.location == location:
            snapshot = earlier.snapshot.update()
        else:
            snapshot = DeltaLog.for_table(location, credentials=self.hook.credentials_for(location)).snapshot()
        spec = self.build_spec(snapshot, run)
        return PreparedJob(location, snapshot, spec, read_plan_of(spec, snapshot))

    def _inject_openlineage_properties(self, context: Any) -> None:
        """Add the OpenLineage parent job (and transport) properties to the job's Spark conf, with the
        OpenLineage provider's own helpers (a no-op without the provider), before the hook is built."""
        from airflow.providers.common.compat.openlineage.utils.spark import (
            inject_parent_job_information_into_spark_properties,
            inject_transport_information_into_spark_properties,
        )
        from airflow.sdk import conf

        parent, transport = self.openlineage_inject_parent_job_info, self.openlineage_inject_transport_info
        if parent is None:
            parent = conf.getboolean("openlineage", "spark_inject_parent_job_info", fallback=False)
        if transport is None:
            transport = conf.getboolean("openlineage", "spark_inject_transport_info", fallback=False)
        properties = dict(self.spark_conf)
        if parent:
            properties = inject_parent_job_information_into_spark_properties(properties, context)
        if transport:
            properties = inject_transport_information_into_spark_properties(properties, context)
        injected = {k: str(v) for k, v in properties.items() if k not in self.spark_conf}
        if injected == self._openlineage_conf:
            return   # nothing new (a second call in this try): the hook built stays, nothing to log
        self._openlineage_conf = injected
        self.__dict__.pop("hook", None)  # the hook takes its spark_conf when it is built
        if parent:
            self.log.info("OpenLineage: the Spark job is handed run %s (%s) as its parent",
                          properties.get("spark.openlineage.parentRunId"),
                          properties.get("spark.openlineage.parentJobName"))

    def record_lineage(self, result: JobResult) -> None:
        """Complete the run's lineage from its confirmed result (the committed version, Delta's metrics),
        and log which OpenLineage parent the Spark job's session actually held.

        A parent other than the one handed over is a warning, not a failure: the data was written, but
        a Spark OpenLineage listener would attach the job's events to another run.
        """
        if self._lineage is not None:
            self._lineage = replace(self._lineage, version=result.version, metrics=dict(result.metrics),
                                    already_committed=result.already_committed)
        handed = self._openlineage_conf.get("spark.openlineage.parentRunId") or self.spark_conf.get(
            "spark.openlineage.parentRunId")
        seen = result.openlineage_parent.run_id if result.openlineage_parent is not None else None
        if handed is None and seen is None:
            return
        if handed == seen:
            self.log.info("OpenLineage: the Spark job's session held parent run %s", seen)
        else:
            self.log.warning("OpenLineage: the Spark job was handed parent run %s but its session held %s; a "
                             "Spark OpenLineage listener would report the job under the wrong run", handed, seen)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The OpenLineage provider's ``OperatorLineage`` of this run (see ``operators/lineage.py``):
        the target with its schema and the version committed, the source, the source query. On a
        failure (the provider falls back to this method) the version is absent."""
        from airflow_delta_occ.engine import DeltaLog

        lineage = self._lineage
        if lineage is None:  # refused before the table was read: name the target if it is a location
            if self.table is None:
                from airflow.providers.openlineage.extractors import OperatorLineage

                return OperatorLineage()
            lineage = DeltaJobLineage(location=self.table, operation=self.operation)
        elif lineage.version is not None and lineage.commit_operation is None:  # confirm did not see the commit
            try:  # the schema the commit left (a MERGE may have evolved it), and Delta's name of the commit
                log = DeltaLog.for_table(lineage.location, credentials=self.hook.credentials_for(lineage.location))
                snapshot = log.snapshot(lineage.version)
                [commit] = log.commits_after(lineage.version - 1, until=lineage.version)
                lineage = replace(lineage, columns=schema_columns(snapshot.schema), commit_operation=(
                    commit.commit_info.operation if commit.commit_info is not None else None))
            except Exception as exc:  # lineage must never fail the task; the prepared schema stands
                self.log.warning("OpenLineage: cannot read version %s of the table: %s", lineage.version, exc)
        return operator_lineage(lineage)

    def confirm(self, prepared: PreparedJob, result: JobResult) -> JobResult:
        """Check the Delta log itself for this run's commit: Spark's word alone is not proof.

        Reads only the commits after the snapshot the job was prepared at, and judges them with
        ``jobs.verify.confirm_commit``.

        Raises:
            CommitNotConfirmedError: Spark reported a commit the log does not show for this run.
            CommitOutsidePartitionsError: a commit of the run changed files outside its partitions.
        """
        from airflow_delta_occ.engine import DeltaLog

        spec = prepared.spec
        if result.version is None:
            if spec.operation in ("append", "overwrite_partitions"):
                raise CommitNotConfirmedError(f"no commit of run {spec.run.app_id} in {prepared.location}")
            # DML or OPTIMIZE that matched nothing: Delta commits nothing, which is a success.
            self.log.info("nothing matched: no new version of %s", prepared.location)
            return result
        from airflow_delta_occ.jobs.verify import confirm_commit

        log = DeltaLog.for_table(prepared.location, credentials=self.hook.credentials_for(prepared.location))
        after = min(prepared.snapshot.version, result.version - 1)  # an earlier try may have committed it
        try:
            commit = confirm_commit(spec, prepared.read_plan, prepared.snapshot, log.commits_after(after),
                                    result.version, prepared.location)
        except CommitOutsidePartitionsError as exc:
            self.log.error("%s", exc)   # where users look, before the task fails
            raise
        if self._lineage is not None and commit.schema is not None:  # lineage need not read the log again
            self._lineage = replace(self._lineage, columns=schema_columns(commit.schema),
                                    commit_operation=commit.operation)
        return replace(result, confirmed=True)


def _check_retry_policy(where: str, policy: Any) -> None:
    """A ``retry_policy`` must be an Airflow ``RetryPolicy``: anything else makes Airflow log "Retry policy
    evaluation failed, falling back" at failure time and retry every error, permanent ones included."""
    from airflow.sdk import RetryPolicy

    if policy is not None and not isinstance(policy, RetryPolicy):
        raise JobSpecError(f"{where} must be an airflow.sdk RetryPolicy (e.g. airflow_delta_occ.operators.retry_policy."
                           f"DeltaConflictRetryPolicy, or left unset for it), got {type(policy).__name__}")


# Spark's and YARN's own placeholders in confs (``{{APP_ID}}``, ``{{EXECUTOR_ID}}``): upper case, which Airflow's
# context names never are. Jinja would fail on them (undefined) when spark_conf is rendered.
# One quoted as a Jinja string (``{{ '{{APP_ID}}' }}``) or inside ``{% raw %}`` is written right.
_SPARK_PLACEHOLDER = re.compile(r"(?<!['\"])\{\{\s*[A-Z][A-Z0-9_]*\s*\}\}(?!['\"])")
_RAW_BLOCK = re.compile(r"\{%-?\s*raw\s*-?%\}.*?\{%-?\s*endraw\s*-?%\}", re.DOTALL)


def _holds_template(value: object) -> bool:
    """Whether a Jinja template is anywhere in ``value`` (text, or the keys and values of nested mappings
    and lists)."""
    return any(templated(text) for text in strings_in(value))


def _default_retries(kwargs: dict[str, Any], default_args: Mapping[str, Any] | None) -> None:
    """A retry policy never extends past ``retries``, and Airflow's default is 0: unless the author
    (or the DAG's ``default_args``) sets it, a Delta task gets ``[delta_occ] task_retries``."""
    if "retries" not in kwargs and "retries" not in (default_args or {}):
        kwargs["retries"] = config.task_retries()


class DeltaMergeOperator(DeltaBaseOperator):
    """MERGE a source into a Delta table.

    With ``partitions=``, the partition predicate is ANDed into ON *and* into every NOT MATCHED BY
    SOURCE clause (otherwise every target row of every other partition is "not matched by source"),
    and every source row must write inside the partitions (see ``source_outside_partitions``).
    A MERGE with NOT MATCHED BY SOURCE clauses still reads the whole table for Delta's conflict check.

    :param source: source path (``source_format`` default ``delta``), or ``source_table``, or ``source_query``.
    :param merge_condition: the ON condition, e.g. ``t.id = s.id``; the partition predicate is added.
    :param clauses: WHEN clauses as dicts (``{"kind": "matched_update", "set": {"v": "s.v"}}``); the default
        is an upsert: update all columns when matched, insert all when not.
    """

    template_fields: Sequence[str] = (*DeltaBaseOperator.template_fields, "source", "source_table", "source_query",
                                      "source_format", "merge_condition", "clauses")
    operation = "merge"

    def __init__(self, *, merge_condition: str, source: str | None = None, source_table: str | None = None,
                 source_query: str | None = None, source_format: str = "delta",
                 clauses: Sequence[Mapping[str, Any]] | None = None, target_alias: str = "t",
                 source_alias: str = "s", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_one_source(type(self).__name__, source, source_table, source_query)
        if not templated(source_format):
            check_source_format(source_format)
        if not templated(merge_condition) and not sql_file(merge_condition):
            parse_expression(merge_condition, "merge_condition")
        self.clauses = check_clauses(clauses if clauses is not None else
                                     [{"kind": "matched_update_all"}, {"kind": "not_matched_insert_all"}])
        for name, alias in (("target_alias", target_alias), ("source_alias", source_alias)):
            if not isinstance(alias, str) or not alias.strip():
                raise JobSpecError(f"{name} must be a non-empty name, got {alias!r}")
            refuse_substitution(alias, name)
        if target_alias.lower() == source_alias.lower():
            raise JobSpecError(f"target_alias and source_alias are both {target_alias!r}")
        self.merge_condition = merge_condition
        self.source, self.source_table, self.source_query = source, source_table, source_query
        self.source_format = source_format
        self.target_alias, self.source_alias = target_alias, source_alias

    def arguments(self) -> MergeArguments:
        source = SourceArguments(self.source, self.source_table, self.source_query, self.source_format)
        return MergeArguments(merge_condition=self.merge_condition, source=source, clauses=self.clauses,
                              target_alias=self.target_alias, source_alias=self.source_alias)


class DeltaUpdateOperator(DeltaBaseOperator):
    """UPDATE rows: ``set={"status": "'closed'"}`` (SQL expressions), optional ``where``."""

    template_fields: Sequence[str] = (*DeltaBaseOperator.template_fields, "where", "set")
    operation = "update"

    def __init__(self, *, set: Mapping[str, str], where: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(set, Mapping) or not set:
            raise JobSpecError(f"set must be a non-empty mapping of column to SQL expression, got {set!r}")
        for key, value in set.items():
            refuse_substitution(key, "a set key", rendered=False)
            check_sql_text(value, f"set[{key}]")
        if where is not None and not templated(where) and not sql_file(where):
            parse_expression(where, "where")
        self.set, self.where = dict(set), where

    def arguments(self) -> UpdateArguments:
        return UpdateArguments(set=self.set, where=self.where)


class DeltaDeleteOperator(DeltaBaseOperator):
    """DELETE rows matching ``where`` (and the partitions)."""

    template_fields: Sequence[str] = (*DeltaBaseOperator.template_fields, "where")
    operation = "delete"

    def __init__(self, *, where: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if where is None and self.partitions is None:
            raise JobSpecError("DeltaDeleteOperator needs where= or partitions= (deleting everything is refused)")
        if where is not None and not templated(where) and not sql_file(where):
            parse_expression(where, "where")
        self.where = where

    def arguments(self) -> DeleteArguments:
        return DeleteArguments(where=self.where)


class DeltaOptimizeOperator(DeltaBaseOperator):
    """OPTIMIZE (bin-packing compaction), optionally ``zorder_by=["id"]``, within ``partitions``."""

    template_fields: Sequence[str] = (*DeltaBaseOperator.template_fields, "zorder_by")
    operation = "optimize"

    def __init__(self, *, zorder_by: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(zorder_by, str | bytes) or not isinstance(zorder_by, Sequence):
            raise JobSpecError(f"zorder_by must be a list of column names, got {zorder_by!r}")
        if not all(isinstance(c, str) and c.strip() for c in zorder_by):
            raise JobSpecError(f"zorder_by must hold column names, got {list(zorder_by)!r}")
        refuse_substitution(list(zorder_by), "zorder_by", rendered=False)
        self.zorder_by = list(zorder_by)

    def arguments(self) -> OptimizeArguments:
        return OptimizeArguments(zorder_by=tuple(self.zorder_by))


class DeltaAppendOperator(DeltaBaseOperator):
    """Blind append of a source; idempotent across retries of the same task run (txnAppId/txnVersion).

    With ``partitions=``, every source row must belong to them (see ``source_outside_partitions``).
    """

    template_fields: Sequence[str] = (*DeltaBaseOperator.template_fields, "source", "source_table", "source_query",
                                      "source_format")
    operation = "append"

    def __init__(self, *, source: str | None = None, source_table: str | None = None,
                 source_query: str | None = None, source_format: str = "delta", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_one_source(type(self).__name__, source, source_table, source_query)
        if not templated(source_format):
            check_source_format(source_format)
        self.source, self.source_table, self.source_query = source, source_table, source_query
        self.source_format = source_format

    def arguments(self) -> AppendArguments | OverwritePartitionsArguments:
        return AppendArguments(
            source=SourceArguments(self.source, self.source_table, self.source_query, self.source_format))


class DeltaOverwritePartitionsOperator(DeltaAppendOperator):
    """Replace exactly the given ``partitions`` with the source's rows (Delta ``replaceWhere``)."""

    operation = "overwrite_partitions"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.partitions is None:
            raise JobSpecError("DeltaOverwritePartitionsOperator needs partitions= (it must not replace everything)")

    def arguments(self) -> OverwritePartitionsArguments:
        return OverwritePartitionsArguments(
            source=SourceArguments(self.source, self.source_table, self.source_query, self.source_format))
