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
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_delta_occ.exceptions import ProviderConfigError
from airflow_delta_occ.jobs.operations import JobOperation

if TYPE_CHECKING:
    from airflow_delta_occ.engine import Snapshot
    from airflow_delta_occ.engine.schema import StructType
    from airflow_delta_occ.jobs.spec import JobSpec, SourceRef

# Object-store and distributed-file-system schemes whose namespace is ``scheme://authority``, spelled as
# ``engine.object_store.canonical_location`` spells them (the lease key's form): ``s3a``/``s3n`` are Hadoop's
# names for S3 and are reported as ``s3`` (as the OpenLineage Spark integration does), ``abfs`` as ``abfss``,
# hosts in lower case, HDFS with its port.
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
    try:
        parts = urlsplit(location)
    except ValueError as exc:  # an unclosed IPv6 bracket
        from airflow_delta_occ.engine.object_store import redact_uri

        raise ProviderConfigError(f"table location {redact_uri(location)!r} is not a URI ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme == "" and not os.path.isabs(location):  # the engine reads it from the working directory
        location = os.path.abspath(location)
    if scheme in ("", "file", *_AUTHORITY_SCHEMES):
        return _dataset(location)
    from airflow_delta_occ.engine.object_store import redact_uri

    raise ProviderConfigError(f"table location {redact_uri(location)!r}: scheme {scheme!r} has no OpenLineage "
                              "naming rule")


def _dataset(location: str) -> DatasetName:
    """The dataset of the location's one spelling (``engine.object_store.canonical_table``, the lease
    key's too), so every spelling of one table (``hdfs://NameNode/t``, ``hdfs://namenode:8020/t/``,
    ``/lake//t/``) is one dataset, as it is one lease key: ``file`` and the path, or
    ``scheme://authority`` and the key path."""
    from airflow_delta_occ.engine.errors import UnsupportedStorageError
    from airflow_delta_occ.engine.object_store import canonical_table

    try:
        canonical = canonical_table(location)
    except UnsupportedStorageError as exc:
        raise ProviderConfigError(f"table location cannot be named for OpenLineage: {exc}") from exc
    scheme, _, rest = canonical.partition("://")
    if scheme == "file":
        return DatasetName("file", rest.rstrip("/") or "/")
    authority, _, name = rest.partition("/")
    if not authority:
        raise ProviderConfigError(f"table location {canonical!r} has no bucket/container/host")
    return DatasetName(f"{scheme}://{authority}", name or "/")


@dataclass(frozen=True)
class DeltaJobLineage:
    """What one Delta operator run wrote and read, as OpenLineage needs it.

    Typed and free of Airflow and OpenLineage imports so the facets are built (and tested) from plain
    values: the operator fills it from the job it prepared and the result it confirmed.
    ``operation`` is the operator's job kind (merge, update, ...); ``version`` is the Delta version the
    run committed (``None``: nothing committed, or the run failed) and ``commit_operation`` Delta's name
    for that commit, read back from the log; ``read_version`` is the version the job was planned
    against; ``columns`` are (name, type) pairs of the table's schema at the committed version;
    ``statement`` is the SQL statement the job runs (``None`` for DataFrame writes).
    """

    location: str
    operation: str
    version: int | None = None
    columns: tuple[tuple[str, str], ...] = ()
    metrics: Mapping[str, str] = field(default_factory=dict)
    table_name: str | None = None
    source_location: str | None = None
    source_format: str = "delta"
    source_query: str | None = None
    statement: str | None = None
    read_version: int | None = None
    partition_predicate: str | None = None
    commit_operation: str | None = None
    already_committed: bool = False


#: Delta tables store their data as Parquet (the storage facet, as the OpenLineage Spark integration sends it).
DELTA_FILE_FORMAT = "parquet"


def _delta_name(operation: str) -> str:
    try:
        return JobOperation(operation).delta_name
    except ValueError:
        return operation.upper()


def _count(metrics: Mapping[str, str], *keys: str) -> int | None:
    """The first of ``keys`` Delta's operationMetrics hold, as an int (they are strings in the log)."""
    for key in keys:
        value = metrics.get(key)
        if value is not None and str(value).isdigit():
            return int(value)
    return None


def operator_lineage(job: DeltaJobLineage) -> Any:
    """The OpenLineage provider's ``OperatorLineage`` for one run.

    Output: the target table with its schema, data source and Delta storage facets, the committed
    version, the operation (the provider's ``deltaOcc_operation`` facet, for every operator), an
    OVERWRITE lifecycle change for partition overwrites, output statistics from Delta's operation
    metrics and the catalog name as a symlink. Input: a source given by location. Job: the SQL the
    job ran (its statement, or a DataFrame write's source query) as the SQL facet.

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
    from openlineage.client.facet_v2 import dataset_version_dataset, datasource_dataset, storage_dataset

    from airflow_delta_occ.operators.openlineage_facets import OPERATION_FACET_KEY, DeltaOccOperationDatasetFacet

    def located(name: DatasetName, delta: bool) -> dict[str, Any]:
        """The facets of any dataset named by location: its data source, and Delta's storage layer."""
        facets: dict[str, Any] = {"dataSource": datasource_dataset.DatasourceDatasetFacet(name=name.namespace,
                                                                                        uri=name.namespace)}
        if delta:
            facets["storage"] = storage_dataset.StorageDatasetFacet(storageLayer="delta", fileFormat=DELTA_FILE_FORMAT)
        return facets

    target = dataset_name_for_location(job.location)
    facets = located(target, delta=True)
    if job.columns:
        facets["schema"] = SchemaDatasetFacet(fields=[SchemaDatasetFacetFields(name=n, type=t) for n, t in job.columns])
    if job.version is not None:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=str(job.version))
        if job.operation == JobOperation.OVERWRITE_PARTITIONS:   # its commit replaces data
            facets["lifecycleStateChange"] = LifecycleStateChangeDatasetFacet(
                lifecycleStateChange=LifecycleStateChange.OVERWRITE)
    facets[OPERATION_FACET_KEY] = DeltaOccOperationDatasetFacet(
        # Delta's name of the commit, read back from the log; the job's own before that, or without a commit
        operation=job.commit_operation or _delta_name(job.operation),
        kind=job.operation, version=job.version, readVersion=job.read_version,
        alreadyCommitted=job.already_committed, partitionPredicate=job.partition_predicate)
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
        inputs.append(InputDataset(namespace=source.namespace, name=source.name,
                                   facets=located(source, delta=job.source_format.lower() == "delta")))
    query = job.statement or job.source_query
    job_facets = {"sql": SQLJobFacet(query=query, dialect="spark")} if query else {}
    return OperatorLineage(inputs=inputs, outputs=[OutputDataset(namespace=target.namespace, name=target.name,
                                                                 facets=facets, outputFacets=output_facets)],
                           job_facets=job_facets)


def schema_columns(schema: StructType) -> tuple[tuple[str, str], ...]:
    """A table schema's columns as (name, Delta type) pairs, for the schema facet."""
    return tuple((f.name, f.type.simple_string()) for f in schema.fields)


_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def source_sql(source: SourceRef) -> str:
    """A job's source as Spark SQL names it in a FROM clause: ``delta.`/path``` (the source's format),
    a quoted table name, or the query in parentheses."""
    from airflow_delta_occ.engine.sql_parser import render_identifier
    from airflow_delta_occ.jobs.sql import table_name_sql

    if source.path is not None:
        fmt = source.format if _PLAIN_NAME.fullmatch(source.format) else render_identifier(source.format)
        return f"{fmt}.{render_identifier(source.path)}"
    if source.table is not None:
        return table_name_sql(source.table)
    return f"({source.query})"


def job_statement(spec: JobSpec) -> str | None:
    """The SQL statement a job runs, for the SQL job facet (``None``: appends and partition overwrites
    are DataFrame writes).

    The runner runs a MERGE over a private temporary view of the source (read once, so conflict
    retries never read it again); the statement reported names the source itself instead, so a
    consumer reading the SQL sees which dataset the MERGE read, not a view that no longer exists.
    """
    from airflow_delta_occ.jobs.sql import statement_sql

    return statement_sql(spec, None, source=source_sql(spec.source) if spec.source is not None else None)


def lineage_of(location: str, spec: JobSpec, snapshot: Snapshot) -> DeltaJobLineage:
    """What a prepared job will write and read, before it runs (the version comes with its result).

    A source named by catalog table is not reported as an input: its location is known only to the
    catalog the job runs against, and a guessed namespace would be a dataset no consumer can join
    (the SQL facet's statement names it).
    """
    source = spec.source
    return DeltaJobLineage(location=location, operation=spec.operation, columns=schema_columns(snapshot.schema),
                           table_name=spec.target.name, source_location=source.path if source else None,
                           source_format=source.format if source else "delta",
                           source_query=source.query if source else None, statement=job_statement(spec),
                           read_version=snapshot.version, partition_predicate=spec.partition_filter_sql)
