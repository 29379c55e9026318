"""The commit engine: reads Delta transaction logs without Spark or Airflow.

Import purity is a contract (checked by a test): this package depends on the standard library,
pyarrow and numpy only, so the scheduler, triggerer and sensors can all use it. pyarrow and numpy
load only with columnar file state (a checkpoint read, its rows judged as arrays): footprints,
verdicts, conflict checks, expressions and the error tree import without them, which matters for
operators, cluster policies and triggers. The names below load lazily, on first use.

The public surface is small: a table's log and snapshots, engine commits, planning footprints and
their verdicts, the commit-time check, expressions as JSON, and the error tree. Everything else is
imported from its submodule (``from airflow_delta_occ.engine.planner import TableState``).

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

from .errors import (
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

if TYPE_CHECKING:
    from .conflicts import IsolationLevel, check_winning_commit
    from .expr_json import expr_from_json, expr_to_json
    from .planner import Footprint, Operation, Verdict, can_conflict, plan_footprint
    from .snapshot import Commit, DeltaLog, Snapshot
    from .transaction import CommitResult, Transaction

# Public name -> the submodule that defines it (imported on first use).
_LAZY: dict[str, str] = {
    # reading a table
    "DeltaLog": "snapshot",
    "Snapshot": "snapshot",
    "Commit": "snapshot",
    # committing through the engine
    "Transaction": "transaction",
    "CommitResult": "transaction",
    # planning: what a job will touch, and whether two jobs can conflict
    "plan_footprint": "planner",
    "Footprint": "planner",
    "Operation": "planner",
    "can_conflict": "planner",
    "Verdict": "planner",
    # the commit-time check, as delta-spark decides it
    "check_winning_commit": "conflicts",
    "IsolationLevel": "conflicts",
    # expressions as JSON (job specs, leases, trigger arguments)
    "expr_to_json": "expr_json",
    "expr_from_json": "expr_json",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "Commit",
    "CommitError",
    "CommitResult",
    "CommitRetriesExceededError",
    "ConcurrentAppendException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentDeleteReadException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "DeltaConcurrentModificationException",
    "DeltaLog",
    "DeltaOccError",
    "ExpressionDecodeError",
    "FileAlreadyExistsError",
    "Footprint",
    "FootprintDecodeError",
    "InvalidCommitError",
    "InvalidLiteralError",
    "InvalidVersionError",
    "IsolationLevel",
    "LogCorruptError",
    "LogError",
    "MetadataChangedException",
    "Operation",
    "PredicateError",
    "PredicateSyntaxError",
    "ProtocolChangedException",
    "Snapshot",
    "StorageError",
    "TableNotFoundError",
    "Transaction",
    "UnknownColumnError",
    "UnsupportedProtocolError",
    "UnsupportedStorageError",
    "Verdict",
    "VersionNotFoundError",
    "can_conflict",
    "check_winning_commit",
    "expr_from_json",
    "expr_to_json",
    "plan_footprint",
]
