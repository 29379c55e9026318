"""Commit-time conflict detection, as OSS delta-spark 4.x decides it.

When a transaction loses the race for version ``v``, Delta reads each winning commit and checks it
against what the loser *recorded* while it ran (read predicates, files read, whole-table reads,
application ids looked up, staged actions). The checks run per winner in a fixed order and the
first failure is reported: protocol, metadata, domain metadata, application transactions, added
files, removed-vs-read files, removed-vs-removed files. A winner that passes every check is
"rebased over": the loser adopts the winner's protocol and (allowed) metadata and tries the next
version without rewriting any data.

The recorded read set is never re-evaluated against newer snapshots: Delta checks each winner
against the read-time facts, and so does this module. Sources: delta-io/delta
``ConflictChecker.scala`` / ``OptimisticTransaction.scala`` (summarised with citations in
``../shared/research/delta_occ_spec.md``); the differential tests in ``tests/spark`` run the same
interleavings on real delta-spark.

Not modelled, because the engine refuses to write where they would matter: row-ID and row commit
version rebasing (row tracking), in-commit timestamp rebasing, type-widening version bumps, and
row-tracking backfill transactions. ``transaction.py`` rejects writes to tables that need them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .actions import (
    ISOLATION_LEVEL_KEY,
    Action,
    AddCDCFile,
    AddFile,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from .errors import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    InvalidCommitError,
    MetadataChangedException,
    ProtocolChangedException,
)
from .expressions import Expr, Literal
from .predicates import evaluate_partition
from .schema import StructType
from .values import parse_partition_value

if TYPE_CHECKING:
    from .snapshot import Commit


class IsolationLevel(StrEnum):
    """Delta's isolation levels; ``SnapshotIsolation`` is never a table level, only a downgrade."""

    SERIALIZABLE = "Serializable"
    WRITE_SERIALIZABLE = "WriteSerializable"
    SNAPSHOT_ISOLATION = "SnapshotIsolation"

    @classmethod
    def parse(cls, text: str) -> IsolationLevel:
        """Case-insensitive, as delta-spark reads ``delta.isolationLevel``."""
        for level in cls:
            if level.value.lower() == text.strip().lower():
                return level
        raise InvalidCommitError(
            f"unknown isolation level {text!r}; expected one of {', '.join(lv.value for lv in cls)}"
        )


OSS_DEFAULT_ISOLATION = IsolationLevel.SERIALIZABLE


def table_isolation_level(metadata: Metadata | None, default: IsolationLevel = OSS_DEFAULT_ISOLATION
                          ) -> IsolationLevel:
    """The level the table asks for; OSS delta-spark defaults to Serializable when it is unset."""
    if metadata is None or ISOLATION_LEVEL_KEY not in metadata.configuration:
        return default
    return IsolationLevel.parse(metadata.configuration[ISOLATION_LEVEL_KEY])


# ``DeltaOperations.*.changesData``: operations whose empty or rearranging commits still count as
# data changes under WriteSerializable.
DATA_CHANGING_OPERATIONS = frozenset({
    "WRITE", "STREAMING UPDATE", "DELETE", "TRUNCATE", "CONVERT", "MERGE", "UPDATE", "REPLACE TABLE",
    "REPLACE TABLE AS SELECT", "CREATE OR REPLACE TABLE", "CREATE OR REPLACE TABLE AS SELECT",
    "CREATE TABLE AS SELECT", "RESTORE", "CLONE",
})

ROW_TRACKING_DOMAIN = "delta.rowTracking"


def isolation_to_use(actions: Sequence[Action], operation_changes_data: bool,
                     table_level: IsolationLevel) -> IsolationLevel:
    """The level a commit is checked at: downgraded to snapshot isolation when it changes no data.

    Any action other than a file action (or the row-tracking domain) keeps the table's level, so a
    metadata change is never downgraded. OPTIMIZE (only ``dataChange=false`` files) is, which is
    why compaction never conflicts with appends.
    """
    data_changed = False
    for action in actions:
        if isinstance(action, AddFile | RemoveFile):
            data_changed |= action.data_change
        elif isinstance(action, AddCDCFile):
            continue
        elif isinstance(action, DomainMetadata) and action.domain == ROW_TRACKING_DOMAIN:
            continue
        elif isinstance(action, CommitInfo):
            continue
        else:
            return table_level
    if table_level is IsolationLevel.SERIALIZABLE:
        return IsolationLevel.SNAPSHOT_ISOLATION if not data_changed else table_level
    if table_level is IsolationLevel.WRITE_SERIALIZABLE:
        if not data_changed and not operation_changes_data:
            return IsolationLevel.SNAPSHOT_ISOLATION
        return table_level
    return table_level


@dataclass(frozen=True)
class PartitionSchema:
    """The read snapshot's partition columns: (logical name, physical name, type) each.

    Winning files are judged with the schema the loser *read*, as delta-spark does, so a
    concurrent repartitioning cannot silently widen or narrow the check.
    """

    fields: tuple[tuple[str, str, Any], ...]

    @classmethod
    def of(cls, metadata: Metadata | None) -> PartitionSchema:
        if metadata is None:
            return cls(())
        schema: StructType = metadata.schema  # a malformed schema names the commit file and line
        fields = []
        for name in metadata.partition_columns:
            f = schema.find(name)
            if f is None:
                raise InvalidCommitError(f"partition column {name!r} is not in the table schema")
            fields.append((f.name, f.physical_name, f.type))
        return cls(tuple(fields))

    def __bool__(self) -> bool:
        return bool(self.fields)

    def typed(self, raw: Mapping[str, str | None]) -> dict[str, Any] | None:
        """Typed values by logical name, or ``None`` when one does not parse (then it may match anything)."""
        out: dict[str, Any] = {}
        for name, physical, data_type in self.fields:
            try:
                out[name] = parse_partition_value(raw.get(physical), data_type)
            except (ValueError, ArithmeticError):
                return None
        return out

    def hint(self, raw: Mapping[str, str | None] | None) -> dict[str, str | None]:
        """The partition as delta-spark names it in messages (logical names, raw values)."""
        raw = raw or {}
        return {name: raw.get(physical) for name, physical, _ in self.fields}


@dataclass(frozen=True)
class PendingCommit:
    """What a transaction recorded and staged: the input of every conflict check.

    ``read_predicates`` hold only the partition-column part of each filter the transaction read
    with (``TRUE`` for a filter with none), because that is all delta-spark's append check uses.
    ``read_files`` maps each file read to its raw partition values (for the message hint).
    """

    read_version: int
    partition_schema: PartitionSchema
    read_protocol: Protocol | None
    metadata: Metadata | None
    protocol: Protocol | None
    actions: tuple[Action, ...]
    operation: str = "WRITE"
    read_predicates: tuple[Expr, ...] = ()
    read_files: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)
    read_whole_table: bool = False
    read_app_ids: frozenset[str] = frozenset()

    @property
    def metadata_changed(self) -> bool:
        return any(isinstance(a, Metadata) for a in self.actions)

    @property
    def is_blind_append(self) -> bool:
        """Only adds, and nothing read: such a commit cannot have missed anything a winner did."""
        depends_on_files = bool(self.read_predicates) or bool(self.read_files) or self.read_whole_table
        file_actions = (a for a in self.actions if isinstance(a, AddFile | RemoveFile | AddCDCFile))
        only_adds = all(isinstance(a, AddFile) for a in file_actions)
        return only_adds and not depends_on_files


@dataclass(frozen=True)
class WinningCommit:
    """The parts of a winning commit the checks look at."""

    version: int
    operation: str | None
    commit_info: Mapping[str, Any]
    protocol: Protocol | None
    metadata: Metadata | None
    added: tuple[AddFile, ...]
    removed: tuple[RemoveFile, ...]
    app_ids: frozenset[str]
    domains: frozenset[str]
    # Set only by the planner: the commit will add files in partitions not known in advance
    # (an INSERT or MERGE whose source is not pinned), so any read partition may be hit.
    adds_anywhere: bool = False

    @property
    def is_blind_append(self) -> bool:
        # A missing flag counts as not blind, as in delta-spark.
        return self.commit_info.get("isBlindAppend") is True

    @property
    def identity_only_metadata_update(self) -> bool:
        tags = self.commit_info.get("tags") or {}
        return isinstance(tags, Mapping) and tags.get("delta.identity.schemaUpdate") == "true"

    @classmethod
    def of(cls, commit: Commit) -> WinningCommit:
        info = commit.commit_info
        raw: Mapping[str, Any] = info.raw if info is not None else {}
        return cls(
            version=commit.version,
            operation=raw.get("operation"),
            commit_info=raw,
            protocol=next((a for a in commit.actions if isinstance(a, Protocol)), None),
            metadata=next((a for a in commit.actions if isinstance(a, Metadata)), None),
            added=tuple(a for a in commit.actions if isinstance(a, AddFile)),
            removed=tuple(a for a in commit.actions if isinstance(a, RemoveFile)),
            app_ids=frozenset(a.app_id for a in commit.actions if isinstance(a, SetTransaction)),
            domains=frozenset(a.domain for a in commit.actions if isinstance(a, DomainMetadata)),
        )


def check_winning_commit(pending: PendingCommit, winner: WinningCommit, level: IsolationLevel) -> PendingCommit:
    """Check one winning commit; return the transaction rebased over it, or raise the conflict.

    Raises:
        ProtocolChangedException, MetadataChangedException, ConcurrentTransactionException,
        ConcurrentAppendException, ConcurrentDeleteReadException, ConcurrentDeleteDeleteException:
            in this order of checks; the first that applies.
    """
    pending = _check_protocol(pending, winner)
    pending = _check_metadata(pending, winner)
    _check_domains(pending, winner)
    _check_app_ids(pending, winner)
    _check_appends(pending, winner, level)
    _check_delete_read(pending, winner)
    _check_delete_delete(pending, winner)
    return pending


# -- step 1: protocol -----------------------------------------------------------------------------

def _features(protocol: Protocol | None) -> frozenset[str]:
    if protocol is None:
        return frozenset()
    return (protocol.reader_features or frozenset()) | (protocol.writer_features or frozenset())


def _check_protocol(pending: PendingCommit, winner: WinningCommit) -> PendingCommit:
    if winner.protocol is None:
        return pending
    if any(isinstance(a, Protocol) for a in pending.actions):
        detail = ""
        if winner.version == 0:
            detail = ("Several writers created the table at the same path at once; create the table "
                      "before the concurrent writers start")
        raise ProtocolChangedException(version=winner.version, operation=winner.operation, detail=detail)
    dropped = _features(pending.read_protocol) - _features(winner.protocol)
    if dropped:
        raise ProtocolChangedException(
            version=winner.version, operation=winner.operation,
            detail=f"the winner dropped table features {sorted(dropped)}",
        )
    return replace(pending, protocol=winner.protocol)


# -- step 2: metadata -----------------------------------------------------------------------------

_METADATA_FIELDS = ("id", "name", "description", "format_provider", "format_options", "schema_string",
                    "partition_columns", "configuration", "created_time")


def _check_metadata(pending: PendingCommit, winner: WinningCommit) -> PendingCommit:
    new = winner.metadata
    if new is None:
        return pending
    conflict = MetadataChangedException(version=winner.version, operation=winner.operation)
    if pending.metadata_changed:
        raise conflict
    if winner.identity_only_metadata_update:
        return pending
    old = pending.metadata
    if old is None:
        raise conflict
    differ = {name for name in _METADATA_FIELDS if getattr(old, name) != getattr(new, name)}
    if not differ <= {"configuration", "schema_string"}:
        raise conflict
    protocol = pending.protocol
    if "configuration" in differ and not _configuration_change_allowed(old.configuration, new.configuration,
                                                                        protocol):
        raise conflict
    if "schema_string" in differ and not _schema_change_allowed(old, new):
        raise conflict
    # delta-spark adopts the winner's metadata: the loser commits under the new configuration.
    return replace(pending, metadata=new)


def _supports(protocol: Protocol | None, feature: str) -> bool:
    return protocol is not None and protocol.supports(feature)


def _configuration_change_allowed(old: Mapping[str, str], new: Mapping[str, str], protocol: Protocol | None) -> bool:
    """Feature enablements a running transaction can be rebased over (delta-spark 4.1+)."""
    if set(old) - set(new):
        return False
    for key in new:
        if key in old and old[key] == new[key]:
            continue
        value = new[key]
        is_true = value.lower() == "true"
        added = key not in old
        if key == "delta.enableRowTracking":
            ok = _supports(protocol, "rowTracking") and is_true
        elif key in ("delta.rowTracking.materializedRowIdColumnName",
                     "delta.rowTracking.materializedRowCommitVersionColumnName"):
            ok = new.get("delta.enableRowTracking", "").lower() == "true"
        elif key == "delta.columnMapping.mode":
            ok = old.get(key, "none").lower() == "none" and value.lower() == "name" and _supports(
                protocol, "columnMapping")
        elif key == "delta.columnMapping.maxColumnId":
            ok = True
        elif key == "delta.enableDeletionVectors":
            ok = _supports(protocol, "deletionVectors") and is_true
        elif key == "delta.checkpointPolicy":
            ok = _supports(protocol, "v2Checkpoint") and value.lower() == "v2"
        elif key == "delta.enableInCommitTimestamps":
            ok = _supports(protocol, "inCommitTimestamp") and is_true
        elif key in ("delta.inCommitTimestampEnablementVersion", "delta.inCommitTimestampEnablementTimestamp"):
            ok = added
        elif key == "io.unitycatalog.tableId":
            ok = added and _supports(protocol, "catalogOwned-preview")
        else:
            ok = False
        if not ok:
            return False
    return True


_COLUMN_MAPPING_KEYS = ("delta.columnMapping.id", "delta.columnMapping.physicalName",
                        "delta.columnMapping.nested.ids")


def _schema_change_allowed(old: Metadata, new: Metadata) -> bool:
    """Only the none -> name column-mapping upgrade, which renames nothing a reader sees."""
    if old.configuration.get("delta.columnMapping.mode", "none").lower() != "none":
        return False
    if new.configuration.get("delta.columnMapping.mode", "none").lower() != "name":
        return False
    old_schema, new_schema = json.loads(old.schema_string), json.loads(new.schema_string)
    old_fields, new_fields = old_schema.get("fields", []), new_schema.get("fields", [])
    if len(old_fields) != len(new_fields):
        return False
    for a, b in zip(old_fields, new_fields, strict=True):
        if (a.get("name"), a.get("type"), a.get("nullable")) != (b.get("name"), b.get("type"), b.get("nullable")):
            return False
        strip = {k: v for k, v in (b.get("metadata") or {}).items() if k not in _COLUMN_MAPPING_KEYS}
        if strip != {k: v for k, v in (a.get("metadata") or {}).items() if k not in _COLUMN_MAPPING_KEYS}:
            return False
    return True


# -- steps 3 and 4: domains and application transactions ------------------------------------------

def _check_domains(pending: PendingCommit, winner: WinningCommit) -> None:
    if not _supports(pending.protocol, "domainMetadata"):
        return
    for action in pending.actions:
        if (isinstance(action, DomainMetadata) and action.domain in winner.domains
                and action.domain != ROW_TRACKING_DOMAIN):
            raise ConcurrentTransactionException(
                version=winner.version, operation=winner.operation,
                detail=f"both commits change metadata domain {action.domain!r}",
            )


def _check_app_ids(pending: PendingCommit, winner: WinningCommit) -> None:
    shared = pending.read_app_ids & winner.app_ids
    if shared:
        raise ConcurrentTransactionException(
            version=winner.version, operation=winner.operation,
            detail=f"both depend on application transaction id {sorted(shared)[0]!r}",
        )


# -- steps 8 to 10: files -------------------------------------------------------------------------

def _check_appends(pending: PendingCommit, winner: WinningCommit, level: IsolationLevel) -> None:
    if level is IsolationLevel.SNAPSHOT_ISOLATION:
        return
    if level is IsolationLevel.WRITE_SERIALIZABLE and not pending.metadata_changed:
        candidates: Sequence[AddFile] = () if winner.is_blind_append else winner.added
    else:
        candidates = winner.added
    anywhere = winner.adds_anywhere and not (
        level is IsolationLevel.WRITE_SERIALIZABLE and not pending.metadata_changed and winner.is_blind_append)
    if not (candidates or anywhere) or pending.is_blind_append:
        return
    schema = pending.partition_schema
    predicates = list(dict.fromkeys(pending.read_predicates))
    if pending.read_whole_table or not schema or (anywhere and predicates):
        first = candidates[0] if candidates else None
        raise ConcurrentAppendException(
            version=winner.version, operation=winner.operation,
            partition=(schema.hint(first.partition_values) if first is not None else None) if schema else {},
            path=first.path if first is not None else None,
            detail="its new files may land in any partition" if first is None else "",
        )
    for predicate in predicates:
        verdicts: dict[tuple[tuple[str, str | None], ...], bool] = {}  # winners add many files per partition
        for add in candidates:
            key = tuple(sorted(add.partition_values.items()))
            matches = verdicts.get(key)
            if matches is None:
                matches = verdicts[key] = _partition_matches(predicate, schema, add.partition_values)
            if matches:
                raise ConcurrentAppendException(
                    version=winner.version, operation=winner.operation,
                    partition=schema.hint(add.partition_values), path=add.path,
                )


def _partition_matches(predicate: Expr, schema: PartitionSchema, raw: Mapping[str, str | None]) -> bool:
    if isinstance(predicate, Literal) and predicate.value is True:
        return True
    typed = schema.typed(raw)
    if typed is None:
        return True  # a value that does not parse as the read-time type: assume it matches
    return evaluate_partition(predicate, typed) is True


def _check_delete_read(pending: PendingCommit, winner: WinningCommit) -> None:
    for remove in winner.removed:
        if remove.path in pending.read_files:
            raise ConcurrentDeleteReadException(
                version=winner.version, operation=winner.operation,
                partition=pending.partition_schema.hint(pending.read_files[remove.path]), path=remove.path,
            )
    if winner.removed and pending.read_whole_table:
        raise ConcurrentDeleteReadException(
            version=winner.version, operation=winner.operation, path=winner.removed[0].path,
            detail="this transaction read the whole table",
        )


def _check_delete_delete(pending: PendingCommit, winner: WinningCommit) -> None:
    mine = {a.path: a for a in pending.actions if isinstance(a, RemoveFile)}
    for remove in winner.removed:
        if remove.path in mine:
            raise ConcurrentDeleteDeleteException(
                version=winner.version, operation=winner.operation,
                partition=pending.partition_schema.hint(mine[remove.path].partition_values), path=remove.path,
            )
