"""Early abort: while a job still runs, tell from the log alone that its commit is certain to fail.

Delta checks a transaction against the commits that won while it ran only when it commits, after all
its Spark work. A commit that lands early in a long job and that the job cannot survive is knowable
much sooner: the same rules (``conflicts.check_winning_commit``) judge it as soon as it is in the log.
The rules need what the job *records* (what it read) and what it *stages* (its actions); a running
job has recorded only part of that and staged nothing yet. So this module judges the smallest commit
the job is certain to make, and only says "doomed" when even that one fails:

* **What it reads.** The partition part of its filter, exactly as delta-spark records it (the top-level
  conjuncts over partition columns only, as the planner extracts them; ``TRUE`` for a whole-table read).
  Files count as read only where nothing but partition pruning decides which files Spark scans (every
  target conjunct is a partition conjunct, or the job reads the whole table), and only the files the
  predicate holds for with certainty; otherwise no file counts as read (data skipping may drop it).
* **What it stages.** One file action of its own kind (a data change, or a compaction's rearrangement),
  nothing else: no metadata, protocol, domain or application-id action, and no removed file, because
  the job may stage none of them. Every rule fails a larger commit whenever it fails this one (a
  metadata change fails on any winning metadata, a removal adds a delete-delete check, more read files
  add delete-read checks), so a failure of the smallest commit is a failure of the real one.
* **Whether it commits a file.** A DML statement that changed nothing commits no file: delta-spark skips
  its commit (measured on delta-spark 4.4: an UPDATE, DELETE or MERGE that matches no row leaves the log as
  it was), or, when the job writes with a transaction id (``txnAppId``, the provider's idempotent jobs),
  commits that id alone (measured: such an UPDATE matching no row committed a version without a file
  action). Neither is the smallest commit above. The caller says whether the job is certain to commit a
  file (``RunningCommit.commits``); without that certainty the answer is always "keep running".
* **A compaction forgives.** delta-spark's OPTIMIZE commits again after a conflict while every file it rewrites
  is still in the table (``OptimizeExecutor.commitAndRetry``), so a winning metadata change or append never
  fails it. Its certain reads are the files its bin packing is certain to rewrite (``compaction``), and it is
  doomed only once one of them is gone from the table (removed, or given a new deletion vector) by a winner
  that also fails its first attempt; Delta then raises that attempt's exception, which names the first winner
  that failed it. A file removed and put back in the same commit is still there. A later commit that puts back
  the very file (a RESTORE) would still let it commit; the verdict cannot wait for one, so early abort watches a
  compaction only when its task asks (``spark.early_abort``).
* **Which commits won.** Those after the version the job's transaction read. The caller must know that
  version exactly (``RunningCommit.read_version``): a commit that landed before the job's transaction
  read the log is in its snapshot, not a winner, and judging it would abort a job that commits.

A winning file whose partition values do not parse as the table's types is left out (the commit check
assumes it matches; this module must not). Anything the judge cannot decide exactly stays "keep running":
an abort must be as sure as Delta's own check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from .actions import Action, AddFile, FileKey
from .compaction import CompactionSettings, surely_compacted
from .conflicts import (
    DATA_CHANGING_OPERATIONS,
    PartitionSchema,
    PendingCommit,
    WinningCommit,
    check_winning_commit,
    isolation_to_use,
    table_isolation_level,
)
from .errors import ConflictKind, DeltaConcurrentModificationException
from .expressions import TRUE, Column, Expr, has_unknown, references, split_conjuncts, walk
from .planner import COMPACTIONS, DELTA_OPERATION_NAMES, Operation, TableState, adds_files, changes_data, planned_read
from .predicates import evaluate_partition
from .snapshot import Commit, Snapshot
from .sql_parser import parse_predicate

# Operations whose files read are chosen by their filter alone (``txn.filterFiles``); a compaction
# records only the files it picks, known when it commits.
_FILTER_READS = frozenset({Operation.MERGE, Operation.UPDATE, Operation.DELETE, Operation.INSERT_SELF_READ,
                           Operation.REPLACE_WHERE, Operation.OVERWRITE})


@dataclass(frozen=True)
class RunningCommit:
    """What a running job is certain to record and commit, as far as Delta's commit check looks.

    Build it with ``running_commit``. ``read_version`` and ``table`` are the snapshot its transaction
    read; ``certain_reads`` maps each file it surely reads to its raw partition values.
    """

    table: TableState
    operation: Operation
    label: str
    read_predicate: Expr | None
    read_whole_table: bool
    certain_reads: Mapping[str, Mapping[str, str | None]]
    commits: bool
    rewrites: frozenset[FileKey] = frozenset()   # a compaction's certain files: only their loss fails it
    uncertain: str = ""   # a compaction's: why no file is certain (for the task log)

    @property
    def read_version(self) -> int:
        return self.table.version


@dataclass(frozen=True)
class CertainConflict:
    """A winning commit the running job cannot survive: what Delta will raise when the job commits."""

    version: int
    operation: str | None
    exception: DeltaConcurrentModificationException

    @property
    def kind(self) -> ConflictKind:
        return self.exception.kind

    def describe(self) -> str:
        """One line for a task log or an audit event."""
        what = f"version {self.version}" + (f" ({self.operation})" if self.operation else "")
        return f"{what} makes this job's commit fail with {self.kind.value}: {self.exception}"


UNBACKFILLED_COMMIT_FEATURES = frozenset({"coordinatedCommits-preview", "catalogOwned-preview", "catalogManaged"})
"""Table features under which a commit is first ratified elsewhere (``_delta_log/_commits/``, a catalog) and
written to ``_delta_log/<version>.json`` only later (backfilled)."""


def commits_show_at_once(snapshot: Snapshot) -> bool:
    """Whether each commit of the table is ``_delta_log/<version>.json`` as soon as it is made. Not so on a table
    with coordinated or catalog-managed commits: a commit the job's transaction already read could still be
    missing there, so the watch could take a commit the job read for a winner; such a table is never judged."""
    protocol = snapshot.protocol
    features = (protocol.reader_features or frozenset()) | (protocol.writer_features or frozenset())
    return not features & UNBACKFILLED_COMMIT_FEATURES


def running_commit(snapshot: Snapshot, operation: Operation | str, predicate: str | Expr | None = None, *,
                   commits: bool, label: str | None = None, target_alias: str | None = None,
                   reads_whole_table: bool = False, compaction: CompactionSettings | None = None) -> RunningCommit:
    """The smallest commit a job running ``operation`` with ``predicate`` on ``snapshot`` is certain to make.

    ``snapshot`` must be the version the job's transaction read. ``commits`` says whether the job is
    certain to commit (see the module's docstring); ``predicate``, ``target_alias`` and
    ``reads_whole_table`` mean what they mean to ``planner.plan_footprint``. On a table whose commits do not
    show at once (``commits_show_at_once``) the job counts as not certain to commit: never doomed.

    A compaction (OPTIMIZE) reads, and commits, what its bin packing is certain of under ``compaction`` (the
    session's settings, ``compaction.surely_compacted``); without settings it counts as not certain to commit.
    """
    commits = commits and commits_show_at_once(snapshot)
    op = Operation(operation)
    read = planned_read(snapshot, op, predicate, target_alias=target_alias, reads_whole_table=reads_whole_table)
    if op in COMPACTIONS:
        plan = None
        if compaction is not None and op in (Operation.OPTIMIZE, Operation.OPTIMIZE_ZORDER):
            plan = surely_compacted(snapshot, read, compaction, zorder=op is Operation.OPTIMIZE_ZORDER)
        return RunningCommit(table=TableState.of(snapshot), operation=op, label=label or op.value,
                             read_predicate=read, read_whole_table=False,
                             certain_reads=MappingProxyType({f.path: f.partition_values for f in plan.files}
                                                            if plan is not None else {}),
                             commits=commits and plan is not None and plan.commits,
                             rewrites=plan.keys if plan is not None else frozenset(),
                             uncertain=plan.why_not if plan is not None else "no compaction settings")
    reads: dict[str, Mapping[str, str | None]] = {}
    if read is not None and op in _FILTER_READS:
        if reads_whole_table:
            reads = {f.path: f.partition_values for f in snapshot.files()}
        elif _pruned_by_partitions_alone(snapshot, predicate, target_alias, op):
            schema = PartitionSchema.of(snapshot.metadata)
            reads = {f.path: f.partition_values for f in snapshot.files()
                     if _surely_matches(read, schema, f.partition_values)}
    # A whole-table read is recorded as a read of every file (``filterFiles(TRUE)``), not as delta-spark's
    # ``readWholeTable`` (which would also fail on the removal of a file added after the read): a NOT MATCHED BY
    # SOURCE MERGE reads the predicate TRUE and the snapshot's files, nothing more.
    return RunningCommit(table=TableState.of(snapshot), operation=op, label=label or op.value, read_predicate=read,
                         read_whole_table=False, certain_reads=MappingProxyType(reads), commits=commits)


class CommitJudge:
    """Judges the commits that won against a running job one at a time, as they land (oldest first), keeping the
    job's smallest commit rebased over each that passed, as delta-spark does (its protocol and allowed metadata
    become the job's): a later winner is judged as Delta will judge it, and each winner is judged once, so a job
    beside a busy stream costs one check per commit."""

    def __init__(self, running: RunningCommit) -> None:
        self.running = running
        table = running.table
        self._schema = PartitionSchema.of(table.metadata)
        actions = _smallest_actions(running, self._schema)
        name = DELTA_OPERATION_NAMES[running.operation]
        self._level = isolation_to_use(actions, name in DATA_CHANGING_OPERATIONS,
                                       table_isolation_level(table.metadata))
        self._pending = PendingCommit(
            read_version=table.version, partition_schema=self._schema, read_protocol=table.protocol,
            metadata=table.metadata, protocol=table.protocol, actions=actions, operation=name,
            read_predicates=(running.read_predicate,) if running.read_predicate is not None else (),
            read_files=running.certain_reads, read_whole_table=running.read_whole_table,
        )
        self.found: CertainConflict | None = None
        self._first_failure: CertainConflict | None = None   # what fails a compaction's first attempt

    def judge(self, commit: Commit) -> CertainConflict | None:
        """The verdict once ``commit`` (the next winner) is in: the first certain conflict so far, or ``None``:
        keep running. After a conflict the verdict stands, whatever lands next."""
        if self.found is not None or not self.running.commits or commit.version <= self.running.read_version:
            return self.found
        whole = WinningCommit.of(commit)
        winner = replace(whole, added=tuple(a for a in whole.added
                                            if self._schema.typed(a.partition_values) is not None))
        if self.running.rewrites:
            return self._judge_compaction(commit.version, whole, winner)
        try:
            self._pending = check_winning_commit(self._pending, winner, self._level)
        except DeltaConcurrentModificationException as exc:
            self.found = CertainConflict(version=commit.version, operation=winner.operation, exception=exc)
        return self.found

    def _judge_compaction(self, version: int, whole: WinningCommit, winner: WinningCommit) -> CertainConflict | None:
        """A compaction's first commit attempt fails as any job's does; it is doomed once that attempt fails and a
        file it rewrites is no longer in the table (its retry then gives up, raising that attempt's exception: the
        first winner that failed it is the one named). A file removed and put back in the same commit (same path
        and deletion vector) is still in the table."""
        if self._first_failure is None:
            try:
                self._pending = check_winning_commit(self._pending, winner, self._level)
            except DeltaConcurrentModificationException as exc:
                self._first_failure = CertainConflict(version=version, operation=winner.operation, exception=exc)
        rewrites = self.running.rewrites
        gone = {r.key for r in whole.removed if r.key in rewrites} - {a.key for a in whole.added}
        if self._first_failure is not None and gone:
            self.found = self._first_failure
        return self.found


def certain_conflict(running: RunningCommit, winners: Iterable[Commit]) -> CertainConflict | None:
    """The first of ``winners`` (commits after ``running.read_version``, oldest first) that makes the job's
    commit certain to fail, or ``None``: keep running (``CommitJudge`` over them all)."""
    judge = CommitJudge(running)
    for commit in winners:
        if (found := judge.judge(commit)) is not None:
            return found
    return None


def _smallest_actions(running: RunningCommit, schema: PartitionSchema) -> tuple[Action, ...]:
    """One file of the job's kind: it sets the isolation level the job's commit is checked at, and makes
    the commit no blind append when the job reads (an append that reads nothing stays blind)."""
    if not adds_files(running.operation):
        return ()
    return (AddFile(path="<a file of the running job>", partition_values={n: None for _, n, _ in schema.fields},
                    size=0, modification_time=0, data_change=changes_data(running.operation)),)


def _pruned_by_partitions_alone(snapshot: Snapshot, predicate: str | Expr | None, target_alias: str | None,
                                op: Operation) -> bool:
    """Whether Spark's scan for this filter keeps every file of the partitions it selects: every conjunct
    that data skipping could use is over partition columns only. A MERGE skips on its target-only
    conjuncts, so a conjunct that names the source (``t.id = s.id``) is no skipping filter there."""
    if predicate is None:
        return True
    raw = parse_predicate(predicate) if isinstance(predicate, str) else predicate
    columns = set(snapshot.partition_columns)
    for conjunct in split_conjuncts(raw):
        bound = snapshot.bind(conjunct, target_alias=target_alias)
        if not has_unknown(bound) and references(bound) <= columns:
            continue
        if op is Operation.MERGE and target_alias is not None and _names_another_relation(conjunct, target_alias):
            continue
        return False
    return True


def _names_another_relation(conjunct: Expr, target_alias: str) -> bool:
    alias = target_alias.lower()
    return any(isinstance(e, Column) and e.qualifier is not None and e.qualifier.lower() != alias
               for e in walk(conjunct))


def _surely_matches(predicate: Expr, schema: PartitionSchema, raw: Mapping[str, str | None]) -> bool:
    if predicate == TRUE:
        return True
    typed = schema.typed(raw)
    return typed is not None and evaluate_partition(predicate, typed) is True


__all__ = ["CertainConflict", "CommitJudge", "RunningCommit", "certain_conflict", "commits_show_at_once",
           "running_commit"]
