"""Delta log actions as frozen dataclasses, parsed from JSON commit lines and checkpoint rows.

One parser serves both sources: a checkpoint row converted with pyarrow's
``to_pylist(maps_as_pydicts="strict")`` has the same shape as a JSON action. Every field the
engine reads is checked (JSON type, non-negative 64-bit integers, strings in maps) and a defect is a
``MalformedActionError``, which ``decode_action`` turns into a ``LogCorruptError`` naming the file
and line. Fields the engine does not know are ignored, as the protocol asks of readers; the original
dictionary stays available as ``raw`` on the actions whose payload is passed on to users.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from .errors import LogCorruptError
from .schema import StructType, parse_schema

Version = int

# Wire names of the actions, as they appear as the single key of a JSON line.
ADD = "add"
REMOVE = "remove"
METADATA = "metaData"
PROTOCOL = "protocol"
COMMIT_INFO = "commitInfo"
SET_TRANSACTION = "txn"
DOMAIN_METADATA = "domainMetadata"
CDC = "cdc"
SIDECAR = "sidecar"
CHECKPOINT_METADATA = "checkpointMetadata"

ISOLATION_LEVEL_KEY = "delta.isolationLevel"
DEFAULT_ISOLATION_LEVEL = "WriteSerializable"


INT64_MAX = 2**63 - 1


class MalformedActionError(ValueError):
    """A field of an action is missing, of the wrong JSON type or out of range.

    Raised by the ``from_dict`` parsers; the callers turn it into a ``LogCorruptError`` naming the
    file (and line) the action came from.
    """


def _type_name(value: Any) -> str:
    names = {dict: "an object", list: "an array", tuple: "an array", str: "a string", bool: "a boolean",
             int: "an integer", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _object(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise MalformedActionError(f"{what} must be an object, got {_type_name(value)}")
    return value


def _check_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise MalformedActionError(f"{what} must be a string, got {_type_name(value)}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise MalformedActionError(f"{what} is not valid Unicode (lone surrogate)") from None
    return value


def _str(d: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = d.get(key)
    if value is None:
        if default is None:
            raise MalformedActionError(f"required field {key!r} is missing")
        return default
    return _check_str(value, repr(key))


def _opt_str(d: Mapping[str, Any], key: str) -> str | None:
    value = d.get(key)
    return None if value is None else _check_str(value, repr(key))


def _long(d: Mapping[str, Any], key: str, default: int | None = None) -> int:
    """A non-negative 64-bit integer (sizes, versions, times); JSON booleans and fractions are refused."""
    value = d.get(key)
    if value is None:
        if default is None:
            raise MalformedActionError(f"required field {key!r} is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedActionError(f"{key!r} must be an integer, got {_type_name(value)}")
    if not 0 <= value <= INT64_MAX:
        raise MalformedActionError(f"{key!r} must be between 0 and 2^63-1, got {value}")
    return value


def _opt_long(d: Mapping[str, Any], key: str) -> int | None:
    return None if d.get(key) is None else _long(d, key)


def _opt_bool(d: Mapping[str, Any], key: str) -> bool | None:
    value = d.get(key)
    if value is not None and not isinstance(value, bool):
        raise MalformedActionError(f"{key!r} must be a boolean, got {_type_name(value)}")
    return value


def _bool(d: Mapping[str, Any], key: str, default: bool) -> bool:
    value = _opt_bool(d, key)
    return default if value is None else value


def _str_list(d: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise MalformedActionError(f"{key!r} must be an array of strings, got {_type_name(value)}")
    return tuple(_check_str(item, f"an element of {key!r}") for item in value)


def _str_map(d: Mapping[str, Any], key: str, *, null_values: bool = False) -> dict[str, Any] | None:
    """A map of strings (with ``null_values``, values may be null)."""
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise MalformedActionError(f"{key!r} must be an object of strings, got {_type_name(value)}")
    for k, v in value.items():
        _check_str(k, f"a key of {key!r}")
        if v is not None or not null_values:
            _check_str(v, f"{key}[{k!r}]")
    return value


def _json_map(d: Mapping[str, Any], key: str) -> None:
    """A free-form object (commitInfo's operationParameters, operationMetrics)."""
    value = d.get(key)
    if value is not None and not isinstance(value, dict):
        raise MalformedActionError(f"{key!r} must be an object, got {_type_name(value)}")


def _as_map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True, slots=True)
class DeletionVectorDescriptor:
    """Where a file's deletion vector lives; ``unique_id`` is part of a logical file's identity."""

    storage_type: str
    path_or_inline_dv: str
    size_in_bytes: int
    cardinality: int
    offset: int | None = None
    max_row_index: int | None = None

    @property
    def unique_id(self) -> str:
        base = f"{self.storage_type}{self.path_or_inline_dv}"
        return base if self.offset is None else f"{base}@{self.offset}"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeletionVectorDescriptor:
        return cls(
            storage_type=_str(d, "storageType"),
            path_or_inline_dv=_str(d, "pathOrInlineDv"),
            size_in_bytes=_long(d, "sizeInBytes"),
            cardinality=_long(d, "cardinality"),
            offset=_opt_long(d, "offset"),
            max_row_index=_opt_long(d, "maxRowIndex"),
        )


def _dv(d: Mapping[str, Any]) -> DeletionVectorDescriptor | None:
    value = d.get("deletionVector")
    return None if value is None else DeletionVectorDescriptor.from_dict(_object(value, "'deletionVector'"))


#: A logical file's identity in the log: its path and its deletion vector's unique id ("" without one).
FileKey = tuple[str, str]


def file_key(path: str, dv: DeletionVectorDescriptor | None) -> tuple[str, str]:
    """Logical file identity in action reconciliation: the path plus the deletion vector id."""
    return (path, dv.unique_id if dv is not None else "")


@dataclass(frozen=True, slots=True)
class AddFile:
    """A data file that is part of the table (``partition_values`` hold the serialized strings)."""

    path: str
    partition_values: Mapping[str, str | None]
    size: int
    modification_time: int
    data_change: bool
    stats: str | None = None
    tags: Mapping[str, str | None] | None = None
    deletion_vector: DeletionVectorDescriptor | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None
    clustering_provider: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return file_key(self.path, self.deletion_vector)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AddFile:
        return cls(
            path=_str(d, "path"),
            partition_values=_str_map(d, "partitionValues", null_values=True) or {},
            size=_long(d, "size", 0),
            modification_time=_long(d, "modificationTime", 0),
            data_change=_bool(d, "dataChange", True),
            stats=_opt_str(d, "stats"),
            tags=_str_map(d, "tags", null_values=True),
            deletion_vector=_dv(d),
            base_row_id=_opt_long(d, "baseRowId"),
            default_row_commit_version=_opt_long(d, "defaultRowCommitVersion"),
            clustering_provider=_opt_str(d, "clusteringProvider"),
        )


@dataclass(frozen=True, slots=True)
class RemoveFile:
    """A logical file removed from the table (a tombstone until VACUUM)."""

    path: str
    data_change: bool
    deletion_timestamp: int | None = None
    partition_values: Mapping[str, str | None] | None = None
    size: int | None = None
    deletion_vector: DeletionVectorDescriptor | None = None
    extended_file_metadata: bool | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        return file_key(self.path, self.deletion_vector)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RemoveFile:
        return cls(
            path=_str(d, "path"),
            data_change=_bool(d, "dataChange", True),
            deletion_timestamp=_opt_long(d, "deletionTimestamp"),
            partition_values=_str_map(d, "partitionValues", null_values=True),
            size=_opt_long(d, "size"),
            deletion_vector=_dv(d),
            extended_file_metadata=_opt_bool(d, "extendedFileMetadata"),
            base_row_id=_opt_long(d, "baseRowId"),
            default_row_commit_version=_opt_long(d, "defaultRowCommitVersion"),
        )


@dataclass(frozen=True, slots=True)
class AddCDCFile:
    """A change data file; never part of the table's data, ignored by reconciliation."""

    path: str
    partition_values: Mapping[str, str | None]
    size: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AddCDCFile:
        return cls(_str(d, "path"), _str_map(d, "partitionValues", null_values=True) or {}, _long(d, "size", 0))


@dataclass(frozen=True)
class Metadata:
    """The table's ``metaData`` action: schema, partitioning and table properties."""

    id: str
    schema_string: str
    partition_columns: tuple[str, ...]
    configuration: Mapping[str, str]
    name: str | None = None
    description: str | None = None
    format_provider: str = "parquet"
    format_options: Mapping[str, str | None] = field(default_factory=dict)
    created_time: int | None = None
    #: The log file (and line of a JSON file) the action was read from, named by schema errors.
    source: str | None = field(default=None, compare=False, repr=False)
    source_line: int | None = field(default=None, compare=False, repr=False)

    @cached_property
    def schema(self) -> StructType:
        try:
            return parse_schema(self.schema_string)
        except LogCorruptError as exc:
            if exc.path is not None or self.source is None:
                raise
            raise LogCorruptError(f"metaData action: {exc}", path=self.source, line=self.source_line) from exc

    @property
    def isolation_level(self) -> str:
        """The table's declared level; absent means the provider's default, WriteSerializable.

        OSS delta-spark treats an absent property as Serializable; the commit engine's conflict
        model (not this reader) decides which default applies to which engine.
        """
        return self.configuration.get(ISOLATION_LEVEL_KEY, DEFAULT_ISOLATION_LEVEL)

    @property
    def deletion_vectors_enabled(self) -> bool:
        return self.configuration.get("delta.enableDeletionVectors", "false").lower() == "true"

    @property
    def row_tracking_enabled(self) -> bool:
        return self.configuration.get("delta.enableRowTracking", "false").lower() == "true"

    @property
    def column_mapping_mode(self) -> str:
        return self.configuration.get("delta.columnMapping.mode", "none")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Metadata:
        fmt = d.get("format")
        fmt = {} if fmt is None else _object(fmt, "'format'")
        return cls(
            id=_str(d, "id"),
            schema_string=_str(d, "schemaString"),
            partition_columns=_str_list(d, "partitionColumns") or (),
            configuration=_str_map(d, "configuration") or {},
            name=_opt_str(d, "name"),
            description=_opt_str(d, "description"),
            format_provider=_str(fmt, "provider", "parquet"),
            format_options=_str_map(fmt, "options", null_values=True) or {},
            created_time=_opt_long(d, "createdTime"),
        )


@dataclass(frozen=True, slots=True)
class Protocol:
    """Reader/writer versions and, from reader 3 / writer 7 on, explicit feature lists."""

    min_reader_version: int
    min_writer_version: int
    reader_features: frozenset[str] | None = None
    writer_features: frozenset[str] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Protocol:
        rf = _str_list(d, "readerFeatures")
        wf = _str_list(d, "writerFeatures")
        return cls(
            min_reader_version=_long(d, "minReaderVersion"),
            min_writer_version=_long(d, "minWriterVersion"),
            reader_features=frozenset(rf) if rf is not None else None,
            writer_features=frozenset(wf) if wf is not None else None,
        )

    def supports(self, feature: str) -> bool:
        """Whether a table feature is active (explicit list, or implied by a legacy version)."""
        features = (self.reader_features or frozenset()) | (self.writer_features or frozenset())
        if feature in features:
            return True
        if self.writer_features is not None:
            return False
        legacy = {"appendOnly": 2, "invariants": 2, "checkConstraints": 3, "changeDataFeed": 4,
                  "generatedColumns": 4, "columnMapping": 5, "identityColumns": 6}
        needed = legacy.get(feature)
        return needed is not None and self.min_writer_version >= needed


@dataclass(frozen=True, slots=True)
class SetTransaction:
    """An application's idempotency marker: the last ``version`` committed by ``app_id``."""

    app_id: str
    version: int
    last_updated: int | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SetTransaction:
        return cls(_str(d, "appId"), _long(d, "version"), _opt_long(d, "lastUpdated"))


@dataclass(frozen=True, slots=True)
class DomainMetadata:
    domain: str
    configuration: str
    removed: bool

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DomainMetadata:
        return cls(_str(d, "domain"), _str(d, "configuration", ""), _bool(d, "removed", False))


@dataclass(frozen=True)
class CommitInfo:
    """Provenance of one commit. Every field is optional in the protocol; ``raw`` keeps the rest."""

    raw: Mapping[str, Any]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CommitInfo:
        """Check the fields the properties below read; the rest stays as written, in ``raw``."""
        for key in ("timestamp", "inCommitTimestamp", "readVersion"):
            _opt_long(d, key)
        for key in ("operation", "isolationLevel", "userMetadata", "txnId"):
            _opt_str(d, key)
        _opt_bool(d, "isBlindAppend")
        for key in ("operationParameters", "operationMetrics"):
            _json_map(d, key)
        _str_map(d, "tags", null_values=True)
        return cls(d)

    @property
    def timestamp(self) -> int | None:
        return _opt_int(self.raw.get("timestamp"))

    @property
    def in_commit_timestamp(self) -> int | None:
        return _opt_int(self.raw.get("inCommitTimestamp"))

    @property
    def operation(self) -> str | None:
        return self.raw.get("operation")

    @property
    def operation_parameters(self) -> Mapping[str, Any]:
        return _as_map(self.raw.get("operationParameters"))

    @property
    def operation_metrics(self) -> Mapping[str, Any]:
        return _as_map(self.raw.get("operationMetrics"))

    @property
    def read_version(self) -> int | None:
        return _opt_int(self.raw.get("readVersion"))

    @property
    def isolation_level(self) -> str | None:
        return self.raw.get("isolationLevel")

    @property
    def is_blind_append(self) -> bool | None:
        value = self.raw.get("isBlindAppend")
        return None if value is None else bool(value)

    @property
    def user_metadata(self) -> str | None:
        return self.raw.get("userMetadata")

    @property
    def txn_id(self) -> str | None:
        return self.raw.get("txnId")

    @property
    def tags(self) -> Mapping[str, str]:
        return _as_map(self.raw.get("tags"))


@dataclass(frozen=True, slots=True)
class Sidecar:
    """A V2 checkpoint's pointer to a Parquet file (under ``_delta_log/_sidecars``) of file actions."""

    path: str
    size_in_bytes: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Sidecar:
        path = _str(d, "path")
        if "\x00" in path:  # the engine opens this file: no store's file name can hold a NUL
            raise MalformedActionError(f"'path' holds a NUL character: {path!r}")
        return cls(path, _long(d, "sizeInBytes", 0))


@dataclass(frozen=True, slots=True)
class CheckpointMetadata:
    version: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CheckpointMetadata:
        return cls(_long(d, "version"))


Action = (
    AddFile | RemoveFile | AddCDCFile | Metadata | Protocol | SetTransaction | DomainMetadata | CommitInfo
    | Sidecar | CheckpointMetadata
)

_PARSERS: dict[str, Callable[[Mapping[str, Any]], Action]] = {
    ADD: AddFile.from_dict,
    REMOVE: RemoveFile.from_dict,
    CDC: AddCDCFile.from_dict,
    METADATA: Metadata.from_dict,
    PROTOCOL: Protocol.from_dict,
    SET_TRANSACTION: SetTransaction.from_dict,
    DOMAIN_METADATA: DomainMetadata.from_dict,
    COMMIT_INFO: CommitInfo.from_dict,
    SIDECAR: Sidecar.from_dict,
    CHECKPOINT_METADATA: CheckpointMetadata.from_dict,
}


def parse_action(kind: str, payload: Any, *, path: str | None = None, line: int | None = None) -> Action | None:
    """Build one action from its wire name and payload; unknown kinds are skipped (forward compatible).

    ``path`` and ``line`` say where the action was read; a ``Metadata`` keeps them for schema errors.

    Raises:
        MalformedActionError: a required field is missing, or a field has the wrong type or range.
    """
    parser = _PARSERS.get(kind)
    if parser is None or payload is None:
        return None
    action = parser(_object(payload, "the action"))
    if isinstance(action, Metadata) and path is not None:
        action = replace(action, source=path, source_line=line)
    return action


def decode_action(kind: str, payload: Any, path: str, line: int | None = None) -> Action | None:
    """``parse_action`` for an action read from a log file: a defect is a ``LogCorruptError`` naming it."""
    try:
        return parse_action(kind, payload, path=path, line=line)
    except MalformedActionError as exc:
        raise LogCorruptError(f"malformed {kind!r} action: {exc}", path=path, line=line) from exc
    except (KeyError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        # Last line of defence: the parsers check each field they read, so this means a bug.
        raise LogCorruptError(
            f"malformed {kind!r} action ({type(exc).__name__}: {exc})", path=path, line=line
        ) from exc


def parse_json_actions(data: bytes, path: str) -> list[Action]:
    """Parse a newline-delimited JSON log file; a bad line is a ``LogCorruptError`` naming file and line."""
    actions: list[Action] = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LogCorruptError(f"log file is not UTF-8 text: {exc}", path=path) from exc
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except RecursionError as exc:
            raise LogCorruptError("log line is nested too deeply to decode", path=path, line=lineno) from exc
        except ValueError as exc:
            raise LogCorruptError(f"invalid JSON in log file: {exc.args[0]}", path=path, line=lineno) from exc
        if not isinstance(obj, dict) or len(obj) == 0:
            got = "an empty object" if isinstance(obj, dict) else _type_name(obj)
            raise LogCorruptError(f"a log line must be a JSON object with one action, got {got}",
                                  path=path, line=lineno)
        for kind, payload in obj.items():
            action = decode_action(kind, payload, path, lineno)
            if action is not None:
                actions.append(action)
    return actions
