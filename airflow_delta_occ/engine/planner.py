"""Planning verdicts: can two jobs, not yet run, conflict on this table?

The conflict pools call this before a job starts, from what the job *will* do (operation kind,
filter, target partitions) and the table's current snapshot. A verdict may be conservative (say
"conflict" where the real commit would have succeeded) but must never say "no conflict" where a
commit fails, so every abstraction here over-approximates:

* files read and removed come from ``Snapshot.files_matching`` (a superset of Spark's scan);
* new files land in a known set of partitions only when that set is certain (rewrites stay in the
  partitions they read, ``write_partitions`` given by the author, or a filter that pins every
  partition column to a finite set of values); otherwise "anywhere";
* both commit orders are checked, since a pool cannot know which job finishes first.

Three models:

``delta``
    OSS delta-spark. The planner builds the commits the two jobs would write and runs the real
    commit-time checker (``conflicts.check_winning_commit``) on them: one rule book, no copy.
``databricks``
    The Databricks conflict matrices: WriteSerializable when the table sets no level; OPTIMIZE
    without ZORDER never conflicts with DML when deletion vectors are on; row-level concurrency on
    unpartitioned tables with deletion vectors (DML pairs conflict only on the same rows, which a
    planner cannot see, so they stay "may conflict"); identity-column tables admit no concurrency.
``maxcompute``
    MaxCompute's transaction-level table: the outcome depends on the operation pair and the commit
    order within one table or partition; disjoint partitions never conflict.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal, TypeVar

from .actions import METADATA, PROTOCOL, Action, AddFile, Metadata, Protocol, RemoveFile
from .actions import _type_name as _json_kind
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
    ConflictKind,
    DeltaConcurrentModificationException,
    ExpressionDecodeError,
    FootprintDecodeError,
    InvalidCommitError,
    LogCorruptError,
)
from .expr_json import expr_from_json, expr_to_json
from .expressions import (
    TRUE,
    And,
    Column,
    Comparison,
    Expr,
    In,
    Or,
    and_,
    has_unknown,
    partition_conjuncts,
    split_conjuncts,
)
from .expressions import Literal as Lit
from .log_writer import action_to_json
from .schema import parse_schema
from .snapshot import Snapshot
from .values import format_partition_value

Model = Literal["delta", "databricks", "maxcompute"]
MODELS: tuple[Model, ...] = ("delta", "databricks", "maxcompute")
_MAX_ENUMERATED_PARTITIONS = 4096


class Operation(StrEnum):
    """What a job does to the table, at the granularity conflicts depend on."""

    INSERT = "INSERT"                      # blind append: reads nothing of the target
    INSERT_SELF_READ = "INSERT_SELF_READ"  # append whose query reads the target (behaves like MERGE)
    MERGE = "MERGE"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    OPTIMIZE = "OPTIMIZE"                  # bin-packing compaction (dataChange=false)
    OPTIMIZE_ZORDER = "OPTIMIZE_ZORDER"
    REPLACE_WHERE = "REPLACE_WHERE"        # overwrite of the rows matching a predicate
    OVERWRITE = "OVERWRITE"                # whole-table overwrite / INSERT OVERWRITE / TRUNCATE
    SET_PROPERTIES = "SET_PROPERTIES"      # ALTER TABLE SET TBLPROPERTIES
    SCHEMA_CHANGE = "SCHEMA_CHANGE"        # ALTER TABLE ADD COLUMNS, schema evolution
    CREATE_TABLE = "CREATE_TABLE"
    MINOR_COMPACT = "MINOR_COMPACT"        # MaxCompute; file-level compaction elsewhere
    MAJOR_COMPACT = "MAJOR_COMPACT"


#: delta-spark's ``commitInfo.operation`` for each planned operation.
DELTA_OPERATION_NAMES = {
    Operation.INSERT: "WRITE", Operation.INSERT_SELF_READ: "WRITE", Operation.MERGE: "MERGE",
    Operation.UPDATE: "UPDATE", Operation.DELETE: "DELETE", Operation.OPTIMIZE: "OPTIMIZE",
    Operation.OPTIMIZE_ZORDER: "OPTIMIZE", Operation.REPLACE_WHERE: "WRITE", Operation.OVERWRITE: "WRITE",
    Operation.SET_PROPERTIES: "SET TBLPROPERTIES", Operation.SCHEMA_CHANGE: "ADD COLUMNS",
    Operation.CREATE_TABLE: "CREATE TABLE", Operation.MINOR_COMPACT: "OPTIMIZE",
    Operation.MAJOR_COMPACT: "OPTIMIZE",
}
_DML = frozenset({Operation.MERGE, Operation.UPDATE, Operation.DELETE, Operation.INSERT_SELF_READ})
#: Compactions: they rearrange files (``dataChange=false``) and change no row.
COMPACTIONS = frozenset({Operation.OPTIMIZE, Operation.OPTIMIZE_ZORDER, Operation.MINOR_COMPACT,
                          Operation.MAJOR_COMPACT})
# Operations that remove (rewrite) the files they select; their new files stay in those partitions.
REWRITING_OPERATIONS = (_DML - {Operation.INSERT_SELF_READ}) | COMPACTIONS | {Operation.REPLACE_WHERE,
                                                                              Operation.OVERWRITE}


@dataclass(frozen=True)
class Footprint:
    """What one planned job reads and writes, in the terms conflict checks use.

    Build it with ``plan_footprint``; fields hold raw (serialized) partition values so a footprint
    is plain data that can be stored with a pool lease.
    """

    operation: Operation
    label: str
    read_predicate: Expr | None                      # partition-only part of the filter; None: reads nothing
    read_whole_table: bool
    read_files: Mapping[str, Mapping[str, str | None]]
    removes: Mapping[str, Mapping[str, str | None]]
    write_partitions: tuple[Mapping[str, str | None], ...] | None  # None: new files may land anywhere
    adds_files: bool
    data_change: bool
    blind_append: bool
    metadata: Metadata | None = None                 # the metadata the job commits, if it changes it
    protocol: Protocol | None = None
    read_app_ids: frozenset[str] = frozenset()
    written_app_ids: frozenset[str] = frozenset()
    row_level_eligible: bool = True                  # conditions simple enough for row-level concurrency

    def to_json(self) -> dict[str, Any]:
        """The footprint as plain JSON (a lease or a trigger's arguments carry it); ``from_json`` reverses it.

        Keys are the field names. The predicate is in ``expr_to_json``'s form, metadata and protocol in
        the form of their Delta log actions, sets as sorted arrays.

        Raises:
            ValueError, TypeError: ``read_predicate`` has no JSON form (see ``expr_to_json``).
        """
        return {
            "operation": Operation(self.operation).value,
            "label": self.label,
            "read_predicate": None if self.read_predicate is None else expr_to_json(self.read_predicate),
            "read_whole_table": self.read_whole_table,
            "read_files": {path: dict(values) for path, values in self.read_files.items()},
            "removes": {path: dict(values) for path, values in self.removes.items()},
            "write_partitions": None if self.write_partitions is None else [dict(p) for p in self.write_partitions],
            "adds_files": self.adds_files,
            "data_change": self.data_change,
            "blind_append": self.blind_append,
            "metadata": None if self.metadata is None else action_to_json(self.metadata)[METADATA],
            "protocol": None if self.protocol is None else action_to_json(self.protocol)[PROTOCOL],
            "read_app_ids": sorted(self.read_app_ids),
            "written_app_ids": sorted(self.written_app_ids),
            "row_level_eligible": self.row_level_eligible,
        }

    @classmethod
    def from_json(cls, data: object) -> Footprint:
        """Rebuild a footprint from ``to_json``'s form; the document is untrusted.

        Fields with a default (``metadata``, ``protocol``, the app ids, ``row_level_eligible``) may
        be left out.

        Raises:
            FootprintDecodeError: the document does not describe a footprint; ``field`` names where.
        """
        if not isinstance(data, dict):
            raise FootprintDecodeError(f"a footprint must be an object, got {_json_kind(data)}")
        return cls(
            operation=_operation_field(data),
            label=_typed_field(data, "label", str),
            read_predicate=_predicate_field(data),
            read_whole_table=_typed_field(data, "read_whole_table", bool),
            read_files=_files_field(data, "read_files"),
            removes=_files_field(data, "removes"),
            write_partitions=_write_partitions_field(data),
            adds_files=_typed_field(data, "adds_files", bool),
            data_change=_typed_field(data, "data_change", bool),
            blind_append=_typed_field(data, "blind_append", bool),
            metadata=_action_field(data, "metadata", _metadata_from_json),
            protocol=_action_field(data, "protocol", Protocol.from_dict),
            read_app_ids=_app_ids_field(data, "read_app_ids"),
            written_app_ids=_app_ids_field(data, "written_app_ids"),
            row_level_eligible=_typed_field(data, "row_level_eligible", bool, default=True),
        )


# -- footprint JSON fields: each check names its field, because a lease is written by another process

_T = TypeVar("_T")
_A = TypeVar("_A")
_MISSING: Any = object()


def _typed_field(data: Mapping[str, object], key: str, kind: type[_T], default: _T = _MISSING) -> _T:
    """``data[key]`` of JSON type ``kind`` (``str``, ``bool``, ``dict``, ``list``)."""
    value = data.get(key, default)
    if value is _MISSING:
        raise FootprintDecodeError("required field is missing", field=key)
    if not isinstance(value, kind):
        # kind() is an empty instance: its JSON type name is the expected one
        raise FootprintDecodeError(f"must be {_json_kind(kind())}, got {_json_kind(value)}", field=key)
    return value


def _operation_field(data: Mapping[str, object]) -> Operation:
    name = _typed_field(data, "operation", str)
    try:
        return Operation(name)
    except ValueError:
        raise FootprintDecodeError(f"unknown operation {name!r}; expected one of {', '.join(Operation)}",
                                   field="operation") from None


def _predicate_field(data: Mapping[str, object]) -> Expr | None:
    raw = data.get("read_predicate")
    if raw is None:
        return None
    try:
        return expr_from_json(raw)
    except ExpressionDecodeError as exc:
        raise FootprintDecodeError(str(exc), field="read_predicate") from exc


def _partition(raw: object, field: str) -> dict[str, str | None]:
    """Serialized partition values: strings, or ``null`` for a NULL partition."""
    if not isinstance(raw, dict):
        raise FootprintDecodeError(f"partition values must be an object, got {_json_kind(raw)}", field=field)
    for column, value in raw.items():
        if not isinstance(column, str):
            raise FootprintDecodeError(f"partition column names must be strings, got {_json_kind(column)}",
                                       field=field)
        if value is not None and not isinstance(value, str):
            raise FootprintDecodeError(f"partition value of {column!r} must be a string or null, got "
                                       f"{_json_kind(value)}", field=field)
    return dict(raw)


def _files_field(data: Mapping[str, object], key: str) -> dict[str, dict[str, str | None]]:
    files = _typed_field(data, key, dict)
    return {path: _partition(values, f"{key}[{path!r}]") for path, values in files.items()}


def _write_partitions_field(data: Mapping[str, object]) -> tuple[dict[str, str | None], ...] | None:
    raw = data.get("write_partitions")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise FootprintDecodeError(f"must be an array or null, got {_json_kind(raw)}", field="write_partitions")
    return tuple(_partition(p, f"write_partitions[{i}]") for i, p in enumerate(raw))


def _app_ids_field(data: Mapping[str, object], key: str) -> frozenset[str]:
    ids = _typed_field(data, key, list, default=[])
    if not all(isinstance(i, str) for i in ids):
        raise FootprintDecodeError("must be an array of strings", field=key)
    return frozenset(ids)


def _metadata_from_json(raw: Mapping[str, Any]) -> Metadata:
    """A ``metaData`` action whose schema parses now, not when a conflict check first reads it."""
    metadata = Metadata.from_dict(raw)
    parse_schema(metadata.schema_string)
    return metadata


def _action_field(data: Mapping[str, object], key: str, parse: Callable[[Mapping[str, Any]], _A]) -> _A | None:
    """A Delta action in its log form (``metaData`` / ``protocol`` payload), checked like a log line."""
    raw = data.get(key)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise FootprintDecodeError(f"must be an object or null, got {_json_kind(raw)}", field=key)
    try:
        return parse(raw)
    except (ValueError, TypeError, KeyError, LogCorruptError) as exc:  # MalformedActionError is a ValueError
        raise FootprintDecodeError(str(exc), field=key) from exc


@dataclass(frozen=True)
class Verdict:
    """The answer for one pair: whether they can conflict, what would be raised, and why."""

    conflict: bool
    model: Model
    reason: str
    exception: ConflictKind | None = None           # the conflict delta-spark would raise
    loser: str | None = None
    winner: str | None = None
    orders: tuple[str, ...] = field(default=(), compare=False)

    def __bool__(self) -> bool:
        return self.conflict


@dataclass(frozen=True)
class TableState:
    """What a verdict needs of the table besides the two footprints: its version, metadata and protocol.

    A ``Snapshot`` carries these with the file list; a lease carries only this (``to_json``), so a
    pool can judge footprints planned by other processes without reading the table.
    """

    version: int
    metadata: Metadata
    protocol: Protocol

    @classmethod
    def of(cls, table: Snapshot | TableState) -> TableState:
        if isinstance(table, TableState):
            return table
        return cls(table.version, table.metadata, table.protocol)

    @property
    def partition_columns(self) -> tuple[str, ...]:
        return self.metadata.partition_columns

    @property
    def deletion_vectors_enabled(self) -> bool:
        return self.metadata.deletion_vectors_enabled

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: the version, and metadata and protocol in their Delta log form."""
        return {"version": self.version, "metadata": action_to_json(self.metadata)[METADATA],
                "protocol": action_to_json(self.protocol)[PROTOCOL]}

    @classmethod
    def from_json(cls, data: object) -> TableState:
        """Rebuild from ``to_json``'s form; the document is untrusted.

        Raises:
            FootprintDecodeError: not a table state; ``field`` names where.
        """
        if not isinstance(data, dict):
            raise FootprintDecodeError(f"a table state must be an object, got {_json_kind(data)}")
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise FootprintDecodeError("must be a non-negative integer", field="version")
        metadata = _action_field(data, "metadata", _metadata_from_json)
        protocol = _action_field(data, "protocol", Protocol.from_dict)
        if metadata is None or protocol is None:
            raise FootprintDecodeError("required field is missing", field="protocol" if metadata else "metadata")
        return cls(version, metadata, protocol)


# -- footprints -----------------------------------------------------------------------------------

def plan_footprint(
    snapshot: Snapshot,
    operation: Operation | str,
    predicate: str | Expr | None = None,
    *,
    label: str | None = None,
    write_partitions: Iterable[Mapping[str, Any]] | None = None,
    properties: Mapping[str, str] | None = None,
    app_id: str | None = None,
    target_alias: str | None = None,
    row_level_eligible: bool = True,
    reads_whole_table: bool = False,
) -> Footprint:
    """The footprint of a job about to run ``operation`` with ``predicate`` on ``snapshot``.

    ``write_partitions`` pins where an INSERT or MERGE adds files (``{"date": "2024-01-01"}``
    each); without it their new files may land anywhere. ``properties`` are the table properties
    a SET_PROPERTIES job sets. ``app_id`` marks an idempotent writer (txnAppId).

    ``reads_whole_table`` says the job reads every file whatever ``predicate`` confines its changes
    to: a MERGE with a WHEN NOT MATCHED BY SOURCE clause (delta-spark's ``findTouchedFiles`` scans
    with ``filterFiles(true)`` then), so it conflicts with every concurrent write that adds files.
    Such a MERGE also removes and re-adds every file of the table: measured on delta-spark 4.4, a
    MERGE whose ON condition and every clause (NOT MATCHED BY SOURCE ... DELETE or UPDATE included)
    are confined to one partition removes the files of every partition and copies the other
    partitions' rows into new files there (``numTargetFilesRemoved`` = all files). So its footprint
    removes every file of the snapshot and writes into every partition that holds one; a job that read
    another partition fails after it (tests/spark/test_differential.py, ``MERGE_NMBS``). With deletion
    vectors delta-spark rewrote only the confined partition, but a session setting
    (``spark.databricks.delta.merge.deletionVectors.persistent=false``) the planner cannot see brings
    the copying back, so the footprint is the same there (conservative). ``read_predicate`` stays
    ``TRUE`` (what delta-spark records); the predicate only confines where the rows it inserts land.
    """
    op = Operation(operation)
    schema = PartitionSchema.of(snapshot.metadata)
    expr = snapshot.bind(predicate, target_alias=target_alias) if predicate is not None else None
    partition_part = _partition_part(expr, snapshot)
    reads = _reads(op)
    files = (snapshot.files_matching(expr) if expr is not None else snapshot.files()) if reads else []
    selected = {f.path: f.partition_values for f in files}
    read_files = {f.path: f.partition_values for f in snapshot.files()} if reads_whole_table and reads else selected
    rewrites = op in REWRITING_OPERATIONS
    # A NOT MATCHED BY SOURCE MERGE rewrites every file it reads, not only those it selects (see above).
    removes = dict(read_files if op is Operation.MERGE else selected) if rewrites else {}
    adds = adds_files(op)
    # Rewritten files stay in their partitions; inserted rows go where the source sends them.
    rewritten = {freeze_partition(pv) for pv in removes.values()}
    inserts_rows = op in (Operation.INSERT, Operation.INSERT_SELF_READ, Operation.MERGE, Operation.REPLACE_WHERE,
                          Operation.OVERWRITE)
    new_rows: set[tuple[tuple[str, str | None], ...]] | None = set()
    if inserts_rows:
        if write_partitions is not None:
            new_rows = {freeze_partition(_raw_partition(schema, p)) for p in write_partitions}
        elif op is Operation.REPLACE_WHERE and expr is not None:
            enumerated = enumerate_partitions(partition_part, schema)
            new_rows = None if enumerated is None else {freeze_partition(p) for p in enumerated}
        else:
            new_rows = None
    written = None if new_rows is None else tuple(dict(p) for p in sorted(rewritten | new_rows, key=repr))
    metadata, protocol = _planned_metadata(op, snapshot, properties)
    data_change = changes_data(op)
    return Footprint(
        operation=op,
        label=label or op.value,
        read_predicate=_read_predicate(op, partition_part, reads_whole_table),
        read_whole_table=reads_whole_table and reads,
        read_files=read_files,
        removes=removes,
        write_partitions=written,
        adds_files=adds,
        data_change=data_change,
        blind_append=not reads and not removes,
        metadata=metadata,
        protocol=protocol,
        read_app_ids=frozenset({app_id}) if app_id else frozenset(),
        written_app_ids=frozenset({app_id}) if app_id else frozenset(),
        row_level_eligible=row_level_eligible and (expr is None or not has_unknown(expr)),
    )


def planned_read(snapshot: Snapshot, operation: Operation | str, predicate: str | Expr | None = None, *,
                 target_alias: str | None = None, reads_whole_table: bool = False) -> Expr | None:
    """``plan_footprint(...).read_predicate`` without listing a file: the partition part of what the job
    reads (``TRUE``: everything; ``None``: a blind write). What a commit check needs of a plan when no
    lease needs the files."""
    op = Operation(operation)
    if not _reads(op):
        return None
    expr = snapshot.bind(predicate, target_alias=target_alias) if predicate is not None else None
    return _read_predicate(op, _partition_part(expr, snapshot), reads_whole_table)


def _partition_part(expr: Expr | None, snapshot: Snapshot) -> Expr:
    """The top-level conjuncts of a bound predicate over partition columns (``TRUE`` without one)."""
    return and_(*partition_conjuncts(expr, snapshot.partition_columns)) if expr is not None else TRUE


def _read_predicate(op: Operation, partition_part: Expr, reads_whole_table: bool) -> Expr | None:
    """What a job records as read: ``None`` for a blind write, ``TRUE`` for a whole-table read."""
    if not _reads(op):
        return None
    return TRUE if reads_whole_table else partition_part


def adds_files(op: Operation) -> bool:
    """Whether the operation's commit adds data files (every one but a change of metadata alone)."""
    return op not in (Operation.SET_PROPERTIES, Operation.SCHEMA_CHANGE, Operation.CREATE_TABLE)


def changes_data(op: Operation) -> bool:
    """Whether the files the operation commits change data (``dataChange``): not a compaction's."""
    return op not in COMPACTIONS and op not in (Operation.SET_PROPERTIES, Operation.SCHEMA_CHANGE)


def _reads(op: Operation) -> bool:
    """Whether the operation reads the table (every one but a blind write and metadata changes)."""
    return op not in (Operation.INSERT, Operation.SET_PROPERTIES, Operation.SCHEMA_CHANGE, Operation.CREATE_TABLE)


def freeze_partition(values: Mapping[str, str | None]) -> tuple[tuple[str, str | None], ...]:
    """Raw partition values as a hashable, order-independent key."""
    return tuple(sorted(values.items()))


def _raw_partition(schema: PartitionSchema, values: Mapping[str, Any]) -> dict[str, str | None]:
    lowered = {k.lower(): v for k, v in values.items()}
    raw: dict[str, str | None] = {}
    for name, physical, data_type in schema.fields:
        if name.lower() not in lowered:
            raise InvalidCommitError(f"write_partitions entry {dict(values)!r} has no value for {name!r}")
        value = lowered[name.lower()]
        raw[physical] = None if value is None else format_partition_value(value, data_type)
    return raw


def enumerate_partitions(expr: Expr, schema: PartitionSchema) -> tuple[Mapping[str, str | None], ...] | None:
    """Every partition (raw values) a partition filter admits, when it pins each column to a few values.

    ``None`` when some column is left open (a range, no condition) or there are more than 4096
    combinations. A table without partition columns has exactly one partition, ``{}``.
    """
    per_column: list[list[Any]] = []
    for name, _, _ in schema.fields:
        values = pinned_values(expr, name)
        if values is None:
            return None
        per_column.append(values)
    combos = list(itertools.islice(itertools.product(*per_column), _MAX_ENUMERATED_PARTITIONS + 1))
    if not combos or len(combos) > _MAX_ENUMERATED_PARTITIONS:
        return None
    return tuple(_raw_partition(schema, dict(zip([n for n, _, _ in schema.fields], c, strict=True)))
                 for c in combos)


def pinned_values(expr: Expr, column: str) -> list[Any] | None:
    """Values ``column`` must take for ``expr`` to hold, from top-level ``=``/``IN``/``OR`` of them; else ``None``."""
    for conjunct in split_conjuncts(expr):
        values = _values_of(conjunct, column)
        if values is not None:
            return values
    return None


def _values_of(expr: Expr, column: str) -> list[Any] | None:
    if isinstance(expr, Comparison) and expr.op == "=":
        for a, b in ((expr.left, expr.right), (expr.right, expr.left)):
            if isinstance(a, Column) and a.name == column and isinstance(b, Lit):
                return [b.value]
    if isinstance(expr, In) and not expr.negated and isinstance(expr.value, Column) and expr.value.name == column:
        if all(isinstance(o, Lit) for o in expr.options):
            return [o.value for o in expr.options if isinstance(o, Lit)]
    if isinstance(expr, Or):
        left, right = _values_of(expr.left, column), _values_of(expr.right, column)
        if left is not None and right is not None:
            return left + right
    if isinstance(expr, And):
        return _values_of(expr.left, column) or _values_of(expr.right, column)
    return None


_FEATURE_FOR_PROPERTY = {
    "delta.enableDeletionVectors": "deletionVectors",
    "delta.enableRowTracking": "rowTracking",
    "delta.enableInCommitTimestamps": "inCommitTimestamp",
    "delta.checkpointPolicy": "v2Checkpoint",
    "delta.columnMapping.mode": "columnMapping",
}


def _planned_metadata(op: Operation, snapshot: Snapshot, properties: Mapping[str, str] | None,
                      ) -> tuple[Metadata | None, Protocol | None]:
    if op is Operation.SET_PROPERTIES:
        props = dict(properties or {})
        metadata = replace(snapshot.metadata, configuration={**snapshot.metadata.configuration, **props})
        needed = {_FEATURE_FOR_PROPERTY[k] for k, v in props.items()
                  if k in _FEATURE_FOR_PROPERTY and v.lower() not in ("false", "none")}
        protocol = None
        if needed and not all(snapshot.protocol.supports(f) for f in needed):
            p = snapshot.protocol
            writer = set(p.writer_features or ()) | needed
            reader = set(p.reader_features or ()) | (needed & {"deletionVectors", "v2Checkpoint", "columnMapping"})
            protocol = Protocol(3, 7, frozenset(reader), frozenset(writer))
        return metadata, protocol
    if op is Operation.SCHEMA_CHANGE:
        schema = json.loads(snapshot.metadata.schema_string)
        schema["fields"] = [*schema["fields"], {"name": "__planned_column__", "type": "string",
                                                "nullable": True, "metadata": {}}]
        return replace(snapshot.metadata, schema_string=json.dumps(schema)), None
    if op is Operation.CREATE_TABLE:
        return snapshot.metadata, snapshot.protocol
    return None, None


# -- verdicts -------------------------------------------------------------------------------------

def can_conflict(a: Footprint, b: Footprint, snapshot: Snapshot | TableState, model: Model = "delta") -> Verdict:
    """Whether ``a`` and ``b`` can conflict in either commit order (what a pool needs).

    ``snapshot`` may be a ``TableState``: verdicts need the table's metadata and protocol, never its files.
    """
    first = verdict(winner=a, loser=b, snapshot=snapshot, model=model)
    second = verdict(winner=b, loser=a, snapshot=snapshot, model=model)
    for v in (first, second):
        if v.conflict:
            return replace(v, orders=(first.reason, second.reason))
    return replace(first, reason=f"{first.reason}; {second.reason}", orders=(first.reason, second.reason))


def verdict(*, winner: Footprint, loser: Footprint, snapshot: Snapshot | TableState, model: Model = "delta"
            ) -> Verdict:
    """Whether ``loser``, committing after ``winner``, fails under ``model``."""
    snapshot = TableState.of(snapshot)
    if model == "delta":
        return _delta_verdict(winner, loser, snapshot, IsolationLevel.SERIALIZABLE, model)
    if model == "databricks":
        return _databricks_verdict(winner, loser, snapshot)
    if model == "maxcompute":
        return _maxcompute_verdict(winner, loser, snapshot)
    raise ValueError(f"unknown conflict model {model!r}; choose one of {', '.join(MODELS)}")


def _synthetic_adds(fp: Footprint) -> tuple[AddFile, ...]:
    """One planned file per partition the job may write (none when it may write anywhere)."""
    if not fp.adds_files or fp.write_partitions is None:
        return ()
    return tuple(AddFile(path=f"<planned {fp.label} file {i}>", partition_values=dict(pv), size=0,
                         modification_time=0, data_change=fp.data_change)
                 for i, pv in enumerate(fp.write_partitions))


def _actions(fp: Footprint, schema: PartitionSchema) -> tuple[Action, ...]:
    actions: list[Action] = [RemoveFile(path=p, data_change=fp.data_change, partition_values=pv)
                             for p, pv in fp.removes.items()]
    if fp.adds_files:
        adds = _synthetic_adds(fp)
        actions.extend(adds or (AddFile("<planned file>", {n: None for _, n, _ in schema.fields}, 0, 0,
                                        fp.data_change),))
    if fp.metadata is not None:
        actions.append(fp.metadata)
    if fp.protocol is not None:
        actions.append(fp.protocol)
    return tuple(actions)


def _delta_verdict(winner: Footprint, loser: Footprint, snapshot: TableState, default: IsolationLevel,
                   model: Model) -> Verdict:
    schema = PartitionSchema.of(snapshot.metadata)
    table_level = table_isolation_level(snapshot.metadata, default)
    loser_actions = _actions(loser, schema)
    read_predicates: tuple[Expr, ...] = (loser.read_predicate,) if loser.read_predicate is not None else ()
    pending = PendingCommit(
        read_version=snapshot.version, partition_schema=schema, read_protocol=snapshot.protocol,
        metadata=snapshot.metadata, protocol=snapshot.protocol, actions=loser_actions,
        operation=DELTA_OPERATION_NAMES[loser.operation], read_predicates=read_predicates,
        read_files=loser.read_files, read_whole_table=loser.read_whole_table, read_app_ids=loser.read_app_ids,
    )
    winner_adds = _synthetic_adds(winner)
    win = WinningCommit(
        version=snapshot.version + 1,
        operation=DELTA_OPERATION_NAMES[winner.operation],
        commit_info={"isBlindAppend": winner.blind_append},
        protocol=winner.protocol,
        metadata=winner.metadata,
        added=winner_adds,
        removed=tuple(RemoveFile(path=p, data_change=winner.data_change, partition_values=pv)
                      for p, pv in winner.removes.items()),
        app_ids=winner.written_app_ids,
        domains=frozenset(),
        adds_anywhere=winner.adds_files and winner.write_partitions is None,
    )
    operation_changes_data = DELTA_OPERATION_NAMES[loser.operation] in DATA_CHANGING_OPERATIONS
    level = isolation_to_use(loser_actions, operation_changes_data, table_level)
    try:
        check_winning_commit(pending, win, level)
    except DeltaConcurrentModificationException as exc:
        return Verdict(True, model, f"{loser.label} after {winner.label}: {_plain(exc)} (checked at {level.value})",
                       exc.kind, loser.label, winner.label)
    return Verdict(False, model, f"{loser.label} can commit after {winner.label} (checked at {level.value})",
                   None, loser.label, winner.label)


def _plain(exc: Exception) -> str:
    text = str(exc)
    return text.split("] ", 1)[1] if text.startswith("[") else text


def _databricks_verdict(winner: Footprint, loser: Footprint, snapshot: TableState) -> Verdict:
    model: Model = "databricks"
    meta = snapshot.metadata
    if "delta.identity." in meta.schema_string:
        return Verdict(True, model, "tables with identity columns admit no concurrent transactions",
                       ConflictKind.TRANSACTION, loser.label, winner.label)
    dv = snapshot.deletion_vectors_enabled
    row_level = dv and not snapshot.partition_columns
    level = table_isolation_level(meta, IsolationLevel.WRITE_SERIALIZABLE)
    plain_optimize = {winner.operation, loser.operation} & {Operation.OPTIMIZE, Operation.MINOR_COMPACT,
                                                            Operation.MAJOR_COMPACT}
    other = loser if winner.operation in COMPACTIONS else winner
    if dv and plain_optimize and other.operation in _DML and Operation.OPTIMIZE_ZORDER not in (
            winner.operation, loser.operation):
        return Verdict(False, model, f"OPTIMIZE without ZORDER BY and {other.label} do not conflict when deletion "
                       "vectors are enabled", None, loser.label, winner.label)
    if row_level and winner.row_level_eligible and loser.row_level_eligible:
        ops = {winner.operation, loser.operation}
        if ops <= _DML:
            return Verdict(True, model, f"row-level concurrency: {loser.label} and {winner.label} conflict if they "
                           "modify the same row, which cannot be known before they run",
                           ConflictKind.APPEND, loser.label, winner.label)
        if winner.operation is Operation.INSERT and loser.operation in _DML:
            if level is IsolationLevel.WRITE_SERIALIZABLE:
                return Verdict(False, model, f"a blind INSERT never conflicts with {loser.label} under "
                               "WriteSerializable", None, loser.label, winner.label)
    return _delta_verdict(winner, loser, snapshot, IsolationLevel.WRITE_SERIALIZABLE, model)


# Seed 003: earlier (winner) kind x later (loser) kind -> later job fails?
_MC_KIND = {
    Operation.OVERWRITE: "OVERWRITE", Operation.REPLACE_WHERE: "OVERWRITE",
    Operation.INSERT: "INSERT", Operation.INSERT_SELF_READ: "INSERT",
    Operation.UPDATE: "DML", Operation.DELETE: "DML", Operation.MERGE: "DML",
    Operation.MINOR_COMPACT: "MINOR", Operation.OPTIMIZE: "MINOR",
    Operation.MAJOR_COMPACT: "MAJOR", Operation.OPTIMIZE_ZORDER: "MAJOR",
}
_MC_LATER_FAILS = {
    ("OVERWRITE", "OVERWRITE"): False, ("OVERWRITE", "INSERT"): True, ("OVERWRITE", "DML"): True,
    ("OVERWRITE", "MINOR"): True, ("OVERWRITE", "MAJOR"): True,
    ("INSERT", "OVERWRITE"): False, ("INSERT", "INSERT"): True, ("INSERT", "DML"): True,
    ("INSERT", "MINOR"): False, ("INSERT", "MAJOR"): True,
    ("DML", "OVERWRITE"): False, ("DML", "INSERT"): True, ("DML", "DML"): True,
    ("DML", "MINOR"): False, ("DML", "MAJOR"): True,
    ("MINOR", "OVERWRITE"): False, ("MINOR", "INSERT"): False, ("MINOR", "DML"): False,
    ("MINOR", "MINOR"): True, ("MINOR", "MAJOR"): False,
    ("MAJOR", "OVERWRITE"): False, ("MAJOR", "INSERT"): False, ("MAJOR", "DML"): False,
    ("MAJOR", "MINOR"): True, ("MAJOR", "MAJOR"): True,
}


def _maxcompute_verdict(winner: Footprint, loser: Footprint, snapshot: TableState) -> Verdict:
    model: Model = "maxcompute"
    w, lo = _MC_KIND.get(winner.operation), _MC_KIND.get(loser.operation)
    if w is None or lo is None:
        return Verdict(True, model, f"{winner.label} / {loser.label}: no MaxCompute rule for this pair; assumed to "
                       "conflict", ConflictKind.WRITE, loser.label, winner.label)
    if snapshot.partition_columns and _partitions_disjoint(winner, loser):
        return Verdict(False, model, f"{winner.label} and {loser.label} touch different partitions", None,
                       loser.label, winner.label)
    if _MC_LATER_FAILS[(w, lo)]:
        return Verdict(True, model, f"{loser.label} ({lo}) committing after {winner.label} ({w}) in the same table "
                       "or partition fails", ConflictKind.WRITE, loser.label, winner.label)
    outcome = "overwrites the earlier result" if lo == "OVERWRITE" else "commits as well"
    return Verdict(False, model, f"{loser.label} ({lo}) after {winner.label} ({w}) {outcome}", None,
                   loser.label, winner.label)


def partition_scoped(fp: Footprint, table: TableState, model: Model) -> bool:
    """Whether ``fp`` can conflict under ``model`` only with jobs that touch a partition it touches.

    False when a rule that ignores partitions may apply to it: a metadata or protocol change, an
    application transaction id, a table with identity columns (``databricks``), an operation the
    ``maxcompute`` rules do not know. Callers that index jobs by partition (a conflict pool's
    arbiter) must compare such a job with every other job of the table.
    """
    if fp.metadata is not None or fp.protocol is not None or fp.read_app_ids or fp.written_app_ids:
        return False
    if model == "databricks" and "delta.identity." in table.metadata.schema_string:
        return False
    return not (model == "maxcompute" and fp.operation not in _MC_KIND)


def _touched(fp: Footprint) -> set[tuple[tuple[str, str | None], ...]] | None:
    """Every partition a job changes, or ``None`` when it may change any."""
    if fp.adds_files and fp.write_partitions is None:
        return None
    return {freeze_partition(pv) for pv in [*fp.removes.values(), *(fp.write_partitions or ())]}


def _partitions_disjoint(a: Footprint, b: Footprint) -> bool:
    ta, tb = _touched(a), _touched(b)
    return ta is not None and tb is not None and not (ta & tb)
