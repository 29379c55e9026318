"""Operators that write to Delta tables with injected partition predicates and typed conflict retries.

Every operator renders its templates, validates the job against the table's own metadata (read by
the engine, without Spark), injects the partition predicate, runs the job through
``DeltaSparkHook`` and confirms the commit in the Delta log before it reports success. The result
(table, operation, committed version, Delta's operation metrics, attempts and every conflict seen,
run time, and the final condition that ran) is the task's XCom return value.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException

from airflow_delta_occ.engine import DeltaLog, Snapshot
from airflow_delta_occ.engine.expressions import partition_conjuncts
from airflow_delta_occ.exceptions import (
    CommitNotConfirmedError,
    ConflictSkipped,
    JobSpecError,
    MissingPartitionConstraintError,
    ProviderConfigError,
)
from airflow_delta_occ.hooks.delta import DeltaSparkHook
from airflow_delta_occ.jobspec import JobSpec, MergeClause, RunIdentity, SourceRef, TableRef
from airflow_delta_occ.partitions import PartitionFilter, build_partition_filter, checked_sql, conjoin
from airflow_delta_occ.retry import layer_overrides
from airflow_delta_occ.retry_policy import DeltaConflictRetryPolicy


class DeltaBaseOperator(BaseOperator):
    """Shared parameters: the target table, partitions to constrain the job to, retries, connection.

    :param table: target table path or URI (``/lake/sales``, ``s3://bucket/sales``).
    :param table_name: target table by catalog name instead of ``table``.
    :param partitions: ``{"date": "{{ ds }}", "country": ["DE", "FR"]}``; typed by the table's schema
        and ANDed into the job's condition so concurrent jobs on other partitions do not conflict.
    :param strict_partitions: fail instead of warning when a job on a partitioned table does not
        constrain its partitions.
    :param conflict_policies: per-exception overrides, e.g.
        ``{"ConcurrentAppendException": {"max_attempts": 8}, "ConcurrentDeleteDeleteException": "skip"}``.
    :param delta_conn_id: the ``delta_occ`` connection (mode, Spark connection); optional.
    """

    template_fields: Sequence[str] = ("table", "table_name", "partitions")
    template_fields_renderers: ClassVar[dict[str, str]] = {"partitions": "json"}
    ui_color = "#00add4"
    operation = ""

    def __init__(self, *, table: str | None = None, table_name: str | None = None,
                 partitions: Mapping[str, Any] | None = None, strict_partitions: bool = False,
                 conflict_policies: Mapping[str, Any] | None = None,
                 delta_conn_id: str | None = DeltaSparkHook.default_conn_name,
                 spark_conf: Mapping[str, str] | None = None, idempotent: bool = True, **kwargs: Any) -> None:
        if (table is None) == (table_name is None):
            raise JobSpecError(f"{type(self).__name__} needs exactly one of table= (path) or table_name=")
        try:  # fail at DAG parse time on a bad override
            self._policy_overrides = layer_overrides(conflict_policies)
        except ValueError as exc:
            raise JobSpecError(f"conflict_policies: {exc}") from exc
        kwargs.setdefault("retry_policy", DeltaConflictRetryPolicy())
        super().__init__(**kwargs)
        self.table = table
        self.table_name = table_name
        self.partitions = partitions
        self.strict_partitions = strict_partitions
        self.delta_conn_id = delta_conn_id
        self.spark_conf = dict(spark_conf or {})
        self.idempotent = idempotent

    # -- building the job -------------------------------------------------------------------------
    def _hook(self) -> DeltaSparkHook:
        return DeltaSparkHook(self.delta_conn_id, spark_conf=self.spark_conf)

    def _location(self, hook: DeltaSparkHook) -> str:
        return self.table if self.table is not None else hook.table_location(str(self.table_name))

    def _partition_filter(self, snapshot: Snapshot) -> PartitionFilter:
        partitions = self.partitions
        if isinstance(partitions, str):  # a rendered Jinja expression that produced JSON
            partitions = json.loads(partitions)
        return build_partition_filter(snapshot.schema, snapshot.partition_columns, partitions)

    def _check_constrained(self, snapshot: Snapshot, pfilter: PartitionFilter, condition: str | None,
                           alias: str | None) -> None:
        if not snapshot.partition_columns or pfilter:
            return
        constrained = False
        if condition:
            expr = snapshot.bind(condition, target_alias=alias)
            constrained = bool(partition_conjuncts(expr, snapshot.partition_columns))
        if constrained:
            return
        message = (f"{self.operation.upper()} on {self.table or self.table_name} is not constrained to partitions "
                   f"({', '.join(snapshot.partition_columns)}): Delta will treat it as reading every partition, "
                   "so any concurrent write to this table makes it fail with ConcurrentAppendException. "
                   "Pass partitions={...} to confine it.")
        if self.strict_partitions:
            raise MissingPartitionConstraintError(message)
        self.log.warning(message)

    def _run_identity(self, context: Any) -> RunIdentity:
        ti = context["ti"]
        return RunIdentity(dag_id=ti.dag_id, task_id=ti.task_id, run_id=context["run_id"],
                           map_index=getattr(ti, "map_index", -1), try_number=getattr(ti, "try_number", 1))

    def build_spec(self, snapshot: Snapshot, run: RunIdentity) -> JobSpec:
        raise NotImplementedError

    # -- running ----------------------------------------------------------------------------------
    def execute(self, context: Any) -> dict[str, Any]:
        started = time.monotonic()
        hook = self._hook()
        location = self._location(hook)
        snapshot = DeltaLog.for_table(location).snapshot()  # TableNotFoundError before Spark starts
        spec = self.build_spec(snapshot, self._run_identity(context))
        self.log.info("Delta %s on %s, condition: %s", spec.operation, spec.target.label, spec.condition)
        try:
            result = hook.run(spec)
        except ConflictSkipped as exc:
            raise AirflowSkipException(str(exc)) from exc
        result["confirmed"] = self._confirm(location, spec, result)
        result["task_seconds"] = round(time.monotonic() - started, 3)  # with Spark start-up or submission
        self.log.info("committed version %s after %s attempt(s), conflicts: %s", result.get("version"),
                      result.get("attempts"), [c["kind"] for c in result.get("conflicts", [])])
        return result

    def _confirm(self, location: str, spec: JobSpec, result: Mapping[str, Any]) -> bool:
        """Check the Delta log itself for this run's commit: Spark's word alone is not proof."""
        version = result.get("version")
        if version is None:
            if spec.operation in ("append", "overwrite_partitions"):
                raise CommitNotConfirmedError(f"no commit of run {spec.run.app_id} in {location}")
            # DML or OPTIMIZE that matched nothing: Delta commits nothing, which is a success.
            self.log.info("nothing matched: no new version of %s", location)
            return False
        log = DeltaLog.for_table(location)
        commit = next((c for c in log.commits_after(int(version) - 1, until=int(version))), None)
        tag = commit.commit_info.user_metadata if commit and commit.commit_info else None
        if not spec.run.tagged(tag):
            raise CommitNotConfirmedError(f"version {version} of {location} is not tagged with run {spec.run.app_id}")
        return True

    def _target(self) -> TableRef:
        return TableRef(path=self.table) if self.table is not None else TableRef(name=self.table_name)

    def _common(self, snapshot: Snapshot, run: RunIdentity) -> dict[str, Any]:
        policies = layer_overrides(configured_policies(), self._policy_overrides)
        return {"target": self._target(), "run": run, "idempotent": self.idempotent, "retry_policies": policies}


def configured_policies() -> dict[str, dict[str, Any]]:
    """The platform's defaults: ``[delta_occ] conflict_policies``, JSON in the operator's format.

    Raises:
        ProviderConfigError: the option is not JSON, or names an unknown conflict, action or field.
    """
    from airflow.sdk import conf

    text = conf.get("delta_occ", "conflict_policies", fallback="") or ""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("expected a JSON object keyed by exception name")
        return layer_overrides(value)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise ProviderConfigError(f"[delta_occ] conflict_policies: {exc}") from exc


def _source(source: str | None, source_table: str | None, source_query: str | None, source_format: str
            ) -> SourceRef:
    if source_query is not None:
        checked_sql_query(source_query)
    return SourceRef(path=source, table=source_table, query=source_query, format=source_format)


def checked_sql_query(query: str) -> None:
    # A query is a whole statement: only refuse statement separators and comments, which could smuggle
    # a second statement; Spark's parser rejects everything else with its own message.
    stripped = query.strip().rstrip()
    if ";" in stripped or "--" in stripped or "/*" in stripped:
        raise JobSpecError("source_query must be a single SELECT without ';' or comments")
    if not stripped.lower().startswith(("select", "with", "(")):
        raise JobSpecError("source_query must be a SELECT (or WITH ... SELECT) query")


class DeltaMergeOperator(DeltaBaseOperator):
    """MERGE a source into a Delta table.

    :param source: source path (``source_format`` default ``delta``), or ``source_table``, or ``source_query``.
    :param merge_condition: the ON condition, e.g. ``t.id = s.id``; the partition predicate is added.
    :param clauses: WHEN clauses as dicts (``{"kind": "matched_update", "set": {"v": "s.v"}}``); the default
        is an upsert: update all columns when matched, insert all when not.
    """

    template_fields: Sequence[str] = (*DeltaBaseOperator.template_fields, "source", "source_table", "source_query",
                                      "merge_condition", "clauses")
    operation = "merge"

    def __init__(self, *, merge_condition: str, source: str | None = None, source_table: str | None = None,
                 source_query: str | None = None, source_format: str = "delta",
                 clauses: Sequence[Mapping[str, Any]] | None = None, target_alias: str = "t",
                 source_alias: str = "s", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.merge_condition = merge_condition
        self.source, self.source_table, self.source_query = source, source_table, source_query
        self.source_format = source_format
        self.clauses = list(clauses or [{"kind": "matched_update_all"}, {"kind": "not_matched_insert_all"}])
        self.target_alias, self.source_alias = target_alias, source_alias

    def build_spec(self, snapshot: Snapshot, run: RunIdentity) -> JobSpec:
        on = checked_sql(self.merge_condition, "merge_condition")
        pfilter = self._partition_filter(snapshot)
        self._check_constrained(snapshot, pfilter, on, self.target_alias)
        clauses = []
        for i, c in enumerate(self.clauses):
            cond = checked_sql(c["condition"], f"clauses[{i}].condition") if c.get("condition") else None
            values = {str(k): checked_sql(str(v), f"clauses[{i}].set[{k}]") for k, v in (c.get("set") or {}).items()}
            clauses.append(MergeClause(kind=c["kind"], condition=cond, set=values))
        return JobSpec(operation="merge", **self._common(snapshot, run),
                       source=_source(self.source, self.source_table, self.source_query, self.source_format),
                       condition=conjoin(on, pfilter.to_sql(self.target_alias)),
                       partition_filter=pfilter.to_sql() or None, clauses=tuple(clauses),
                       target_alias=self.target_alias, source_alias=self.source_alias)


class DeltaUpdateOperator(DeltaBaseOperator):
    """UPDATE rows: ``set={"status": "'closed'"}`` (SQL expressions), optional ``where``."""

    template_fields: Sequence[str] = (*DeltaBaseOperator.template_fields, "where", "set")
    operation = "update"

    def __init__(self, *, set: Mapping[str, str], where: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.set, self.where = dict(set), where

    def build_spec(self, snapshot: Snapshot, run: RunIdentity) -> JobSpec:
        where = checked_sql(self.where, "where") if self.where else None
        pfilter = self._partition_filter(snapshot)
        self._check_constrained(snapshot, pfilter, where, None)
        for column in self.set:
            snapshot.bind(f"{column} IS NULL")  # UnknownColumnError for a wrong column
        values = {k: checked_sql(str(v), f"set[{k}]") for k, v in self.set.items()}
        condition = conjoin(where, pfilter.to_sql())
        return JobSpec(operation="update", **self._common(snapshot, run), condition=condition,
                       partition_filter=pfilter.to_sql() or None, set=values)


class DeltaDeleteOperator(DeltaBaseOperator):
    """DELETE rows matching ``where`` (and the partitions)."""

    template_fields: Sequence[str] = (*DeltaBaseOperator.template_fields, "where")
    operation = "delete"

    def __init__(self, *, where: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.where = where

    def build_spec(self, snapshot: Snapshot, run: RunIdentity) -> JobSpec:
        where = checked_sql(self.where, "where") if self.where else None
        pfilter = self._partition_filter(snapshot)
        self._check_constrained(snapshot, pfilter, where, None)
        condition = conjoin(where, pfilter.to_sql())
        if condition is None:
            raise JobSpecError("DeltaDeleteOperator needs where= or partitions= (deleting everything is refused)")
        return JobSpec(operation="delete", **self._common(snapshot, run), condition=condition,
                       partition_filter=pfilter.to_sql() or None)


class DeltaOptimizeOperator(DeltaBaseOperator):
    """OPTIMIZE (bin-packing compaction), optionally ``zorder_by=["id"]``, within ``partitions``."""

    template_fields: Sequence[str] = (*DeltaBaseOperator.template_fields, "zorder_by")
    operation = "optimize"

    def __init__(self, *, zorder_by: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.zorder_by = list(zorder_by)

    def build_spec(self, snapshot: Snapshot, run: RunIdentity) -> JobSpec:
        pfilter = self._partition_filter(snapshot)
        for column in self.zorder_by:
            snapshot.bind(f"{column} IS NULL")
            if column in snapshot.partition_columns:
                raise JobSpecError(f"zorder_by column {column!r} is a partition column")
        sql = pfilter.to_sql() or None
        return JobSpec(operation="optimize", **self._common(snapshot, run), condition=sql, partition_filter=sql,
                       zorder_by=tuple(self.zorder_by))


class DeltaAppendOperator(DeltaBaseOperator):
    """Blind append of a source; idempotent across retries of the same task run (txnAppId/txnVersion)."""

    template_fields: Sequence[str] = (*DeltaBaseOperator.template_fields, "source", "source_table", "source_query")
    operation = "append"

    def __init__(self, *, source: str | None = None, source_table: str | None = None,
                 source_query: str | None = None, source_format: str = "delta", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source, self.source_table, self.source_query = source, source_table, source_query
        self.source_format = source_format

    def build_spec(self, snapshot: Snapshot, run: RunIdentity) -> JobSpec:
        return JobSpec(operation="append", **self._common(snapshot, run),
                       source=_source(self.source, self.source_table, self.source_query, self.source_format))


class DeltaOverwritePartitionsOperator(DeltaAppendOperator):
    """Replace exactly the given ``partitions`` with the source's rows (Delta ``replaceWhere``)."""

    operation = "overwrite_partitions"

    def build_spec(self, snapshot: Snapshot, run: RunIdentity) -> JobSpec:
        pfilter = self._partition_filter(snapshot)
        if not pfilter:
            raise JobSpecError("DeltaOverwritePartitionsOperator needs partitions= (it must not replace everything)")
        sql = pfilter.to_sql()
        return JobSpec(operation="overwrite_partitions", **self._common(snapshot, run), condition=sql,
                       partition_filter=sql,
                       source=_source(self.source, self.source_table, self.source_query, self.source_format))
