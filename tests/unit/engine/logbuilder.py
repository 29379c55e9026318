"""Write small Delta logs by hand (JSON commits and Parquet checkpoints) for unit tests.

The real-Spark tier proves the engine on logs delta-spark wrote; these builders make the corner
cases (corruption, cleanup, unknown features, odd checkpoint layouts) cheap to reproduce.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "name", "type": "string", "nullable": True, "metadata": {}},
        {"name": "date", "type": "date", "nullable": True, "metadata": {}},
        {"name": "country", "type": "string", "nullable": True, "metadata": {}},
    ],
}

_STR_MAP = pa.map_(pa.string(), pa.string())
_DV = pa.struct([("storageType", pa.string()), ("pathOrInlineDv", pa.string()), ("offset", pa.int32()),
                 ("sizeInBytes", pa.int32()), ("cardinality", pa.int64()), ("maxRowIndex", pa.int64())])
CHECKPOINT_SCHEMA = pa.schema([
    ("txn", pa.struct([("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())])),
    ("add", pa.struct([("path", pa.string()), ("partitionValues", _STR_MAP), ("size", pa.int64()),
                       ("modificationTime", pa.int64()), ("dataChange", pa.bool_()), ("stats", pa.string()),
                       ("tags", _STR_MAP), ("deletionVector", _DV)])),
    ("remove", pa.struct([("path", pa.string()), ("deletionTimestamp", pa.int64()), ("dataChange", pa.bool_()),
                          ("deletionVector", _DV)])),
    ("metaData", pa.struct([("id", pa.string()), ("name", pa.string()), ("description", pa.string()),
                            ("format", pa.struct([("provider", pa.string()), ("options", _STR_MAP)])),
                            ("schemaString", pa.string()), ("partitionColumns", pa.list_(pa.string())),
                            ("configuration", _STR_MAP), ("createdTime", pa.int64())])),
    ("protocol", pa.struct([("minReaderVersion", pa.int32()), ("minWriterVersion", pa.int32()),
                            ("readerFeatures", pa.list_(pa.string())), ("writerFeatures", pa.list_(pa.string()))])),
    ("domainMetadata", pa.struct([("domain", pa.string()), ("configuration", pa.string()),
                                  ("removed", pa.bool_())])),
    ("checkpointMetadata", pa.struct([("version", pa.int64())])),
    ("sidecar", pa.struct([("path", pa.string()), ("sizeInBytes", pa.int64()),
                           ("modificationTime", pa.int64())])),
])
_MAP_FIELDS = {"partitionValues", "tags", "configuration", "options"}


def protocol(reader: int = 1, writer: int = 2, reader_features: Sequence[str] | None = None,
             writer_features: Sequence[str] | None = None) -> dict[str, Any]:
    p: dict[str, Any] = {"minReaderVersion": reader, "minWriterVersion": writer}
    if reader_features is not None:
        p["readerFeatures"] = list(reader_features)
    if writer_features is not None:
        p["writerFeatures"] = list(writer_features)
    return {"protocol": p}


def metadata(partition_columns: Sequence[str] = ("date", "country"), configuration: dict[str, str] | None = None,
             schema: dict[str, Any] | None = None, table_id: str = "11111111-2222-3333-4444-555555555555",
             ) -> dict[str, Any]:
    return {"metaData": {"id": table_id, "format": {"provider": "parquet", "options": {}},
                         "schemaString": json.dumps(schema or SCHEMA),
                         "partitionColumns": list(partition_columns),
                         "configuration": configuration or {}, "createdTime": 1700000000000}}


def add(path: str, partition: dict[str, str | None] | None = None, *, stats: dict[str, Any] | None = None,
        dv: dict[str, Any] | None = None, data_change: bool = True, size: int = 100) -> dict[str, Any]:
    a: dict[str, Any] = {"path": path, "partitionValues": partition or {}, "size": size,
                         "modificationTime": 1700000000000, "dataChange": data_change}
    if stats is not None:
        a["stats"] = json.dumps(stats)
    if dv is not None:
        a["deletionVector"] = dv
    return {"add": a}


def remove(path: str, *, dv: dict[str, Any] | None = None, data_change: bool = True) -> dict[str, Any]:
    r: dict[str, Any] = {"path": path, "deletionTimestamp": 1700000000001, "dataChange": data_change}
    if dv is not None:
        r["deletionVector"] = dv
    return {"remove": r}


def dv(path_or_inline: str, cardinality: int = 1, offset: int | None = 1) -> dict[str, Any]:
    d: dict[str, Any] = {"storageType": "u", "pathOrInlineDv": path_or_inline, "sizeInBytes": 40,
                         "cardinality": cardinality}
    if offset is not None:
        d["offset"] = offset
    return d


def commit_info(operation: str = "WRITE", **extra: Any) -> dict[str, Any]:
    return {"commitInfo": {"timestamp": 1700000000000, "operation": operation, "operationParameters": {},
                           "isBlindAppend": True, **extra}}


def txn(app_id: str, version: int) -> dict[str, Any]:
    return {"txn": {"appId": app_id, "version": version, "lastUpdated": 1700000000000}}


def domain(name: str, configuration: str = "{}", removed: bool = False) -> dict[str, Any]:
    return {"domainMetadata": {"domain": name, "configuration": configuration, "removed": removed}}


class LogBuilder:
    """Writes a table's ``_delta_log`` one commit or checkpoint at a time."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = str(root)
        self.log_dir = os.path.join(self.root, "_delta_log")
        os.makedirs(self.log_dir, exist_ok=True)
        self.commits: list[list[dict[str, Any]]] = []

    def commit(self, *actions: dict[str, Any], version: int | None = None) -> int:
        version = len(self.commits) if version is None else version
        while len(self.commits) <= version:
            self.commits.append([])
        self.commits[version] = list(actions)
        with open(os.path.join(self.log_dir, f"{version:020d}.json"), "w") as fh:
            fh.write("\n".join(json.dumps(a) for a in actions) + "\n")
        return version

    def reconciled(self, version: int) -> list[dict[str, Any]]:
        """The reconciled actions at ``version`` (what a checkpoint must hold)."""
        state: dict[Any, dict[str, Any]] = {}
        for actions in self.commits[: version + 1]:
            for a in actions:
                kind, body = next(iter(a.items()))
                if kind in ("add", "remove"):
                    dvid = json.dumps(body.get("deletionVector"), sort_keys=True)
                    state.pop(("file", body["path"], dvid), None)
                    if kind == "add":
                        state[("file", body["path"], dvid)] = a
                elif kind in ("metaData", "protocol"):
                    state[kind] = a
                elif kind == "txn":
                    state[("txn", body["appId"])] = a
                elif kind == "domainMetadata":
                    state[("domain", body["domain"])] = a
        return list(state.values())

    def checkpoint(self, version: int, *, parts: int = 1, write_last: bool = True) -> list[str]:
        """A classic (parts=1) or multi-part checkpoint of ``version``; returns the file names."""
        rows = [_row(a) for a in self.reconciled(version)]
        chunks = [rows[i::parts] for i in range(parts)]
        names = []
        for i, chunk in enumerate(chunks, start=1):
            if parts == 1:
                name = f"{version:020d}.checkpoint.parquet"
            else:
                name = f"{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet"
            pq.write_table(pa.Table.from_pylist(chunk, schema=CHECKPOINT_SCHEMA), os.path.join(self.log_dir, name))
            names.append(name)
        if write_last:
            self.write_last_checkpoint(version, parts=parts)
        return names

    def v2_checkpoint(self, version: int, *, sidecars: int = 2, top_level: str = "json") -> tuple[str, list[str]]:
        """A UUID-named V2 checkpoint whose file actions live in ``sidecars`` Parquet sidecar files."""
        actions = self.reconciled(version)
        files = [a for a in actions if "add" in a]
        others = [a for a in actions if "add" not in a]
        sidecar_dir = os.path.join(self.log_dir, "_sidecars")
        os.makedirs(sidecar_dir, exist_ok=True)
        sidecar_names = []
        for i in range(sidecars):
            name = f"{uuid.uuid4()}.parquet"
            chunk = [_row(a) for a in files[i::sidecars]]
            pq.write_table(pa.Table.from_pylist(chunk, schema=CHECKPOINT_SCHEMA), os.path.join(sidecar_dir, name))
            sidecar_names.append(name)
        top = [{"checkpointMetadata": {"version": version}}, *others,
               *({"sidecar": {"path": n, "sizeInBytes": 1, "modificationTime": 1}} for n in sidecar_names)]
        name = f"{version:020d}.checkpoint.{uuid.uuid4()}.{top_level}"
        path = os.path.join(self.log_dir, name)
        if top_level == "json":
            with open(path, "w") as fh:
                fh.write("\n".join(json.dumps(a) for a in top) + "\n")
        else:
            pq.write_table(pa.Table.from_pylist([_row(a) for a in top], schema=CHECKPOINT_SCHEMA), path)
        return name, sidecar_names

    def write_last_checkpoint(self, version: int, *, parts: int = 1) -> None:
        content: dict[str, Any] = {"version": version, "size": 1}
        if parts > 1:
            content["parts"] = parts
        with open(os.path.join(self.log_dir, "_last_checkpoint"), "w") as fh:
            json.dump(content, fh)

    def delete_commits(self, versions: Iterable[int]) -> None:
        for v in versions:
            os.remove(os.path.join(self.log_dir, f"{v:020d}.json"))


def _row(action: dict[str, Any]) -> dict[str, Any]:
    kind, body = next(iter(action.items()))
    return {kind: _to_arrow_value(body)}


def _to_arrow_value(value: Any, key: str | None = None) -> Any:
    if isinstance(value, dict):
        if key in _MAP_FIELDS:
            return list(value.items())
        return {k: _to_arrow_value(v, k) for k, v in value.items()}
    return value
