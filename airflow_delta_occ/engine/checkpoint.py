"""Read checkpoints (classic, multi-part, V2 with sidecars) into an Arrow column of live adds.

Add actions stay in Arrow: a checkpoint of 100,000 files turns into Python objects only for the
files a caller asks for, which is what keeps a full snapshot load in the same range as delta-rs.
Remove tombstones are skipped: they matter for VACUUM, not for the files a job reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .actions import ADD, Action, AddFile, Sidecar, parse_action, parse_json_actions
from .errors import LogCorruptError
from .log_segment import LOG_DIR, SIDECARS_DIR, Checkpoint
from .storage import Storage

_NON_FILE_COLUMNS = ("metaData", "protocol", "txn", "domainMetadata", "checkpointMetadata", "sidecar")


@dataclass
class CheckpointContent:
    """Live adds as one Arrow struct column plus the other actions as Python objects."""

    adds: pa.ChunkedArray | None
    inline_adds: list[AddFile]
    actions: list[Action]


def read_checkpoint(storage: Storage, table_root: str, checkpoint: Checkpoint) -> CheckpointContent:
    """Read every file of a checkpoint; a missing or unreadable part is a ``LogCorruptError``."""
    add_chunks: list[pa.ChunkedArray] = []
    inline_adds: list[AddFile] = []
    actions: list[Action] = []
    for meta in checkpoint.files:
        if meta.name.endswith(".json"):
            for action in parse_json_actions(_read(storage, meta.path), meta.path):
                if isinstance(action, AddFile):
                    inline_adds.append(action)
                else:
                    actions.append(action)
        else:
            adds, others = _read_parquet_actions(storage, meta.path)
            if adds is not None:
                add_chunks.append(adds)
            actions.extend(others)
    for sidecar in [a for a in actions if isinstance(a, Sidecar)]:
        path = storage.join(table_root, LOG_DIR, SIDECARS_DIR, sidecar.path.rsplit("/", 1)[-1])
        adds, others = _read_parquet_actions(storage, path, what=f"sidecar of checkpoint {checkpoint.version}")
        if adds is not None:
            add_chunks.append(adds)
        actions.extend(a for a in others if not isinstance(a, Sidecar))
    actions = [a for a in actions if not isinstance(a, Sidecar)]
    return CheckpointContent(_concat(add_chunks), inline_adds, actions)


def _read(storage: Storage, path: str) -> bytes:
    try:
        return storage.read_bytes(path)
    except FileNotFoundError as exc:
        raise LogCorruptError("checkpoint file is missing", path=path) from exc


def _read_parquet_actions(
    storage: Storage, path: str, *, what: str = "checkpoint"
) -> tuple[pa.ChunkedArray | None, list[Action]]:
    try:
        with storage.open_input(path) as stream:
            parquet = pq.ParquetFile(stream)
            names = set(parquet.schema_arrow.names)
            columns = [c for c in (ADD, *_NON_FILE_COLUMNS) if c in names]
            table = parquet.read(columns=columns)
    except FileNotFoundError as exc:
        raise LogCorruptError(f"{what} file is missing", path=path) from exc
    except (OSError, pa.ArrowException) as exc:
        raise LogCorruptError(f"{what} file cannot be read as Parquet: {exc}", path=path) from exc
    adds = None
    if ADD in names:
        column = table.column(ADD)
        adds = column.filter(pc.is_valid(column))
    actions: list[Action] = []
    for name in _NON_FILE_COLUMNS:
        if name not in names:
            continue
        column = table.column(name)
        for payload in column.filter(pc.is_valid(column)).to_pylist():
            try:
                action = parse_action(name, payload)
            except (KeyError, TypeError, ValueError) as exc:
                raise LogCorruptError(f"malformed {name!r} action in {what}: {exc}", path=path) from exc
            if action is not None:
                actions.append(action)
    return adds, actions


def _concat(chunks: list[pa.ChunkedArray]) -> pa.ChunkedArray | None:
    chunks = [c for c in chunks if len(c) > 0]
    if not chunks:
        return None
    if len(chunks) == 1:
        return chunks[0]
    # Parts written by different writers may differ in optional fields: unify before joining.
    try:
        return pa.chunked_array([chunk for c in chunks for chunk in c.chunks])
    except pa.ArrowInvalid:
        tables = [pa.table({ADD: c}) for c in chunks]
        return pa.concat_tables(tables, promote_options="permissive").column(ADD)
