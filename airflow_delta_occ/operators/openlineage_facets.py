"""The provider's own OpenLineage facet: which Delta operation a run made, and at which versions.

OpenLineage has no standard facet for "this task MERGEd into the table": the SQL job facet holds a
statement only when the job runs one (an append is a DataFrame write), and the lifecycle state
change covers only CREATE/OVERWRITE/TRUNCATE/... So every Delta operator also reports this custom
dataset facet on its output, under the key ``deltaOcc_operation`` (prefixed as the spec asks of custom
facets). Its JSON schema is ``docs/openlineage/DeltaOccOperationDatasetFacet.json``.

A module of its own because it imports the OpenLineage client (attrs classes) at import time: it is
imported only when the OpenLineage provider's listener asks an operator for its lineage, and a
module-level class pickles by name.
"""

from __future__ import annotations

import attr
from airflow.providers.common.compat.openlineage.facet import DatasetFacet

#: The key of the facet in a dataset's ``facets``.
OPERATION_FACET_KEY = "deltaOcc_operation"
#: ``_schemaURL`` of the facet. The project has no public documentation host yet, so this is a URN
#: naming the schema file shipped in ``docs/openlineage/``; change it to that file's published URL.
OPERATION_FACET_SCHEMA_URL = "urn:airflow-delta-occ:openlineage:facets:1-0-0:DeltaOccOperationDatasetFacet.json"


@attr.define
class DeltaOccOperationDatasetFacet(DatasetFacet):
    """The Delta operation a run made on its output table.

    ``operation`` is Delta's own name for the commit (``commitInfo.operation``, as ``DESCRIBE HISTORY``
    shows it: MERGE, UPDATE, DELETE, OPTIMIZE, WRITE), read back from the Delta log when the run
    committed; ``kind`` is the operator's job (merge, update, delete, optimize, append,
    overwrite_partitions). ``version`` is the version this run committed (``None``: nothing was
    committed), ``readVersion`` the version the job was planned against.
    """

    operation: str
    kind: str
    version: int | None = attr.field(default=None)
    readVersion: int | None = attr.field(default=None)  # OpenLineage fields are camelCase
    alreadyCommitted: bool = attr.field(default=False)
    partitionPredicate: str | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return OPERATION_FACET_SCHEMA_URL
