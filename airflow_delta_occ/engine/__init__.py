"""The commit engine: reads Delta transaction logs without Spark or Airflow.

Import purity is a contract (checked by a test): this package depends on the standard library,
pyarrow and numpy only, so the scheduler, triggerer and sensors can all use it. Its names load
lazily: importing a submodule that needs neither (expressions, the SQL parser, errors) does not
load pyarrow or numpy, which matters for operators, cluster policies and triggers.

Example::

    from airflow_delta_occ.engine import DeltaLog

    log = DeltaLog.for_table("/data/sales")
    snapshot = log.snapshot()                       # newest version; snapshot(12) time-travels
    files = snapshot.files_matching("date = '2024-01-01' AND country IN ('DE', 'FR')")
    later = snapshot.update()                       # reads only the new commits
    for commit in log.commits_after(snapshot.version):
        print(commit.version, commit.commit_info.operation if commit.commit_info else None)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .actions import (
        AddCDCFile,
        AddFile,
        CheckpointMetadata,
        CommitInfo,
        DeletionVectorDescriptor,
        DomainMetadata,
        Metadata,
        Protocol,
        RemoveFile,
        SetTransaction,
        Sidecar,
        Version,
    )
    from .conflicts import IsolationLevel, PendingCommit, WinningCommit, check_winning_commit, isolation_to_use
    from .errors import (
        CONFLICT_EXCEPTIONS,
        CommitError,
        CommitRetriesExceededError,
        ConcurrentAppendException,
        ConcurrentDeleteDeleteException,
        ConcurrentDeleteReadException,
        ConcurrentTransactionException,
        ConcurrentWriteException,
        DeltaConcurrentModificationException,
        DeltaOccError,
        ExpressionDecodeError,
        FileAlreadyExistsError,
        FootprintDecodeError,
        InvalidCommitError,
        InvalidLiteralError,
        InvalidVersionError,
        LogCorruptError,
        LogError,
        MetadataChangedException,
        PredicateError,
        PredicateSyntaxError,
        ProtocolChangedException,
        StorageError,
        TableNotFoundError,
        UnknownColumnError,
        UnsupportedProtocolError,
        UnsupportedStorageError,
        VersionNotFoundError,
    )
    from .expr_json import expr_from_json, expr_to_json
    from .object_store import (
        AzureCredentials,
        GcsCredentials,
        S3Credentials,
        StorageCredentials,
        StoreKind,
        TableLocation,
        parse_table_uri,
        store_scheme,
    )
    from .schema import ArrayType, DataType, DecimalType, MapType, PrimitiveType, StructField, StructType
    from .snapshot import SUPPORTED_READER_FEATURES, Commit, DeltaLog, Snapshot
    from .storage import FileMeta, LocalStorage, PyArrowStorage, Storage
    from .transaction import CommitResult, Transaction

# Public name -> the submodule that defines it (imported on first use).
_LAZY: dict[str, str] = {
    "AddCDCFile": "actions",
    "AddFile": "actions",
    "ArrayType": "schema",
    "AzureCredentials": "object_store",
    "CONFLICT_EXCEPTIONS": "errors",
    "CheckpointMetadata": "actions",
    "Commit": "snapshot",
    "CommitError": "errors",
    "CommitInfo": "actions",
    "CommitResult": "transaction",
    "CommitRetriesExceededError": "errors",
    "ConcurrentAppendException": "errors",
    "ConcurrentDeleteDeleteException": "errors",
    "ConcurrentDeleteReadException": "errors",
    "ConcurrentTransactionException": "errors",
    "ConcurrentWriteException": "errors",
    "DataType": "schema",
    "DecimalType": "schema",
    "DeletionVectorDescriptor": "actions",
    "DeltaConcurrentModificationException": "errors",
    "DeltaLog": "snapshot",
    "DeltaOccError": "errors",
    "DomainMetadata": "actions",
    "ExpressionDecodeError": "errors",
    "FileAlreadyExistsError": "errors",
    "FileMeta": "storage",
    "FootprintDecodeError": "errors",
    "GcsCredentials": "object_store",
    "InvalidCommitError": "errors",
    "InvalidLiteralError": "errors",
    "InvalidVersionError": "errors",
    "IsolationLevel": "conflicts",
    "LocalStorage": "storage",
    "LogCorruptError": "errors",
    "LogError": "errors",
    "MapType": "schema",
    "Metadata": "actions",
    "MetadataChangedException": "errors",
    "PendingCommit": "conflicts",
    "PredicateError": "errors",
    "PredicateSyntaxError": "errors",
    "PrimitiveType": "schema",
    "Protocol": "actions",
    "ProtocolChangedException": "errors",
    "PyArrowStorage": "storage",
    "RemoveFile": "actions",
    "S3Credentials": "object_store",
    "SUPPORTED_READER_FEATURES": "snapshot",
    "SetTransaction": "actions",
    "Sidecar": "actions",
    "Snapshot": "snapshot",
    "Storage": "storage",
    "StorageCredentials": "object_store",
    "StorageError": "errors",
    "StoreKind": "object_store",
    "StructField": "schema",
    "StructType": "schema",
    "TableLocation": "object_store",
    "TableNotFoundError": "errors",
    "Transaction": "transaction",
    "UnknownColumnError": "errors",
    "UnsupportedProtocolError": "errors",
    "UnsupportedStorageError": "errors",
    "Version": "actions",
    "VersionNotFoundError": "errors",
    "WinningCommit": "conflicts",
    "check_winning_commit": "conflicts",
    "expr_from_json": "expr_json",
    "expr_to_json": "expr_json",
    "isolation_to_use": "conflicts",
    "parse_table_uri": "object_store",
    "store_scheme": "object_store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "CONFLICT_EXCEPTIONS",
    "SUPPORTED_READER_FEATURES",
    "AddCDCFile",
    "AddFile",
    "ArrayType",
    "AzureCredentials",
    "CheckpointMetadata",
    "Commit",
    "CommitError",
    "CommitInfo",
    "CommitResult",
    "CommitRetriesExceededError",
    "ConcurrentAppendException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentDeleteReadException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "DataType",
    "DecimalType",
    "DeletionVectorDescriptor",
    "DeltaConcurrentModificationException",
    "DeltaLog",
    "DeltaOccError",
    "DomainMetadata",
    "ExpressionDecodeError",
    "FileAlreadyExistsError",
    "FileMeta",
    "FootprintDecodeError",
    "GcsCredentials",
    "InvalidCommitError",
    "InvalidLiteralError",
    "InvalidVersionError",
    "IsolationLevel",
    "LocalStorage",
    "LogCorruptError",
    "LogError",
    "MapType",
    "Metadata",
    "MetadataChangedException",
    "PendingCommit",
    "PredicateError",
    "PredicateSyntaxError",
    "PrimitiveType",
    "Protocol",
    "ProtocolChangedException",
    "PyArrowStorage",
    "RemoveFile",
    "S3Credentials",
    "SetTransaction",
    "Sidecar",
    "Snapshot",
    "Storage",
    "StorageCredentials",
    "StorageError",
    "StoreKind",
    "StructField",
    "StructType",
    "TableLocation",
    "TableNotFoundError",
    "Transaction",
    "UnknownColumnError",
    "UnsupportedProtocolError",
    "UnsupportedStorageError",
    "Version",
    "VersionNotFoundError",
    "WinningCommit",
    "check_winning_commit",
    "expr_from_json",
    "expr_to_json",
    "isolation_to_use",
    "parse_table_uri",
    "store_scheme",
]
