"""Author arguments -> ``JobSpec``: one pure function per operation, with the table's snapshot.

The operators check what needs no table when the DAG file is parsed; at run time they hand their
rendered arguments here as typed values and get back the job that will run. Everything that needs
the table's schema happens here, before any lease or Spark: partition values typed by the schema
and injected into the job's condition (and every NOT MATCHED BY SOURCE clause), the columns a job
names checked against the table, rows that would move between partitions refused, and the check
that every source row writes inside the partitions. No Airflow and no Spark: a spec is a pure
function of (arguments, snapshot, run), so a unit test needs only a Delta log written by hand.

Every refusal is a ``JobSpecError`` (``MissingPartitionConstraintError`` under
``strict_partitions``); a job that confines no partition where it could is reported to ``warn``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_delta_occ.engine.constraints import confining_conjuncts
from airflow_delta_occ.engine.expressions import Column, is_deterministic
from airflow_delta_occ.engine.sql_parser import MAX_RENDERED_LENGTH, parse_predicate, to_sql
from airflow_delta_occ.exceptions import JobSpecError, MissingPartitionConstraintError

from .checks import (
    check_clauses,
    check_one_source,
    column_name,
    is_partition_column,
    refuse_moving_rows,
    typed_operands,
)
from .operations import ClauseKind, JobOperation
from .partitions import (
    PartitionFilter,
    build_partition_filter,
    canonical_tree,
    conjoin,
    conjoin_exprs,
    parse_expression,
)
from .spec import JobSpec, MergeClause, RunIdentity, SourceRef, TableRef

if TYPE_CHECKING:  # reading a table loads pyarrow; building a spec from a snapshot does not
    from airflow_delta_occ.engine.expressions import Expr
    from airflow_delta_occ.engine.snapshot import Snapshot

#: What ``source_outside_partitions=`` may say.
SOURCE_OUTSIDE_ACTIONS = ("fail", "drop")

Warn = Callable[[str], object]


@dataclass(frozen=True)
class TargetArguments:
    """What every operation says of its target: the table, the partitions it is confined to, and how
    it runs. ``retry_policies`` are the layered overrides (platform, then task) the job retries by."""

    table: TableRef
    partitions: Mapping[str, Any] | str | None = None
    strict_partitions: bool = False
    source_outside: str = "fail"
    idempotent: bool = True
    retry_policies: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceArguments:
    """Where a job reads its rows, as the operator's three exclusive arguments say (checked when the
    spec is built, after the target's own checks, as the operators always did)."""

    path: str | None = None
    table: str | None = None
    query: str | None = None
    format: str = "delta"

    def ref(self) -> SourceRef:
        """Raises ``JobSpecError``: not exactly one of them, or a query that is not a query."""
        check_one_source("the job", self.path, self.table, self.query)
        return SourceRef(path=self.path, table=self.table, query=self.query, format=self.format)


@dataclass(frozen=True)
class MergeArguments:
    merge_condition: str
    source: SourceArguments
    clauses: Sequence[Mapping[str, Any]]
    target_alias: str = "t"
    source_alias: str = "s"


@dataclass(frozen=True)
class UpdateArguments:
    set: Mapping[str, Any]
    where: str | None = None


@dataclass(frozen=True)
class DeleteArguments:
    where: str | None = None


@dataclass(frozen=True)
class OptimizeArguments:
    zorder_by: Sequence[str] = ()


@dataclass(frozen=True)
class AppendArguments:
    source: SourceArguments


@dataclass(frozen=True)
class OverwritePartitionsArguments:
    source: SourceArguments


OperationArguments = (MergeArguments | UpdateArguments | DeleteArguments | OptimizeArguments | AppendArguments
                      | OverwritePartitionsArguments)


def build_spec(target: TargetArguments, arguments: OperationArguments, snapshot: Snapshot, run: RunIdentity,
               *, warn: Warn) -> JobSpec:
    """The job ``arguments`` describe on ``target`` at ``snapshot``, for the task run ``run``.

    Raises:
        JobSpecError: the job cannot be built on this table (the message names the argument).
        MissingPartitionConstraintError: ``strict_partitions`` and the job is not confined.
    """
    builder = _BUILDERS[type(arguments)]
    return builder(_Build(target, snapshot, run, warn), arguments)


@dataclass(frozen=True)
class _Build:
    """One build: the target, the table it is built against and where warnings go."""

    target: TargetArguments
    snapshot: Snapshot
    run: RunIdentity
    warn: Warn

    def partition_filter(self) -> PartitionFilter:
        return build_partition_filter(self.snapshot.schema, self.snapshot.partition_columns, self.target.partitions)

    def common(self, pfilter: PartitionFilter) -> dict[str, Any]:
        target = self.target
        return {"target": target.table, "run": self.run, "planned_version": self.snapshot.version,
                "idempotent": target.idempotent,
                "retry_policies": target.retry_policies, "source_outside": target.source_outside,
                "partition_filter": pfilter.to_expr(), "partitions": pfilter.serialized()}

    def check_constrained(self, operation: JobOperation, condition: Expr | None, alias: str | None) -> None:
        """Warn, or refuse under ``strict_partitions``, when the final condition confines no partition."""
        snapshot = self.snapshot
        if not snapshot.partition_columns:
            return
        if condition is not None:
            expr = snapshot.bind(condition, target_alias=alias)
            types = {c: f.type for c in snapshot.partition_columns if (f := snapshot.schema.find(c)) is not None}
            if confining_conjuncts(expr, types):
                return
        message = (f"{operation.upper()} on {self.target.table.label} is not confined to partitions "
                   f"({', '.join(snapshot.partition_columns)}): Delta will treat it as reading every partition, "
                   "so any concurrent write to this table makes it fail with ConcurrentAppendException. "
                   "Pass partitions={...} to confine it.")
        if self.target.strict_partitions:
            raise MissingPartitionConstraintError(message)
        self.warn(message)



def _merge(build: _Build, args: MergeArguments) -> JobSpec:
    snapshot, strict = build.snapshot, build.target.strict_partitions
    on = parse_expression(args.merge_condition, "merge_condition")
    pfilter = build.partition_filter()
    confined = pfilter.to_expr(args.target_alias)
    condition = conjoin_exprs(on, confined)
    build.check_constrained(JobOperation.MERGE, condition, args.target_alias)
    clauses = []
    writes: list[dict[str, Expr]] = []
    for i, c in enumerate(check_clauses(args.clauses)):
        kind = ClauseKind(c["kind"])
        tree = parse_expression(c["condition"], f"clauses[{i}].condition") if c.get("condition") else None
        if kind.by_source:  # rows of other partitions are "not matched by source" too
            tree = conjoin_exprs(confined, tree)
        values: dict[str, Expr] = {}
        for key, value in (c.get("set") or {}).items():
            name = column_name(snapshot, key, f"clauses[{i}].set")
            if name in values:
                raise JobSpecError(f"clauses[{i}].set names {name!r} twice")
            expr = parse_expression(str(value), f"clauses[{i}].set[{key}]")
            if pfilter and kind is not ClauseKind.NOT_MATCHED_INSERT:
                refuse_moving_rows(snapshot, name, f"clauses[{i}] ({kind})")
            if pfilter and kind is ClauseKind.NOT_MATCHED_INSERT and is_partition_column(snapshot, name) \
                    and not is_deterministic(expr):
                raise JobSpecError(f"clauses[{i}].set[{key}] writes partition column {name!r} with a "
                                   "non-deterministic expression: the rows it inserts cannot be checked "
                                   "against partitions= before they are written")
            values[name] = expr
        if kind.copies_source_row:
            writes.append({c: Column(c, args.source_alias) for c in pfilter.columns})
        elif kind is ClauseKind.NOT_MATCHED_INSERT and pfilter:
            missing = [c for c in pfilter.columns if c not in values]
            if missing:
                raise JobSpecError(f"clauses[{i}] (not_matched_insert) does not set partition column(s) "
                                   f"{', '.join(missing)}: its rows would land outside the partitions")
            writes.append({c: values[c] for c in pfilter.columns})
        clauses.append(MergeClause(kind=kind, condition=tree, set=values))
    if not pfilter and any(c.kind.by_source for c in clauses):
        message = ("a MERGE with NOT MATCHED BY SOURCE clauses and no partitions= applies them to every row of "
                   "the table that the source does not match, in every partition")
        if strict:
            raise MissingPartitionConstraintError(message + "; pass partitions= to confine it")
        build.warn(message)
    if strict and not pfilter:
        raise MissingPartitionConstraintError(
            "strict_partitions needs partitions= on a MERGE: only then are its NOT MATCHED BY SOURCE clauses and "
            "its source rows confined too, not just its ON condition")
    return JobSpec(operation=JobOperation.MERGE, **build.common(pfilter), source=args.source.ref(), condition=condition,
                   clauses=tuple(clauses), target_alias=args.target_alias, source_alias=args.source_alias,
                   **source_check(pfilter, writes))


def _update(build: _Build, args: UpdateArguments) -> JobSpec:
    where = parse_expression(args.where, "where") if args.where else None
    pfilter = build.partition_filter()
    condition = conjoin_exprs(where, pfilter.to_expr())
    build.check_constrained(JobOperation.UPDATE, condition, None)
    values: dict[str, Expr] = {}
    for key, value in args.set.items():
        name = column_name(build.snapshot, key, "set")
        if name in values:
            raise JobSpecError(f"set names {name!r} twice")
        if pfilter:
            refuse_moving_rows(build.snapshot, name, "the UPDATE")
        values[name] = parse_expression(str(value), f"set[{key}]")
    return JobSpec(operation=JobOperation.UPDATE, **build.common(pfilter), condition=condition, set=values)


def _delete(build: _Build, args: DeleteArguments) -> JobSpec:
    where = parse_expression(args.where, "where") if args.where else None
    pfilter = build.partition_filter()
    condition = conjoin_exprs(where, pfilter.to_expr())
    if condition is None:
        raise JobSpecError("DeltaDeleteOperator needs where= or partitions= (deleting everything is refused)")
    build.check_constrained(JobOperation.DELETE, condition, None)
    return JobSpec(operation=JobOperation.DELETE, **build.common(pfilter), condition=condition)


def _optimize(build: _Build, args: OptimizeArguments) -> JobSpec:
    pfilter = build.partition_filter()
    columns: list[str] = []
    for column in args.zorder_by:
        name = column_name(build.snapshot, column, "zorder_by")
        if is_partition_column(build.snapshot, name):
            raise JobSpecError(f"zorder_by column {column!r} is a partition column; Z-ordering applies within "
                               "a partition")
        if name in columns:
            raise JobSpecError(f"zorder_by names {name!r} twice")
        columns.append(name)
    condition = pfilter.to_expr()
    build.check_constrained(JobOperation.OPTIMIZE, condition, None)
    return JobSpec(operation=JobOperation.OPTIMIZE, **build.common(pfilter), condition=condition,
                   zorder_by=tuple(columns))


def _append(build: _Build, args: AppendArguments) -> JobSpec:
    pfilter = build.partition_filter()
    if build.target.strict_partitions and build.snapshot.partition_columns and not pfilter:
        raise MissingPartitionConstraintError(
            f"strict_partitions needs partitions= on an append to {build.target.table.label}: only then are "
            "its rows checked to land in the partitions it names")
    return JobSpec(operation=JobOperation.APPEND, **build.common(pfilter), source=args.source.ref(),
                   **source_check(pfilter, [{c: Column(c, "s") for c in pfilter.columns}]))


def _overwrite_partitions(build: _Build, args: OverwritePartitionsArguments) -> JobSpec:
    pfilter = build.partition_filter()
    if not pfilter:
        raise JobSpecError("DeltaOverwritePartitionsOperator needs partitions= (it must not replace everything)")
    return JobSpec(operation=JobOperation.OVERWRITE_PARTITIONS, **build.common(pfilter), condition=pfilter.to_expr(),
                   **source_check(pfilter, [{c: Column(c, "s") for c in pfilter.columns}]), source=args.source.ref())


def source_check(pfilter: PartitionFilter, writes: Sequence[Mapping[str, Expr]]) -> dict[str, Any]:
    """The check that every source row writes inside the partitions: each way the job writes a row's
    partition values (``writes``: column -> the value written, under the source's alias) must pass
    the partition filter, cast as Delta casts it when writing. ``source_values`` are the first way's
    values (shown for offending rows). None without partitions, or when no source row is written.
    """
    if not pfilter or not writes:
        return {}
    checks = []
    for write in writes:
        operands = {c: to_sql(value) if isinstance(value, Column) else f"({to_sql(value)})"
                    for c, value in write.items()}
        checks.append(pfilter.over(typed_operands(operands, pfilter), operands))
    # TRY_CAST is outside the expression model: the check is parsed once here, from provider-made text.
    text = conjoin(*dict.fromkeys(checks)) or ""
    check = canonical_tree(parse_predicate(text, max_length=MAX_RENDERED_LENGTH), "the source check")
    return {"source_check": check, "source_values": dict(writes[0])}


_BUILDERS: Mapping[type, Callable[[_Build, Any], JobSpec]] = {
    MergeArguments: _merge, UpdateArguments: _update, DeleteArguments: _delete, OptimizeArguments: _optimize,
    AppendArguments: _append, OverwritePartitionsArguments: _overwrite_partitions,
}
