"""Read checkpoints (classic, multi-part, V2 with sidecars) into an Arrow column of live adds.

Add actions stay in Arrow: a checkpoint of 100,000 files turns into Python objects only for the
files a caller asks for, which is what keeps a full snapshot load in the same range as delta-rs.
Remove tombstones are skipped: they matter for VACUUM, not for the files a job reads.

Because adds stay in Arrow, their column is checked when a file is read: the field types the engine
relies on, required fields present and non-null, integers within 0..2^63-1. A checkpoint that fails
is a ``LogCorruptError`` naming the file, not a pyarrow error later in a vectorised call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .actions import ADD, INT64_MAX, Action, AddFile, Sidecar, decode_action, parse_json_actions
from .errors import LogCorruptError
from .log_segment import LOG_DIR, SIDECARS_DIR, Checkpoint
from .storage import Storage

_NON_FILE_COLUMNS = ("metaData", "protocol", "txn", "domainMetadata", "checkpointMetadata", "sidecar")


def _is_string(t: Any) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _is_string_map(t: Any) -> bool:
    return bool(pa.types.is_map(t) and _is_string(t.key_type) and _is_string(t.item_type))


_TypeCheck = Callable[[Any], bool]
_DV_FIELDS: Mapping[str, _TypeCheck] = {
    "storageType": _is_string, "pathOrInlineDv": _is_string, "offset": pa.types.is_integer,
    "sizeInBytes": pa.types.is_integer, "cardinality": pa.types.is_integer, "maxRowIndex": pa.types.is_integer,
}
_ADD_FIELDS: Mapping[str, _TypeCheck] = {
    "path": _is_string, "partitionValues": _is_string_map, "size": pa.types.is_integer,
    "modificationTime": pa.types.is_integer, "dataChange": pa.types.is_boolean, "stats": _is_string,
    "tags": _is_string_map, "deletionVector": pa.types.is_struct, "baseRowId": pa.types.is_integer,
    "defaultRowCommitVersion": pa.types.is_integer, "clusteringProvider": _is_string,
}
#: Per struct the engine decodes: the fields it reads with their type checks, and the required ones.
_EXPECTED: Mapping[str, tuple[Mapping[str, _TypeCheck], tuple[str, ...]]] = {
    "add": (_ADD_FIELDS, ("path", "partitionValues")),
    "add.deletionVector": (_DV_FIELDS, ("storageType", "pathOrInlineDv", "sizeInBytes", "cardinality")),
}


@dataclass
class CheckpointContent:
    """Live adds as one Arrow struct column plus the other actions as Python objects."""

    adds: pa.ChunkedArray | None
    inline_adds: list[AddFile]
    actions: list[Action]
    #: The checkpoint's (first) file, named by errors found when add rows are decoded later.
    source: str


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
    source = checkpoint.files[0].path
    return CheckpointContent(_concat(add_chunks, source), inline_adds, actions, source)


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
        if len(adds):
            _check_struct(adds, ADD, path)
    actions: list[Action] = []
    for name in _NON_FILE_COLUMNS:
        if name not in names:
            continue
        column = table.column(name)
        try:
            payloads = column.filter(pc.is_valid(column)).to_pylist(maps_as_pydicts="strict")
        except (pa.ArrowException, KeyError, ValueError, OverflowError) as exc:  # KeyError: duplicate map key
            raise LogCorruptError(f"{what} column {name!r} cannot be decoded: {exc}", path=path) from exc
        for payload in payloads:
            action = decode_action(name, payload, path)
            if action is not None:
                actions.append(action)
    return adds, actions


def _check_struct(column: pa.ChunkedArray, what: str, path: str) -> None:
    """Check a struct column with no null rows: known field types, required fields, integer ranges."""
    if not pa.types.is_struct(column.type):
        raise LogCorruptError(f"checkpoint column {what!r} has type {column.type}, expected a struct", path=path)
    fields, required = _EXPECTED[what]
    present = {f.name for f in column.type}
    missing = [name for name in required if name not in present]
    if missing:
        raise LogCorruptError(f"checkpoint column {what!r} has no field(s) {missing}", path=path)
    for f in column.type:
        check = fields.get(f.name)
        if check is None:
            continue  # fields the engine does not read are ignored, as the protocol asks of readers
        name = f"{what}.{f.name}"
        if not check(f.type):
            raise LogCorruptError(f"checkpoint field {name!r} has the wrong type {f.type}", path=path)
        child = pc.struct_field(column, f.name)
        if f.name in required and child.null_count:
            raise LogCorruptError(f"checkpoint field {name!r} is null in {child.null_count} row(s)", path=path)
        if pa.types.is_integer(f.type) and child.null_count < len(child):
            bounds = pc.min_max(child)
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
            if low < 0 or high > INT64_MAX:
                bad = low if low < 0 else high
                raise LogCorruptError(f"checkpoint field {name!r} holds {bad}, outside 0..2^63-1", path=path)
        if name in _EXPECTED:
            _check_struct(child.filter(pc.is_valid(child)), name, path)


def _concat(chunks: list[pa.ChunkedArray], path: str) -> pa.ChunkedArray | None:
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
        try:
            return pa.concat_tables(tables, promote_options="permissive").column(ADD)
        except pa.ArrowException as exc:
            raise LogCorruptError(f"checkpoint files disagree on the type of the add column: {exc}",
                                  path=path) from exc
