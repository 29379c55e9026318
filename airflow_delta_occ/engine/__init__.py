"""The commit engine: reads Delta transaction logs without Spark or Airflow.

Import purity is a contract (checked by a test): this package depends on the standard library,
pyarrow and numpy only, so the scheduler, triggerer and sensors can all use it.

Example::

    from airflow_delta_occ.engine import DeltaLog

    log = DeltaLog.for_table("/data/sales")
    snapshot = log.snapshot()                       # newest version; snapshot(12) time-travels
    files = snapshot.files_matching("date = '2024-01-01' AND country IN ('DE', 'FR')")
    later = snapshot.update()                       # reads only the new commits
    for commit in log.commits_after(snapshot.version):
        print(commit.version, commit.commit_info.operation if commit.commit_info else None)
"""

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
    VersionNotFoundError,
)
from .expr_json import expr_from_json, expr_to_json
from .schema import ArrayType, DataType, DecimalType, MapType, PrimitiveType, StructField, StructType
from .snapshot import SUPPORTED_READER_FEATURES, Commit, DeltaLog, Snapshot
from .storage import FileMeta, LocalStorage, PyArrowStorage, Storage
from .transaction import CommitResult, Transaction

__all__ = [
    "CONFLICT_EXCEPTIONS",
    "SUPPORTED_READER_FEATURES",
    "AddCDCFile",
    "AddFile",
    "ArrayType",
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
    "InvalidCommitError",
    "InvalidLiteralError",
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
    "SetTransaction",
    "Sidecar",
    "Snapshot",
    "Storage",
    "StorageError",
    "StructField",
    "StructType",
    "TableNotFoundError",
    "Transaction",
    "UnknownColumnError",
    "UnsupportedProtocolError",
    "Version",
    "VersionNotFoundError",
    "WinningCommit",
    "check_winning_commit",
    "expr_from_json",
    "expr_to_json",
    "isolation_to_use",
]
