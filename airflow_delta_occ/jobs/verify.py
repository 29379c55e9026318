"""What a job's commit actually changed, judged against what it was planned to change (pure, no Spark).

Everything before the commit (the parse, the injected partition predicate, the footprint, the lease)
is a claim about the statement; the commit's own actions in the Delta log are the fact. After Spark
reports success the operator reads them and fails the task when a file was removed or added in a
partition the job could not touch, so an escape from any cause (Spark rewriting the statement text,
a bug, a table changed under the job) is a loud failure, never a confirmed success.

A file may be touched only where both hold (each is judged on its partition values alone, and a
value the engine cannot judge counts as inside, so a correct job is never failed):

* ``partitions=`` (the spec's ``partition_filter``), when the job was given them;
* for a removed file, and for a file added by a job that only rewrites rows (UPDATE, DELETE,
  OPTIMIZE), the partition part of the job's condition (the footprint's ``read_predicate``); a job
  that reads nothing (an append) removes nothing.

One exception, measured on delta-spark 4.4: a MERGE with a WHEN NOT MATCHED BY SOURCE clause rewrites
every file of the table, copying the rows of other partitions unchanged, even when every clause
carries the partition predicate. Its changes outside ``partitions=`` are copies when each such
partition keeps its row count (the removed files' ``numRecords``, from the read snapshot, equal the
added files'); a partition that gains or loses rows is an escape. That a copied row keeps its values
cannot be read from the log; where the counts are unknown the files are not judged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from airflow_delta_occ.engine.actions import AddFile, Metadata, RemoveFile
from airflow_delta_occ.engine.conflicts import PartitionSchema
from airflow_delta_occ.engine.expressions import Expr
from airflow_delta_occ.engine.planner import Footprint
from airflow_delta_occ.engine.predicates import file_may_match
from airflow_delta_occ.engine.schema import StructType
from airflow_delta_occ.engine.snapshot import Commit, Snapshot
from airflow_delta_occ.engine.sql_parser import to_sql
from airflow_delta_occ.exceptions import CommitNotConfirmedError, CommitOutsidePartitionsError

from .footprint import ReadPlan
from .spec import JobSpec
from .sql import target_sql


@dataclass(frozen=True)
class Escape:
    """One file a commit touched outside the job's plan: ``removed`` or ``added``, in ``partition``
    (raw values by column, as the log holds them)."""

    change: str
    path: str
    partition: dict[str, str | None]


def escapes(spec: JobSpec, plan: ReadPlan | Footprint, snapshot: Snapshot, commit: Commit) -> tuple[Escape, ...]:
    """The files ``commit`` removed or added outside what ``spec`` planned on ``snapshot`` (none: it stayed in).

    ``plan`` is the job's ``ReadPlan`` (or its whole ``Footprint``): its read predicate and whole-table read.
    """
    schema = PartitionSchema.of(snapshot.metadata)
    if not schema:
        return ()  # an unpartitioned table has no partitions to leave
    confined = snapshot.bind(spec.partition_filter) if spec.partition_filter is not None else None
    planned = plan.read_predicate
    out = []
    known: dict[str, AddFile] | None = None  # the read snapshot's files, if a remove needs them
    copies: dict[tuple[tuple[str, str | None], ...], _Copies] = {}
    for action in commit.actions:
        if isinstance(action, RemoveFile):
            bounds = [confined, planned] if planned is not None else None
            change = "removed"
        elif isinstance(action, AddFile):
            bounds = [confined] if spec.operation.reads_source else [confined, planned]
            change = "added"
        else:
            continue
        if known is None and isinstance(action, RemoveFile):
            known = {f.path: f for f in snapshot.files()}
        original = known.get(action.path) if known is not None and isinstance(action, RemoveFile) else None
        if action.partition_values is None:  # optional in a remove: the file's own, as the snapshot holds it
            if original is None:
                continue  # a file the job did not read either; nothing to judge it by
            raw = dict(original.partition_values)
        else:
            raw = dict(action.partition_values)
        if bounds is not None and _inside(schema, raw, bounds):
            continue
        escape = Escape(change, action.path, schema.hint(raw))
        if not plan.read_whole_table or spec.operation != "merge":
            out.append(escape)
            continue
        # A NOT MATCHED BY SOURCE MERGE copies other partitions: count their rows in and out.
        records = _live_records(original) if isinstance(action, RemoveFile) else _live_records(action)
        # Keyed by every partition column: a remove may leave a NULL value out where its add lists it.
        copies.setdefault(tuple(sorted(escape.partition.items())), _Copies()).count(escape, records)
    for partition in copies.values():
        if partition.removed is not None and partition.added is not None and partition.removed != partition.added:
            out.extend(partition.changes)
    return tuple(out)


@dataclass
class _Copies:
    """The rows a NOT MATCHED BY SOURCE MERGE removed and added in one partition outside its plan
    (``None``: a file's count is unknown)."""

    removed: int | None = 0
    added: int | None = 0
    changes: list[Escape] = field(default_factory=list)

    def count(self, change: Escape, records: int | None) -> None:
        self.changes.append(change)
        if change.change == "removed":
            self.removed = None if records is None or self.removed is None else self.removed + records
        else:
            self.added = None if records is None or self.added is None else self.added + records


def _live_records(file: AddFile | None) -> int | None:
    """The rows a file holds: ``numRecords`` of its statistics less those its deletion vector deletes
    (``None`` when the log does not say)."""
    if file is None or not file.stats:
        return None
    try:
        value = json.loads(file.stats).get("numRecords")
    except (ValueError, AttributeError):
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    deleted = file.deletion_vector.cardinality if file.deletion_vector is not None else 0
    return value - deleted


def _inside(schema: PartitionSchema, raw: dict[str, str | None], bounds: list[Expr | None]) -> bool:
    typed = schema.typed(raw)
    if typed is None:
        return True  # a value the engine cannot read: not proof of an escape
    return all(bound is None or file_may_match(bound, typed, None) for bound in bounds)


@dataclass(frozen=True)
class ConfirmedCommit:
    """The job's commit, found in the log and judged: its version, Delta's name of it, and the schema
    the table had after it (``None`` when the commits read do not show it: an earlier try committed
    before the snapshot the job was prepared at)."""

    version: int
    operation: str | None = None
    schema: StructType | None = None


def run_commits(spec: JobSpec, commits: Sequence[Commit]) -> list[Commit]:
    """The commits of ``commits`` made in the name of ``spec``'s series of tries (its userMetadata tag)."""
    return [c for c in commits if spec.run.tagged(c.commit_info.user_metadata if c.commit_info else None)]


def confirm_commit(spec: JobSpec, plan: ReadPlan, snapshot: Snapshot, commits: Sequence[Commit],
                   version: int, location: str) -> ConfirmedCommit:
    """Judge the commits after ``snapshot`` (or after ``version - 1``, if earlier) for the run's commit
    ``version``: it must be there, tagged with this series of tries, and every commit in the run's name
    (the job's, and Delta's auto-compaction after it, which carries its userMetadata) must stay in the
    partitions it was planned for.

    Raises:
        CommitNotConfirmedError: no commit ``version`` tagged with the run.
        CommitOutsidePartitionsError: a commit of the run changed files outside its partitions.
    """
    ours = run_commits(spec, commits)
    if version not in {c.version for c in ours}:
        raise CommitNotConfirmedError(f"version {version} of {location} is not tagged with run {spec.run.app_id}")
    for commit in ours:
        outside = escapes(spec, plan, snapshot, commit)
        if outside:
            raise escaped_error(spec, plan, commit.version, outside)
    if version <= snapshot.version:
        return ConfirmedCommit(version)
    schema, operation = snapshot.schema, None
    for commit in commits:
        if commit.version > version:
            break
        for action in commit.actions:
            if isinstance(action, Metadata):
                schema = action.schema
        if commit.version == version and commit.commit_info is not None:
            operation = commit.commit_info.operation
    return ConfirmedCommit(version, operation, schema)


def escaped_error(spec: JobSpec, plan: ReadPlan, version: int, outside: Sequence[Escape]
                  ) -> CommitOutsidePartitionsError:
    """The data-safety error of a commit that touched files outside its plan: what, where, and how to undo it."""
    partitions = tuple(dict(p) for p in {tuple(e.partition.items()): e.partition for e in outside}.values())
    shown = "; ".join(", ".join(f"{k}={v}" for k, v in p.items()) for p in partitions[:10])
    changes = ", ".join(f"{sum(e.change == c for e in outside)} file(s) {c}" for c in ("removed", "added")
                        if any(e.change == c for e in outside))
    restore = f"RESTORE TABLE {target_sql(spec)} TO VERSION AS OF {version - 1}"
    planned = spec.partition_filter_sql or (to_sql(plan.read_predicate) if plan.read_predicate is not None
                                            else "nothing")
    message = (f"DATA SAFETY: version {version} of {spec.target.label}, committed by this task, changed files "
               f"outside the partitions it was planned for ({planned}): {changes} in partition(s) {shown}. The "
               f"task fails instead of reporting success. To undo the commit run `{restore}` (it also undoes any "
               f"commit after version {version}; check DESCRIBE HISTORY first).")
    return CommitOutsidePartitionsError(message, version=version, partitions=partitions, restore=restore)
