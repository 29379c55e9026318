"""A job's footprint, planned from its ``JobSpec`` and the table's snapshot alone (pure, no Spark).

The conflict pools compare footprints before jobs run; the operator plans one in ``prepare``. What
each operation reads and writes, as the planner needs it:

* MERGE reads what its ON condition confines and writes inside ``partitions=`` (the runner
  refuses source rows outside them, and rows never move partitions); with a NOT MATCHED BY SOURCE
  clause it reads the whole table, as delta-spark's ``findTouchedFiles`` does, and rewrites every
  file of it, copying the other partitions' rows (measured on delta-spark 4.4; see ``plan_footprint``);
* UPDATE and DELETE read and rewrite what their condition selects;
* OPTIMIZE compacts the partitions its filter selects (Z-ordered or not);
* an append writes only inside ``partitions=`` when given (enforced by the runner), else anywhere;
* an overwrite of partitions is Delta's ``replaceWhere`` of exactly those partitions.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from airflow_delta_occ.engine.compaction import CompactionSettings
from airflow_delta_occ.engine.early_abort import RunningCommit, running_commit
from airflow_delta_occ.engine.expressions import Expr, has_unknown
from airflow_delta_occ.engine.planner import Footprint, Operation, plan_footprint, planned_read
from airflow_delta_occ.engine.snapshot import Snapshot
from airflow_delta_occ.engine.values import parse_partition_value

from .operations import ClauseScope, JobOperation
from .spec import JobSpec

MAX_WRITE_PARTITIONS = 4096


def engine_operation(spec: JobSpec) -> Operation:
    """The planner's operation kind for a job (Z-ordering is its own kind)."""
    if spec.operation == "optimize" and spec.zorder_by:
        return Operation.OPTIMIZE_ZORDER
    return Operation(spec.operation.engine_name)


def write_partitions(spec: JobSpec, snapshot: Snapshot) -> list[dict[str, Any]] | None:
    """Every partition the job may add files to, when ``partitions=`` pins each partition column.

    ``None`` means "anywhere": a column left open, or more combinations than is useful to list.
    """
    return partition_combinations(snapshot, spec.partitions)


def partition_combinations(snapshot: Snapshot, partitions: Mapping[str, tuple[str | None, ...]] | None
                           ) -> list[dict[str, Any]] | None:
    """Every partition ``partitions`` (column -> raw values, as ``PartitionFilter.serialized()``) names,
    typed; ``None`` when a partition column is left open or there are more than MAX_WRITE_PARTITIONS."""
    if not snapshot.partition_columns or not partitions:
        return None
    by_lower = {name.lower(): values for name, values in partitions.items()}
    options = [_typed(snapshot, column, by_lower.get(column.lower())) for column in snapshot.partition_columns]
    if any(values is None for values in options):
        return None
    combos = 1
    for values in options:
        combos *= len(values or ())
    if combos > MAX_WRITE_PARTITIONS:
        return None
    return [dict(zip(snapshot.partition_columns, combo, strict=True))
            for combo in itertools.product(*(values or () for values in options))]


def _typed(snapshot: Snapshot, column: str, raw: tuple[str | None, ...] | None) -> list[Any] | None:
    field = snapshot.schema.find(column)
    if raw is None or field is None:
        return None
    return [parse_partition_value(value, field.type) for value in raw]


def footprint_of(spec: JobSpec, snapshot: Snapshot) -> Footprint:
    """What ``spec`` reads and writes on ``snapshot``, for the planner's conflict verdicts."""
    op = engine_operation(spec)
    writes = write_partitions(spec, snapshot) if op in (Operation.MERGE, Operation.INSERT) else None
    return plan_footprint(
        snapshot, op, _predicate(spec, op), label=f"{spec.operation} {spec.run.task_id}",
        write_partitions=writes, app_id=spec.run.app_id if spec.idempotent else None,
        target_alias=_alias(spec, op), reads_whole_table=_reads_whole_table(spec, op),
    )


@dataclass(frozen=True)
class ReadPlan:
    """What a commit check needs of a job's plan (``Footprint``'s fields of the same names), planned
    without listing the table's files: the partition part of what it reads, and whether it reads all."""

    read_predicate: Expr | None
    read_whole_table: bool


def read_plan_of(spec: JobSpec, snapshot: Snapshot) -> ReadPlan:
    """``footprint_of(spec, snapshot)``'s read predicate and whole-table read, without its file listing.

    Raises:
        PredicateError: the condition does not bind to the table (as ``footprint_of`` would).
    """
    op = engine_operation(spec)
    whole = _reads_whole_table(spec, op)
    return ReadPlan(planned_read(snapshot, op, _predicate(spec, op), target_alias=_alias(spec, op),
                                 reads_whole_table=whole), whole)


def _predicate(spec: JobSpec, op: Operation) -> Expr | None:
    return spec.condition if op is not Operation.INSERT else None


def _alias(spec: JobSpec, op: Operation) -> str | None:
    return spec.target_alias if op is Operation.MERGE else None


def _reads_whole_table(spec: JobSpec, op: Operation) -> bool:
    # A NOT MATCHED BY SOURCE MERGE reads (and rewrites) every file, whatever its condition confines.
    return op is Operation.MERGE and any(c.kind.by_source for c in spec.clauses)


def running_commit_of(spec: JobSpec, snapshot: Snapshot, *, commits: bool,
                      compaction: CompactionSettings | None = None) -> RunningCommit:
    """The smallest commit ``spec`` is certain to make when its transaction read ``snapshot`` (early abort's
    judge; ``commits`` as ``commit_certainty`` says; an OPTIMIZE's from its session's ``compaction`` settings)."""
    op = engine_operation(spec)
    return running_commit(snapshot, op, _predicate(spec, op), commits=commits,
                          label=f"{spec.operation} {spec.run.task_id}", target_alias=_alias(spec, op),
                          reads_whole_table=_reads_whole_table(spec, op), compaction=compaction)


class CommitCertainty(Enum):
    """Whether a job is known to commit before its statement runs (early abort judges only jobs that are)."""

    CERTAIN = "certain"
    IF_A_ROW_MATCHES = "if a row of the target meets its condition at the version its transaction reads"
    IF_IT_SURELY_REWRITES = "if its bin packing surely rewrites files holding a row at the version it reads"
    UNKNOWN = "unknown"


def commit_certainty(spec: JobSpec, source_has_rows: bool | None) -> CommitCertainty:
    """Whether the job is certain to commit a file action of its kind (``RunningCommit.commits``), from its spec
    and whether its source holds a row (``None``: not asked).

    A statement that changed nothing commits no file (delta-spark skips its commit, or commits only the job's
    transaction id), and an empty write may change nothing, so only these are certain: an append or an
    overwrite of partitions with rows to write; a MERGE with rows whose clauses leave no row idle (an
    unconditional WHEN MATCHED clause and an unconditional WHEN NOT MATCHED INSERT: every source row updates,
    deletes or inserts).

    An UPDATE or a DELETE commits a file exactly when a row of the snapshot its transaction reads meets its
    condition (it then rewrites that row's file, or marks the row deleted): certain ``IF_A_ROW_MATCHES`` one at that
    version, which the caller asks Spark (``jobs.sql.matching_row_sql``). Only for a condition the engine
    understands in every part (columns, literals, comparisons, ``IN``, ``IS NULL``, ``AND``, ``OR``, ``NOT``):
    such a condition is deterministic, so a row that meets it in one query meets it in the statement, where a
    function call (even one Spark calls deterministic, or a catalog function) could answer differently.

    A compaction may find nothing to rewrite: certain ``IF_IT_SURELY_REWRITES`` files holding a row at the version
    it reads, which the log tells with the session's settings (``engine.compaction.surely_compacted``). (A re-run
    of a task run whose earlier try committed writes nothing either: the watch checks the log for that,
    ``spark.early_abort``.)
    """
    rows = source_has_rows is True
    if spec.operation in (JobOperation.APPEND, JobOperation.OVERWRITE_PARTITIONS):
        return CommitCertainty.CERTAIN if rows else CommitCertainty.UNKNOWN
    if spec.operation is JobOperation.MERGE:
        unconditional = {c.kind.scope for c in spec.clauses if c.condition is None and not c.kind.by_source}
        if rows and {ClauseScope.MATCHED, ClauseScope.NOT_MATCHED} <= unconditional:
            return CommitCertainty.CERTAIN
        return CommitCertainty.UNKNOWN
    if spec.operation in (JobOperation.UPDATE, JobOperation.DELETE) \
            and (spec.condition is None or not has_unknown(spec.condition)):
        return CommitCertainty.IF_A_ROW_MATCHES
    if spec.operation is JobOperation.OPTIMIZE:
        return CommitCertainty.IF_IT_SURELY_REWRITES
    return CommitCertainty.UNKNOWN


def asks_for_source_rows(spec: JobSpec) -> bool:
    """Whether the job's commit certainty depends on its source holding a row (worth one ``LIMIT 1`` query)."""
    return commit_certainty(spec, True) is CommitCertainty.CERTAIN
