"""Delta log actions as frozen dataclasses, parsed from JSON commit lines and checkpoint rows.

One parser serves both sources: a checkpoint row converted with pyarrow's ``to_pylist`` has the
same field names as a JSON action, except that maps arrive as lists of ``(key, value)`` pairs.
Fields the engine does not know are ignored, as the protocol asks of readers; the original
dictionary stays available as ``raw`` on the actions whose payload is passed on to users.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
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


def _as_map(value: Any) -> dict[str, Any]:
    """Maps come as dicts from JSON and as lists of pairs from Parquet checkpoints."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, list):
        return {k: v for k, v in value}
    raise TypeError(f"expected a map, got {type(value).__name__}")


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
            storage_type=str(d["storageType"]),
            path_or_inline_dv=str(d["pathOrInlineDv"]),
            size_in_bytes=int(d["sizeInBytes"]),
            cardinality=int(d["cardinality"]),
            offset=_opt_int(d.get("offset")),
            max_row_index=_opt_int(d.get("maxRowIndex")),
        )


def _dv(value: Any) -> DeletionVectorDescriptor | None:
    return None if value is None else DeletionVectorDescriptor.from_dict(value)


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
    tags: Mapping[str, str] | None = None
    deletion_vector: DeletionVectorDescriptor | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None
    clustering_provider: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return file_key(self.path, self.deletion_vector)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AddFile:
        tags = d.get("tags")
        return cls(
            path=str(d["path"]),
            partition_values=_as_map(d.get("partitionValues")),
            size=int(d.get("size") or 0),
            modification_time=int(d.get("modificationTime") or 0),
            data_change=bool(d.get("dataChange", True)),
            stats=d.get("stats"),
            tags=_as_map(tags) if tags is not None else None,
            deletion_vector=_dv(d.get("deletionVector")),
            base_row_id=_opt_int(d.get("baseRowId")),
            default_row_commit_version=_opt_int(d.get("defaultRowCommitVersion")),
            clustering_provider=d.get("clusteringProvider"),
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
        pv = d.get("partitionValues")
        return cls(
            path=str(d["path"]),
            data_change=bool(d.get("dataChange", True)),
            deletion_timestamp=_opt_int(d.get("deletionTimestamp")),
            partition_values=_as_map(pv) if pv is not None else None,
            size=_opt_int(d.get("size")),
            deletion_vector=_dv(d.get("deletionVector")),
            extended_file_metadata=d.get("extendedFileMetadata"),
            base_row_id=_opt_int(d.get("baseRowId")),
            default_row_commit_version=_opt_int(d.get("defaultRowCommitVersion")),
        )


@dataclass(frozen=True, slots=True)
class AddCDCFile:
    """A change data file; never part of the table's data, ignored by reconciliation."""

    path: str
    partition_values: Mapping[str, str | None]
    size: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AddCDCFile:
        return cls(str(d["path"]), _as_map(d.get("partitionValues")), int(d.get("size") or 0))


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
    format_options: Mapping[str, str] = field(default_factory=dict)
    created_time: int | None = None

    @cached_property
    def schema(self) -> StructType:
        return parse_schema(self.schema_string)

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
        fmt = d.get("format") or {}
        return cls(
            id=str(d["id"]),
            schema_string=str(d["schemaString"]),
            partition_columns=tuple(d.get("partitionColumns") or ()),
            configuration=_as_map(d.get("configuration")),
            name=d.get("name"),
            description=d.get("description"),
            format_provider=str(fmt.get("provider", "parquet")),
            format_options=_as_map(fmt.get("options")),
            created_time=_opt_int(d.get("createdTime")),
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
        rf = d.get("readerFeatures")
        wf = d.get("writerFeatures")
        return cls(
            min_reader_version=int(d["minReaderVersion"]),
            min_writer_version=int(d["minWriterVersion"]),
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
        return cls(str(d["appId"]), int(d["version"]), _opt_int(d.get("lastUpdated")))


@dataclass(frozen=True, slots=True)
class DomainMetadata:
    domain: str
    configuration: str
    removed: bool

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DomainMetadata:
        return cls(str(d["domain"]), str(d.get("configuration") or ""), bool(d.get("removed", False)))


@dataclass(frozen=True)
class CommitInfo:
    """Provenance of one commit. Every field is optional in the protocol; ``raw`` keeps the rest."""

    raw: Mapping[str, Any]

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
        return cls(str(d["path"]), int(d.get("sizeInBytes") or 0))


@dataclass(frozen=True, slots=True)
class CheckpointMetadata:
    version: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CheckpointMetadata:
        return cls(int(d["version"]))


Action = (
    AddFile | RemoveFile | AddCDCFile | Metadata | Protocol | SetTransaction | DomainMetadata | CommitInfo
    | Sidecar | CheckpointMetadata
)

_PARSERS: dict[str, Any] = {
    ADD: AddFile.from_dict,
    REMOVE: RemoveFile.from_dict,
    CDC: AddCDCFile.from_dict,
    METADATA: Metadata.from_dict,
    PROTOCOL: Protocol.from_dict,
    SET_TRANSACTION: SetTransaction.from_dict,
    DOMAIN_METADATA: DomainMetadata.from_dict,
    COMMIT_INFO: CommitInfo,
    SIDECAR: Sidecar.from_dict,
    CHECKPOINT_METADATA: CheckpointMetadata.from_dict,
}


def parse_action(kind: str, payload: Any) -> Action | None:
    """Build one action from its wire name and payload; unknown kinds are skipped (forward compatible).

    Raises:
        KeyError, TypeError, ValueError: a required field is missing or has the wrong type.
    """
    parser = _PARSERS.get(kind)
    if parser is None or payload is None:
        return None
    action: Action = parser(payload)
    return action


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
        except ValueError as exc:
            raise LogCorruptError(f"invalid JSON in log file: {exc.args[0]}", path=path, line=lineno) from exc
        if not isinstance(obj, dict) or len(obj) == 0:
            raise LogCorruptError("a log line must be a JSON object with one action", path=path, line=lineno)
        for kind, payload in obj.items():
            try:
                action = parse_action(kind, payload)
            except (KeyError, TypeError, ValueError) as exc:
                raise LogCorruptError(
                    f"malformed {kind!r} action ({type(exc).__name__}: {exc})", path=path, line=lineno
                ) from exc
            if action is not None:
                actions.append(action)
    return actions
