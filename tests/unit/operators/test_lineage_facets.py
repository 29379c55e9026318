"""The OpenLineage facets of one Delta run, built with the OpenLineage provider's own classes and
checked in the JSON form its client sends."""

from __future__ import annotations

from typing import Any

import pytest
from openlineage.client.serde import Serde

from airflow_delta_occ.operators.lineage import DeltaJobLineage, operator_lineage

pytestmark = pytest.mark.unit


def _json(value: Any) -> Any:
    import json

    return json.loads(Serde.to_json(value))


def test_a_merge_reports_its_table_schema_version_statistics_and_source() -> None:
    lineage = operator_lineage(DeltaJobLineage(
        location="s3a://lake/sales", operation="merge", version=7, columns=(("id", "long"), ("country", "string")),
        metrics={"numOutputRows": "40", "numOutputBytes": "2048", "numAddedFiles": "2", "numTargetRowsUpdated": "5"},
        table_name="main.sales", source_location="/staging/sales_updates"))
    [output] = [_json(o) for o in lineage.outputs]
    assert (output["namespace"], output["name"]) == ("s3://lake", "sales")
    assert [(f["name"], f["type"]) for f in output["facets"]["schema"]["fields"]] == [("id", "long"),
                                                                                       ("country", "string")]
    assert output["facets"]["version"]["datasetVersion"] == "7"
    assert output["facets"]["symlinks"]["identifiers"] == [{"namespace": "s3://lake", "name": "main.sales",
                                                            "type": "TABLE"}]
    assert "lifecycleStateChange" not in output["facets"]
    statistics = output["outputFacets"]["outputStatistics"]
    assert (statistics["rowCount"], statistics["size"], statistics["fileCount"]) == (40, 2048, 2)
    assert [(_json(i)["namespace"], _json(i)["name"]) for i in lineage.inputs] == [("file", "/staging/sales_updates")]
    assert lineage.job_facets == {}


def test_a_partition_overwrite_is_an_overwrite_and_a_query_source_is_the_jobs_sql() -> None:
    query = "SELECT id, country FROM staging.sales WHERE day = '2024-01-01'"
    lineage = operator_lineage(DeltaJobLineage(location="/lake/sales", operation="overwrite_partitions", version=3,
                                               source_query=query))
    [output] = [_json(o) for o in lineage.outputs]
    assert output["facets"]["lifecycleStateChange"]["lifecycleStateChange"] == "OVERWRITE"
    assert lineage.inputs == []
    assert _json(lineage.job_facets["sql"])["query"] == query


def test_a_run_that_committed_nothing_reports_no_version_and_no_statistics() -> None:
    lineage = operator_lineage(DeltaJobLineage(location="/lake/sales", operation="delete",
                                               metrics={"numDeletedRows": "0"}))
    [output] = [_json(o) for o in lineage.outputs]
    assert "version" not in output["facets"] and output["outputFacets"] == {}
