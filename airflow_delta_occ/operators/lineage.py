"""OpenLineage dataset naming for Delta table locations (issue #12, first part).

Why a module of its own: the naming follows the OpenLineage naming spec (``file`` namespace with the
absolute path for local tables; ``scheme://authority`` namespace with the key path as the name for object
stores and HDFS), so every consumer (Marquez, DataHub, ...) joins a Delta table written by this provider
with the same table read by a Spark job carrying the OpenLineage Spark listener. It imports neither the
OpenLineage provider nor pyarrow: the provider is an optional extra and operators must import cheaply.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from airflow_delta_occ.exceptions import ProviderConfigError

# Object-store and distributed-file-system schemes whose namespace is ``scheme://authority``. ``s3a``/``s3n``
# are Hadoop's names for S3 and are reported as ``s3`` (as the OpenLineage Spark integration does).
_SCHEME_ALIASES: dict[str, str] = {"s3a": "s3", "s3n": "s3"}
_AUTHORITY_SCHEMES = frozenset({"s3", "s3a", "s3n", "gs", "abfss", "abfs", "wasbs", "wasb", "hdfs"})


@dataclass(frozen=True)
class DatasetName:
    """An OpenLineage dataset identity: ``namespace`` plus ``name``, per the naming spec."""

    namespace: str
    name: str


def dataset_name_for_location(location: str) -> DatasetName:
    """Name a Delta table location (local path, ``file:`` URI or object-store URI) for OpenLineage.

    Raises ``ProviderConfigError`` for an empty location or a scheme the naming spec does not cover, so a
    misconfigured table fails loudly instead of emitting a dataset no consumer can join.
    """
    if not location:
        raise ProviderConfigError("cannot name an empty table location for OpenLineage")
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    if scheme in ("", "file"):
        path = parts.path if scheme == "file" else location
        return DatasetName("file", os.path.abspath(path).rstrip("/") or "/")
    if scheme in _AUTHORITY_SCHEMES:
        if not parts.netloc:
            raise ProviderConfigError(f"table location {location!r} has no bucket/container/host")
        name = parts.path.strip("/")
        return DatasetName(f"{_SCHEME_ALIASES.get(scheme, scheme)}://{parts.netloc}", name or "/")
    raise ProviderConfigError(f"table location {location!r}: scheme {scheme!r} has no OpenLineage naming rule")
