"""Optimistic transactions on a Delta table: record reads, stage actions, commit with put-if-absent.

A ``Transaction`` keeps the same books delta-spark's ``OptimisticTransaction`` keeps (read
predicates, files read, whole-table reads, application ids looked up), because those books, not
the data, decide whether a concurrent winner conflicts. ``commit()`` writes the next version with
put-if-absent; when another writer won, it checks every winning commit in order
(``conflicts.check_winning_commit``), rebases and retries, never rewriting data, or raises the
typed exception delta-spark would raise.

The engine writes only what it can write correctly: tables whose writer features would require
more than the log (row IDs, in-commit timestamps, constraints and generated columns it cannot
check on data it never sees) are refused with ``UnsupportedProtocolError`` before anything is
written.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

from .actions import (
    Action,
    AddFile,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from .conflicts import (
    DATA_CHANGING_OPERATIONS,
    IsolationLevel,
    PartitionSchema,
    PendingCommit,
    WinningCommit,
    check_winning_commit,
    isolation_to_use,
    table_isolation_level,
)
from .errors import (
    CommitRetriesExceededError,
    FileAlreadyExistsError,
    InvalidCommitError,
    TableNotFoundError,
    UnsupportedProtocolError,
)
from .expressions import TRUE, Expr, and_, is_partition_only, partition_conjuncts
from .log_segment import LOG_DIR, commit_file_name
from .log_writer import encode_commit
from .snapshot import DeltaLog, Snapshot

DEFAULT_MAX_ATTEMPTS = 100

# Writer features whose rules this engine follows (or which put no duty on a writer of log actions).
_HARMLESS_WRITER_FEATURES = frozenset({
    "appendOnly", "deletionVectors", "timestampNtz", "domainMetadata", "v2Checkpoint", "vacuumProtocolCheck",
    "typeWidening", "typeWidening-preview", "clustering", "variantType", "variantType-preview",
    "checkpointProtection", "allowColumnDefaults",
})
# Writer features that only matter when the table uses them: refused then, accepted otherwise.
_CONDITIONAL_WRITER_FEATURES = frozenset({
    "invariants", "checkConstraints", "generatedColumns", "identityColumns", "changeDataFeed", "columnMapping",
    "rowTracking", "inCommitTimestamp",
})


def _engine_info() -> str:
    try:
        return f"airflow-delta-occ/{package_version('airflow-delta-occ')}"
    except PackageNotFoundError:
        return "airflow-delta-occ"


@dataclass(frozen=True)
class CommitResult:
    """What a commit did: the version it landed at and how much contention it met on the way."""

    version: int
    read_version: int
    attempts: int
    isolation_level: IsolationLevel
    is_blind_append: bool
    winners_checked: tuple[int, ...] = ()
    commit_info: Mapping[str, Any] = field(default_factory=dict)


class Transaction:
    """One optimistic transaction on a table (or on an empty path, to create a table).

    Example::

        txn = Transaction.start("/data/sales", operation="DELETE")
        doomed = txn.read_files("date = DATE'2024-01-01' AND amount < 0")
        txn.remove_files(doomed)
        txn.add_files(rewritten)
        result = txn.commit()
    """

    def __init__(
        self,
        log: DeltaLog,
        snapshot: Snapshot | None,
        *,
        operation: str = "WRITE",
        operation_parameters: Mapping[str, Any] | None = None,
        isolation_level: IsolationLevel | str | None = None,
        changes_data: bool | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.log = log
        self.snapshot = snapshot
        self.operation = operation
        self.operation_parameters = dict(operation_parameters or {})
        self._level_override = IsolationLevel.parse(isolation_level) if isinstance(isolation_level, str) \
            else isolation_level
        self.changes_data = operation in DATA_CHANGING_OPERATIONS if changes_data is None else changes_data
        self.max_attempts = max_attempts
        self._read_predicates: list[Expr] = []
        self._read_files: dict[str, Mapping[str, str | None]] = {}
        self._read_whole_table = False
        self._read_app_ids: set[str] = set()
        self._actions: list[Action] = []
        self._committed = False

    @classmethod
    def start(cls, table: str | DeltaLog, **options: Any) -> Transaction:
        """A transaction on the newest snapshot, or on an empty path (the commit creates the table)."""
        log = table if isinstance(table, DeltaLog) else DeltaLog.for_table(table)
        try:
            snapshot: Snapshot | None = log.snapshot()
        except TableNotFoundError:
            snapshot = None
        return cls(log, snapshot, **options)

    # -- what the transaction read ----------------------------------------------------------------
    @property
    def read_version(self) -> int:
        return self.snapshot.version if self.snapshot is not None else -1

    def read_files(self, predicate: str | Expr | None = None, *, target_alias: str | None = None) -> list[AddFile]:
        """The files a scan with ``predicate`` reads, recorded as read (``None``: a full scan).

        Like delta-spark, the partition-only conjuncts become the read predicate the append check
        uses; data conjuncts only narrow the files recorded for the delete checks.
        """
        if self.snapshot is None:
            self._read_predicates.append(TRUE)
            return []
        if predicate is None:
            files = self.snapshot.files()
            self._read_predicates.append(TRUE)
        else:
            expr = self.snapshot.bind(predicate, target_alias=target_alias)
            self._read_predicates.append(and_(*partition_conjuncts(expr, self.snapshot.partition_columns)))
            files = self.snapshot.files_matching(expr)
        for f in files:
            self._read_files[f.path] = f.partition_values
        return files

    def read_whole_table(self) -> None:
        """Depend on the entire table: any winner that adds or removes a file conflicts."""
        self._read_whole_table = True
        self._read_predicates.append(TRUE)

    def track_read(self, files: Iterable[AddFile], partition_predicate: str | Expr | None = None) -> None:
        """Record files read outside ``read_files`` (OPTIMIZE records exactly the files it rewrites)."""
        for f in files:
            self._read_files[f.path] = f.partition_values
        if partition_predicate is not None:
            expr = self.snapshot.bind(partition_predicate) if self.snapshot is not None else TRUE
            if not is_partition_only(expr, set(self.snapshot.partition_columns if self.snapshot else ())):
                raise InvalidCommitError(f"track_read needs a partition-only predicate, got {partition_predicate!r}")
            self._read_predicates.append(expr)

    def txn_version(self, app_id: str) -> int | None:
        """The last version an application committed; the transaction now depends on that id."""
        self._read_app_ids.add(app_id)
        return self.snapshot.app_transaction_version(app_id) if self.snapshot is not None else None

    # -- what the transaction writes --------------------------------------------------------------
    def add_files(self, files: Iterable[AddFile]) -> None:
        self._stage(*files)

    def remove_files(self, files: Iterable[AddFile | RemoveFile], *, data_change: bool = True) -> None:
        """Stage removes; ``AddFile`` entries become removes of that logical file (path and DV)."""
        now = int(time.time() * 1000)
        for f in files:
            if isinstance(f, AddFile):
                f = RemoveFile(path=f.path, data_change=data_change, deletion_timestamp=now,
                               partition_values=f.partition_values, size=f.size, deletion_vector=f.deletion_vector,
                               extended_file_metadata=True)
            self._stage(f)

    def update_metadata(self, metadata: Metadata) -> None:
        self._stage(metadata)

    def set_table_properties(self, properties: Mapping[str, str]) -> None:
        """Stage a metadata change that sets table properties (``ALTER TABLE ... SET TBLPROPERTIES``)."""
        current = self._staged_metadata() or (self.snapshot.metadata if self.snapshot is not None else None)
        if current is None:
            raise InvalidCommitError("the table does not exist yet: stage its metadata first")
        self._actions = [a for a in self._actions if not isinstance(a, Metadata)]
        self._stage(replace(current, configuration={**current.configuration, **properties}))

    def update_protocol(self, protocol: Protocol) -> None:
        self._stage(protocol)

    def set_transaction(self, app_id: str, version: int) -> None:
        """Stage an idempotency marker: readers can later ask ``txn_version(app_id)``."""
        self._stage(SetTransaction(app_id, version, int(time.time() * 1000)))

    def set_domain_metadata(self, domain: str, configuration: str, *, removed: bool = False) -> None:
        self._stage(DomainMetadata(domain, configuration, removed))

    def stage(self, *actions: Action) -> None:
        """Stage raw actions (the typed helpers above cover the usual cases)."""
        self._stage(*actions)

    def _stage(self, *actions: Action) -> None:
        if self._committed:
            raise InvalidCommitError("this transaction has already committed")
        self._actions.extend(actions)

    def _staged_metadata(self) -> Metadata | None:
        return next((a for a in self._actions if isinstance(a, Metadata)), None)

    # -- commit -----------------------------------------------------------------------------------
    def prepare(self) -> tuple[PendingCommit, IsolationLevel]:
        """Validate the staged actions and return what conflict checks see, with the level to use.

        ``commit()`` calls this; it is public so a caller can ask what a commit *would* be checked
        against (the differential tests feed it the actions delta-spark staged).
        """
        actions = tuple(self._actions)
        metadata = self._staged_metadata() or (self.snapshot.metadata if self.snapshot is not None else None)
        protocol = next((a for a in actions if isinstance(a, Protocol)), None) or (
            self.snapshot.protocol if self.snapshot is not None else None)
        _validate(actions, metadata, protocol, new_table=self.snapshot is None)
        read_metadata = self.snapshot.metadata if self.snapshot is not None else metadata
        table_level = self._level_override or table_isolation_level(read_metadata)
        level = isolation_to_use(actions, self.changes_data, table_level)
        pending = PendingCommit(
            read_version=self.read_version,
            partition_schema=PartitionSchema.of(read_metadata),
            read_protocol=self.snapshot.protocol if self.snapshot is not None else None,
            metadata=self.snapshot.metadata if self.snapshot is not None else None,
            protocol=self.snapshot.protocol if self.snapshot is not None else None,
            actions=actions,
            operation=self.operation,
            read_predicates=tuple(self._read_predicates),
            read_files=dict(self._read_files),
            read_whole_table=self._read_whole_table,
            read_app_ids=frozenset(self._read_app_ids),
        )
        return pending, level

    def commit(self, *, user_metadata: str | None = None, tags: Mapping[str, str] | None = None) -> CommitResult:
        """Write the staged actions as the next version, rebasing over winners that do not conflict.

        Raises:
            InvalidCommitError: the staged actions break a protocol rule (nothing written).
            UnsupportedProtocolError: the table needs writer behaviour this engine lacks.
            DeltaConcurrentModificationException: a subclass, when a winner conflicts.
            CommitRetriesExceededError: other writers won ``max_attempts`` times in a row.
        """
        if self._committed:
            raise InvalidCommitError("this transaction has already committed")
        pending, level = self.prepare()
        blind = pending.is_blind_append
        info: dict[str, Any] = {
            "timestamp": int(time.time() * 1000),
            "operation": self.operation,
            "operationParameters": {k: v if isinstance(v, str) else json.dumps(v)
                                    for k, v in self.operation_parameters.items()},
            "isolationLevel": level.value,
            "isBlindAppend": blind,
            "engineInfo": _engine_info(),
            "txnId": str(uuid.uuid4()),
        }
        if self.read_version >= 0:
            info["readVersion"] = self.read_version
        if user_metadata is not None:
            info["userMetadata"] = user_metadata
        if tags:
            info["tags"] = dict(tags)
        version = self.read_version + 1
        checked: list[int] = []
        for attempt in range(1, self.max_attempts + 1):
            data = encode_commit([CommitInfo(info), *pending.actions])
            path = self.log.storage.join(self.log.table_root, LOG_DIR, commit_file_name(version))
            try:
                self.log.storage.put_if_absent(path, data)
            except FileAlreadyExistsError:
                if attempt == self.max_attempts:
                    raise CommitRetriesExceededError(attempt, version) from None
                for commit in self.log.commits_after(version - 1):
                    pending = check_winning_commit(pending, WinningCommit.of(commit), level)
                    checked.append(commit.version)
                    version = commit.version + 1
                _check_writable(pending.actions, pending.metadata, pending.protocol)
                continue
            self._committed = True
            return CommitResult(version, self.read_version, attempt, level, blind, tuple(checked), info)
        raise AssertionError("unreachable")  # pragma: no cover


def _validate(actions: tuple[Action, ...], metadata: Metadata | None, protocol: Protocol | None,
              *, new_table: bool) -> None:
    """Protocol rules a writer must keep, checked before anything reaches the log."""
    if sum(isinstance(a, Metadata) for a in actions) > 1:
        raise InvalidCommitError("a commit may hold at most one metaData action")
    if sum(isinstance(a, Protocol) for a in actions) > 1:
        raise InvalidCommitError("a commit may hold at most one protocol action")
    if new_table and (metadata is None or protocol is None):
        raise InvalidCommitError("the first commit of a table needs both a metaData and a protocol action")
    app_versions: dict[str, int] = {}
    for a in actions:
        if isinstance(a, SetTransaction):
            if app_versions.setdefault(a.app_id, a.version) != a.version:
                raise InvalidCommitError(f"two versions staged for application transaction {a.app_id!r}")
        if isinstance(a, CommitInfo):
            raise InvalidCommitError("commitInfo is written by commit(); do not stage it")
    for kind in (AddFile, RemoveFile):
        paths = [a.path for a in actions if isinstance(a, kind)]
        if len(paths) != len(set(paths)):
            dup = next(p for p in paths if paths.count(p) > 1)
            raise InvalidCommitError(f"file {dup!r} is {kind.__name__} twice in one commit")
    if metadata is not None:
        partition_keys = {physical for _, physical, _ in PartitionSchema.of(metadata).fields}
        for a in actions:
            if isinstance(a, AddFile) and set(a.partition_values) != partition_keys:
                raise InvalidCommitError(
                    f"file {a.path!r} has partition values for {sorted(a.partition_values)}, "
                    f"the table is partitioned by {sorted(partition_keys)}"
                )
        if metadata.configuration.get("delta.appendOnly", "false").lower() == "true" and any(
                isinstance(a, RemoveFile) and a.data_change for a in actions):
            raise InvalidCommitError("the table is append-only (delta.appendOnly=true): data cannot be removed")
    _check_writable(actions, metadata, protocol)


def _check_writable(actions: Iterable[Action], metadata: Metadata | None, protocol: Protocol | None) -> None:
    """Refuse commits to tables whose writer features ask for work the engine does not do."""
    if protocol is None:
        return
    if protocol.min_writer_version > 7:
        raise UnsupportedProtocolError(f"writer version {protocol.min_writer_version} is not supported")
    unknown = (protocol.writer_features or frozenset()) - _HARMLESS_WRITER_FEATURES - _CONDITIONAL_WRITER_FEATURES
    if unknown:
        raise UnsupportedProtocolError(
            f"the table requires writer features this engine does not implement: {sorted(unknown)}",
            features=frozenset(unknown),
        )
    if metadata is None:
        return
    config = {k: v.lower() for k, v in metadata.configuration.items()}
    actions = list(actions)
    adds_data = any(isinstance(a, AddFile) and a.data_change for a in actions)
    removes_data = any(isinstance(a, RemoveFile) and a.data_change for a in actions)
    schema_text = metadata.schema_string
    reasons = []
    if protocol.supports("inCommitTimestamp") and config.get("delta.enableincommittimestamps") == "true":
        reasons.append("in-commit timestamps (delta.enableInCommitTimestamps)")
    if adds_data:
        if protocol.supports("rowTracking"):
            reasons.append("row tracking (row IDs must be assigned to new files)")
        if protocol.supports("checkConstraints") and any(k.startswith("delta.constraints.") for k in config):
            reasons.append("CHECK constraints")
        if protocol.supports("invariants") and "delta.invariants" in schema_text:
            reasons.append("column invariants")
        if protocol.supports("generatedColumns") and "delta.generationExpression" in schema_text:
            reasons.append("generated columns")
        if protocol.supports("identityColumns") and "delta.identity." in schema_text:
            reasons.append("identity columns")
        if protocol.supports("columnMapping") and config.get("delta.columnmapping.mode", "none") != "none":
            reasons.append("column mapping (data files must use physical column names)")
    if removes_data and protocol.supports("changeDataFeed") and config.get("delta.enablechangedatafeed") == "true":
        reasons.append("change data feed (removing data must write change files)")
    if reasons:
        raise UnsupportedProtocolError("the engine cannot write this commit because the table uses "
                                       + ", ".join(reasons))
