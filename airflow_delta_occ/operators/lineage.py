"""OpenLineage for the Delta operators: dataset naming for table locations, and the facets of one run.

Why a module of its own: the naming follows the OpenLineage naming spec (``file`` namespace with the
absolute path for local tables; ``scheme://authority`` namespace with the key path as the name for object
stores and HDFS), so every consumer (Marquez, DataHub, ...) joins a Delta table written by this provider
with the same table read by a Spark job carrying the OpenLineage Spark listener. It imports neither the
OpenLineage provider nor pyarrow when imported: the provider is an optional extra and operators must
import cheaply; ``operator_lineage`` imports it when the provider's listener asks for a run's lineage.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_delta_occ.exceptions import ProviderConfigError

if TYPE_CHECKING:
    from airflow_delta_occ.engine import Snapshot
    from airflow_delta_occ.jobs.spec import JobSpec

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


@dataclass(frozen=True)
class DeltaJobLineage:
    """What one Delta operator run wrote and read, as OpenLineage needs it.

    Typed and free of Airflow and OpenLineage imports so the facets are built (and tested) from plain
    values: the operator fills it from the job it prepared and the result it confirmed.
    ``version`` is the Delta version the run committed (``None``: nothing committed, or the run
    failed); ``columns`` are (name, type) pairs of the table's schema at that version.
    """

    location: str
    operation: str
    version: int | None = None
    columns: tuple[tuple[str, str], ...] = ()
    metrics: Mapping[str, str] = field(default_factory=dict)
    table_name: str | None = None
    source_location: str | None = None
    source_query: str | None = None


#: Delta operations whose commit replaces data, reported as an OVERWRITE lifecycle change.
OVERWRITING_OPERATIONS = frozenset({"overwrite_partitions"})


def _count(metrics: Mapping[str, str], *keys: str) -> int | None:
    """The first of ``keys`` Delta's operationMetrics hold, as an int (they are strings in the log)."""
    for key in keys:
        value = metrics.get(key)
        if value is not None and str(value).isdigit():
            return int(value)
    return None


def operator_lineage(job: DeltaJobLineage) -> Any:
    """The OpenLineage provider's ``OperatorLineage`` for one run: the target table as the output
    (schema, the committed version, an OVERWRITE lifecycle change for partition overwrites, output
    statistics from Delta's operation metrics, the catalog name as a symlink), a source given by
    location as the input, and a source query as the job's SQL facet.

    Imports the provider only when called: it is an optional extra, and this runs only when the
    provider's listener asks.
    """
    from airflow.providers.common.compat.openlineage.facet import (
        Identifier,
        InputDataset,
        LifecycleStateChange,
        LifecycleStateChangeDatasetFacet,
        OutputDataset,
        OutputStatisticsOutputDatasetFacet,
        SchemaDatasetFacet,
        SchemaDatasetFacetFields,
        SQLJobFacet,
        SymlinksDatasetFacet,
    )
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.facet_v2 import dataset_version_dataset

    target = dataset_name_for_location(job.location)
    facets: dict[str, Any] = {}
    if job.columns:
        facets["schema"] = SchemaDatasetFacet(fields=[SchemaDatasetFacetFields(name=n, type=t) for n, t in job.columns])
    if job.version is not None:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=str(job.version))
        if job.operation in OVERWRITING_OPERATIONS:
            facets["lifecycleStateChange"] = LifecycleStateChangeDatasetFacet(
                lifecycleStateChange=LifecycleStateChange.OVERWRITE)
    if job.table_name:
        facets["symlinks"] = SymlinksDatasetFacet(
            identifiers=[Identifier(namespace=target.namespace, name=job.table_name, type="TABLE")])
    output_facets: dict[str, Any] = {}
    rows = _count(job.metrics, "numOutputRows", "numUpdatedRows", "numDeletedRows")
    size = _count(job.metrics, "numOutputBytes", "numAddedBytes")
    files = _count(job.metrics, "numAddedFiles", "numFiles")
    if job.version is not None and (rows, size, files) != (None, None, None):
        output_facets["outputStatistics"] = OutputStatisticsOutputDatasetFacet(rowCount=rows, size=size,
                                                                               fileCount=files)
    inputs = []
    if job.source_location:
        source = dataset_name_for_location(job.source_location)
        inputs.append(InputDataset(namespace=source.namespace, name=source.name))
    job_facets = {"sql": SQLJobFacet(query=job.source_query)} if job.source_query else {}
    return OperatorLineage(inputs=inputs, outputs=[OutputDataset(namespace=target.namespace, name=target.name,
                                                                 facets=facets, outputFacets=output_facets)],
                           job_facets=job_facets)


def schema_columns(snapshot: Snapshot) -> tuple[tuple[str, str], ...]:
    """The table's columns as (name, Delta type) pairs, for the schema facet."""
    return tuple((f.name, f.type.simple_string()) for f in snapshot.schema.fields)


def lineage_of(location: str, spec: JobSpec, snapshot: Snapshot) -> DeltaJobLineage:
    """What a prepared job will write and read, before it runs (the version comes with its result).

    A source named by catalog table is not reported as an input: its location is known only to the
    catalog the job runs against, and a guessed namespace would be a dataset no consumer can join.
    """
    source = spec.source
    return DeltaJobLineage(location=location, operation=spec.operation, columns=schema_columns(snapshot),
                           table_name=spec.target.name, source_location=source.path if source else None,
                           source_query=source.query if source else None)
