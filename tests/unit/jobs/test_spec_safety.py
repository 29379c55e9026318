"""A ``JobSpec`` decoded from JSON cannot run a statement its footprint does not describe."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_delta_occ.engine import Snapshot
from airflow_delta_occ.exceptions import JobSpecError
from airflow_delta_occ.jobs.spec import JobSpec, RunIdentity
from airflow_delta_occ.operators.delta import (
    DeltaAppendOperator,
    DeltaDeleteOperator,
    DeltaMergeOperator,
    DeltaOverwritePartitionsOperator,
    DeltaUpdateOperator,
)

pytestmark = pytest.mark.unit
RUN = RunIdentity("d", "t", "r")
DE = {"date": "2024-01-01", "country": "DE"}
TRUE = {"kind": "literal", "value": {"bool": True}, "type": "boolean"}


@pytest.fixture
def table(sales_log: tuple[str, Snapshot]) -> tuple[str, Snapshot]:
    return sales_log


def spec_json(op: Any, snapshot: Snapshot) -> dict[str, Any]:
    return json.loads(op.build_spec(snapshot, RUN).to_json())  # type: ignore[no-any-return]


def test_tampered_specs_are_refused(table: tuple[str, Snapshot]) -> None:
    path, snap = table
    tampered = []
    d = spec_json(DeltaOverwritePartitionsOperator(task_id="w", table=path, source="/s", partitions=DE), snap)
    d["partition_filter"] = TRUE  # replaceWhere TRUE would replace the whole table
    tampered.append(d)
    d = spec_json(DeltaUpdateOperator(task_id="u", table=path, set={"name": "'x'"}, partitions=DE), snap)
    d["set"] = {"name": "'x' --"}  # would comment out the injected WHERE
    tampered.append(d)
    d = spec_json(DeltaMergeOperator(task_id="m", table=path, source="/s", merge_condition="t.id = s.id",
                                     partitions=DE), snap)
    d["clauses"] = [{"kind": "matched_delete", "set": {},
                     "condition": "FALSE) THEN DELETE WHEN NOT MATCHED BY SOURCE THEN DELETE --"}]
    tampered.append(d)
    d = spec_json(DeltaAppendOperator(task_id="a", table=path, source="/s", partitions=DE), snap)
    d["source_check"], d["source_values"] = None, {}  # rows would land anywhere
    tampered.append(d)
    d = spec_json(DeltaUpdateOperator(task_id="u", table=path, set={"name": "'x'"}, where="id > 3", partitions=DE),
                  snap)
    d["condition"] = {"kind": "comparison", "op": ">", "left": {"kind": "column", "name": "id", "qualifier": None},
                      "right": {"kind": "literal", "value": {"int": "3"}, "type": None}}  # partition predicate gone
    tampered.append(d)
    d = spec_json(DeltaDeleteOperator(task_id="d", table=path, where="id = 1", partitions=DE), snap)
    d["partitions"] = {"country": ["FR"]}
    tampered.append(d)
    d = spec_json(DeltaMergeOperator(task_id="m", table=path, source="/s", merge_condition="t.id = s.id",
                                     partitions=DE, clauses=[{"kind": "not_matched_by_source_update",
                                                              "set": {"name": "'gone'"}}]), snap)
    d["clauses"][0]["condition"] = None  # every row of every other partition is "not matched by source"
    tampered.append(d)
    for i, data in enumerate(tampered):
        with pytest.raises(JobSpecError):
            JobSpec.from_json(json.dumps(data))
            pytest.fail(f"tampered spec {i} accepted")


def test_numbers_beyond_int_range_keep_working(table: tuple[str, Snapshot]) -> None:
    """``to_sql`` writes 1704067200000 as a LONG literal; the spec keeps the tree of that text."""
    path, snap = table
    for where in ("id >= 1704067200000", "id IN (1, 3000000000)"):
        spec = DeltaDeleteOperator(task_id="d", table=path, where=where, partitions=DE).build_spec(snap, RUN)
        assert JobSpec.from_json(spec.to_json()) == spec
        assert spec.condition_sql is not None and "L" in spec.condition_sql


def test_a_decoded_source_check_or_source_value_cannot_carry_other_sql(table: tuple[str, Snapshot]) -> None:
    """The source check and the values a source row writes go into the runner's SELECTs as rendered
    trees: a tampered spec whose tree renders to other SQL (or to the substitution marker) is refused."""
    from airflow_delta_occ.engine.expr_json import expr_to_json
    from airflow_delta_occ.engine.expressions import Literal, Unknown

    path, snap = table
    base = spec_json(DeltaAppendOperator(task_id="a", table=path, source="/s", partitions=DE), snap)
    assert JobSpec.from_json(json.dumps(base)).source_check is not None   # untampered, it decodes
    for field, tree in (("source_check", expr_to_json(Unknown("1 = 1) OR (1 = 1"))),
                        ("source_check", expr_to_json(Unknown("(SELECT 1) = 1"))),
                        ("source_values", {"country": expr_to_json(Unknown("1) AS x FROM y --"))}),
                        ("source_values", {"country": expr_to_json(Literal("${env:Q}"))})):
        with pytest.raises(JobSpecError):
            JobSpec.from_json(json.dumps({**base, field: tree}))
            pytest.fail(f"tampered {field} accepted")
