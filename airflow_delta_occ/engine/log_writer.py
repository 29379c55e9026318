"""Encode actions as the newline-delimited JSON of a Delta commit file.

The inverse of ``actions.parse_json_actions``: field names and optionality follow PROTOCOL.md, and
optional fields that are unset are left out (not written as ``null``) because some readers treat
an explicit ``null`` differently from an absent key.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .actions import (
    ADD,
    CDC,
    COMMIT_INFO,
    DOMAIN_METADATA,
    METADATA,
    PROTOCOL,
    REMOVE,
    SET_TRANSACTION,
    Action,
    AddCDCFile,
    AddFile,
    CommitInfo,
    DeletionVectorDescriptor,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)


def _without_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _dv(dv: DeletionVectorDescriptor | None) -> dict[str, Any] | None:
    if dv is None:
        return None
    return _without_none({"storageType": dv.storage_type, "pathOrInlineDv": dv.path_or_inline_dv,
                          "offset": dv.offset, "sizeInBytes": dv.size_in_bytes, "cardinality": dv.cardinality,
                          "maxRowIndex": dv.max_row_index})


def action_to_json(action: Action) -> dict[str, Any]:
    """One action as the single-key JSON object of a commit line.

    Raises:
        TypeError: the action kind is never written into a commit (sidecars, checkpoint metadata).
    """
    if isinstance(action, AddFile):
        return {ADD: _without_none({
            "path": action.path, "partitionValues": dict(action.partition_values), "size": action.size,
            "modificationTime": action.modification_time, "dataChange": action.data_change,
            "stats": action.stats, "tags": dict(action.tags) if action.tags is not None else None,
            "deletionVector": _dv(action.deletion_vector), "baseRowId": action.base_row_id,
            "defaultRowCommitVersion": action.default_row_commit_version,
            "clusteringProvider": action.clustering_provider,
        })}
    if isinstance(action, RemoveFile):
        return {REMOVE: _without_none({
            "path": action.path, "deletionTimestamp": action.deletion_timestamp, "dataChange": action.data_change,
            "extendedFileMetadata": action.extended_file_metadata,
            "partitionValues": dict(action.partition_values) if action.partition_values is not None else None,
            "size": action.size, "deletionVector": _dv(action.deletion_vector), "baseRowId": action.base_row_id,
            "defaultRowCommitVersion": action.default_row_commit_version,
        })}
    if isinstance(action, Metadata):
        return {METADATA: _without_none({
            "id": action.id, "name": action.name, "description": action.description,
            "format": {"provider": action.format_provider, "options": dict(action.format_options)},
            "schemaString": action.schema_string, "partitionColumns": list(action.partition_columns),
            "configuration": dict(action.configuration), "createdTime": action.created_time,
        })}
    if isinstance(action, Protocol):
        return {PROTOCOL: _without_none({
            "minReaderVersion": action.min_reader_version, "minWriterVersion": action.min_writer_version,
            "readerFeatures": sorted(action.reader_features) if action.reader_features is not None else None,
            "writerFeatures": sorted(action.writer_features) if action.writer_features is not None else None,
        })}
    if isinstance(action, SetTransaction):
        return {SET_TRANSACTION: _without_none({"appId": action.app_id, "version": action.version,
                                                "lastUpdated": action.last_updated})}
    if isinstance(action, DomainMetadata):
        return {DOMAIN_METADATA: {"domain": action.domain, "configuration": action.configuration,
                                  "removed": action.removed}}
    if isinstance(action, CommitInfo):
        return {COMMIT_INFO: dict(action.raw)}
    if isinstance(action, AddCDCFile):
        return {CDC: {"path": action.path, "partitionValues": dict(action.partition_values),
                      "size": action.size, "dataChange": False}}
    raise TypeError(f"{type(action).__name__} actions are not written into commit files")


def encode_commit(actions: Iterable[Action]) -> bytes:
    """The bytes of a commit file: one compact JSON object per line."""
    lines = [json.dumps(action_to_json(a), separators=(",", ":")) for a in actions]
    return ("\n".join(lines) + "\n").encode("utf-8")
