"""The OpenLineage facets of one Delta run, built with the OpenLineage provider's own classes and
checked in the JSON form its client sends."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from openlineage.client.serde import Serde

from airflow_delta_occ.jobs.result import JobResult, JobStatus
from airflow_delta_occ.operators.delta import (
    DeltaAppendOperator,
    DeltaBaseOperator,
    DeltaDeleteOperator,
    DeltaMergeOperator,
    DeltaOptimizeOperator,
    DeltaOverwritePartitionsOperator,
    DeltaUpdateOperator,
)
from airflow_delta_occ.operators.lineage import DeltaJobLineage, operator_lineage

from ..engine.logbuilder import LogBuilder, add, commit_info

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


# -- every operator, through the operator: prepare -> (the job's commit) -> confirm -> facets --------------
DE = {"date": "2024-01-01", "country": "DE"}
#: What delta-spark writes as commitInfo.operation for each job (DataFrame writes are WRITE).
DELTA_OPERATION = {"merge": "MERGE", "update": "UPDATE", "delete": "DELETE", "optimize": "OPTIMIZE",
                   "append": "WRITE", "overwrite_partitions": "WRITE"}


def _operator(kind: str, path: str) -> DeltaBaseOperator:
    return {
        "merge": lambda: DeltaMergeOperator(task_id="m", table=path, source="/src", merge_condition="t.id = s.id",
                                            partitions=DE),
        "update": lambda: DeltaUpdateOperator(task_id="u", table=path, set={"name": "'x'"}, where="id > 3",
                                              partitions=DE),
        "delete": lambda: DeltaDeleteOperator(task_id="d", table=path, where="id = 1", partitions=DE),
        "optimize": lambda: DeltaOptimizeOperator(task_id="o", table=path, partitions=DE, zorder_by=["id"]),
        "append": lambda: DeltaAppendOperator(task_id="a", table=path, source="/src", partitions=DE),
        "overwrite_partitions": lambda: DeltaOverwritePartitionsOperator(
            task_id="w", table=path, source_query="SELECT * FROM staging.sales", partitions=DE),
    }[kind]()


def _committed(kind: str, path: str, *, commit: bool = True) -> dict[str, Any]:
    """Run ``kind`` as far as the operator does without Spark; the job's commit (version 2, tagged with
    the run) is written into the Delta log as delta-spark writes it. Returns the facets' JSON."""
    operator = _operator(kind, path)
    ti = SimpleNamespace(dag_id="sales", task_id=operator.task_id, map_index=-1, try_number=1)
    prepared = operator.prepare({"ti": ti, "run_id": "manual__1"})
    version = None
    if commit:
        version = LogBuilder(path).commit(
            commit_info(DELTA_OPERATION[kind], userMetadata=prepared.spec.run.user_metadata()),
            add(f"{kind}.parquet", {"date": "2024-01-01", "country": "DE"}), version=2)
    result = operator.confirm(prepared, JobResult(status=JobStatus.SUCCESS, table=path, operation=kind,
                                                  version=version, metrics={"numAddedFiles": "1"} if commit else {}))
    operator.record_lineage(result)
    lineage = operator.get_openlineage_facets_on_complete(None)
    return {"outputs": [_json(o) for o in lineage.outputs], "inputs": [_json(i) for i in lineage.inputs],
            "job": {name: _json(facet) for name, facet in lineage.job_facets.items()}}


@pytest.mark.parametrize("kind", list(DELTA_OPERATION))
def test_every_operator_reports_its_operation_and_the_version_it_committed(sales_log: tuple[str, Any],
                                                                           kind: str) -> None:
    path, _ = sales_log
    events = _committed(kind, path)
    [output] = events["outputs"]
    facets = output["facets"]
    assert (output["namespace"], output["name"]) == ("file", path)
    assert facets["version"]["datasetVersion"] == "2"
    assert facets["storage"] == {**facets["storage"], "storageLayer": "delta", "fileFormat": "parquet"}
    assert (facets["dataSource"]["name"], facets["dataSource"]["uri"]) == ("file", "file")
    # The operation, for every operator: Delta's name of the commit (read back from the log), the job's kind,
    # the committed version and the version the job was planned against, in the provider's facet.
    operation = facets["deltaOcc_operation"]
    assert operation["_schemaURL"].endswith("DeltaOccOperationDatasetFacet.json")
    assert {k: v for k, v in operation.items() if not k.startswith("_")} == {
        "operation": DELTA_OPERATION[kind], "kind": kind, "version": 2, "readVersion": 1,
        "alreadyCommitted": False, "partitionPredicate": "`date` = DATE'2024-01-01' AND `country` = 'DE'"}
    # OVERWRITE where the commit replaces data; no other Delta operation has a lifecycle state change.
    lifecycle = facets.get("lifecycleStateChange", {}).get("lifecycleStateChange")
    assert lifecycle == ("OVERWRITE" if kind == "overwrite_partitions" else None)
    # The SQL the job ran, as Spark SQL: the statement of a MERGE, UPDATE, DELETE or OPTIMIZE (a path source
    # named as Spark SQL names it), the source query of a DataFrame write.
    sql = events["job"].get("sql")
    target = f"delta.`{path}`"
    expected_start = {
        "merge": f"MERGE INTO {target} AS `t` USING delta.`/src` AS `s` ON `t`.`id` = `s`.`id` AND (`t`.`date` = "
                 "DATE'2024-01-01' AND `t`.`country` = 'DE')\nWHEN MATCHED THEN UPDATE SET *\n"
                 "WHEN NOT MATCHED THEN INSERT *",
        "update": f"UPDATE {target} SET `name` = 'x' WHERE ",
        "delete": f"DELETE FROM {target} WHERE ",
        "optimize": f"OPTIMIZE {target} WHERE `date` = DATE'2024-01-01' AND `country` = 'DE' ZORDER BY (`id`)",
        "overwrite_partitions": "SELECT * FROM staging.sales",
    }.get(kind)
    if expected_start is None:  # an append from a path runs no SQL at all
        assert sql is None
    else:
        assert sql["query"].startswith(expected_start) and sql["dialect"] == "spark", sql
    # The source, when it is a location, is the input (a Delta source with Delta's storage facet).
    if kind in ("merge", "append"):
        [source] = events["inputs"]
        assert (source["namespace"], source["name"]) == ("file", "/src")
        assert source["facets"]["storage"]["storageLayer"] == "delta"
    else:
        assert events["inputs"] == []


@pytest.mark.parametrize("kind", ["delete", "optimize"])
def test_a_job_that_committed_nothing_still_reports_its_operation(sales_log: tuple[str, Any], kind: str) -> None:
    path, _ = sales_log
    [output] = _committed(kind, path, commit=False)["outputs"]
    assert "version" not in output["facets"]
    operation = output["facets"]["deltaOcc_operation"]
    assert (operation["operation"], operation["kind"], operation.get("version"), operation["readVersion"]) == (
        DELTA_OPERATION[kind], kind, None, 1)


def test_the_operation_facet_matches_its_published_schema(sales_log: tuple[str, Any]) -> None:
    """The custom facet's JSON is what docs/openlineage/DeltaOccOperationDatasetFacet.json describes."""
    import json
    from pathlib import Path

    import jsonschema

    schema = json.loads((Path(__file__).parents[3] / "docs" / "openlineage" /
                         "DeltaOccOperationDatasetFacet.json").read_text())
    own = schema["$defs"]["DeltaOccOperationDatasetFacet"]["allOf"][1]  # the base facet's part is OpenLineage's
    path, _ = sales_log
    facet = _committed("merge", path)["outputs"][0]["facets"]["deltaOcc_operation"]
    assert facet["_schemaURL"] == schema["$id"]
    jsonschema.validate(facet, own)
    jsonschema.validate(_committed("delete", path, commit=False)["outputs"][0]["facets"]["deltaOcc_operation"], own)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**facet, "kind": "truncate"}, own)


def test_the_reported_merge_statement_keeps_hostile_paths_as_they_are(sales_log: tuple[str, Any]) -> None:
    """The SQL facet names the source in the MERGE's USING clause and nowhere else: a target or source path
    holding backticks, the text of a view name or a comment opener stays one quoted name, unchanged."""
    from airflow_delta_occ.jobs.spec import RunIdentity
    from airflow_delta_occ.jobs.sql import target_sql
    from airflow_delta_occ.operators.lineage import job_statement

    _, snapshot = sales_log
    target = "/lake/a`delta_occ_lineage_source`b"
    source = "/src`) s ON 1=1 -- `delta_occ_lineage_source`"
    spec = DeltaMergeOperator(task_id="m", table=target, source=source, merge_condition="t.id = s.id",
                              partitions={"date": "2024-01-01", "country": "DE"}).build_spec(
        snapshot, RunIdentity("sales", "task", "manual__1"))
    sql = str(job_statement(spec))
    quoted_source = "delta.`/src``) s ON 1=1 -- ``delta_occ_lineage_source```"
    assert sql.startswith(f"MERGE INTO {target_sql(spec)} AS `t` USING {quoted_source} AS `s` ON "), sql
    assert target_sql(spec) == "delta.`/lake/a``delta_occ_lineage_source``b`"
    assert sql.count(quoted_source) == 1
