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
from .errors import (
    DeltaOccError,
    FileAlreadyExistsError,
    InvalidLiteralError,
    LogCorruptError,
    LogError,
    PredicateError,
    PredicateSyntaxError,
    StorageError,
    TableNotFoundError,
    UnknownColumnError,
    UnsupportedProtocolError,
    VersionNotFoundError,
)
from .schema import ArrayType, DataType, DecimalType, MapType, PrimitiveType, StructField, StructType
from .snapshot import SUPPORTED_READER_FEATURES, Commit, DeltaLog, Snapshot
from .storage import FileMeta, LocalStorage, PyArrowStorage, Storage

__all__ = [
    "SUPPORTED_READER_FEATURES",
    "AddCDCFile",
    "AddFile",
    "ArrayType",
    "CheckpointMetadata",
    "Commit",
    "CommitInfo",
    "DataType",
    "DecimalType",
    "DeletionVectorDescriptor",
    "DeltaLog",
    "DeltaOccError",
    "DomainMetadata",
    "FileAlreadyExistsError",
    "FileMeta",
    "InvalidLiteralError",
    "LocalStorage",
    "LogCorruptError",
    "LogError",
    "MapType",
    "Metadata",
    "PredicateError",
    "PredicateSyntaxError",
    "PrimitiveType",
    "Protocol",
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
    "UnknownColumnError",
    "UnsupportedProtocolError",
    "Version",
    "VersionNotFoundError",
]
