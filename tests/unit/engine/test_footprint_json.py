"""Footprints as JSON: a lease or a trigger carries them, and the verdicts do not change on the way."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_delta_occ.engine import FootprintDecodeError
from airflow_delta_occ.engine.actions import Metadata, Protocol
from airflow_delta_occ.engine.planner import MODELS, Footprint, Operation, can_conflict, verdict
from airflow_delta_occ.engine.snapshot import Snapshot

from .test_expr_json import JSON, _locations
from .test_planner import _table, fp

pytestmark = pytest.mark.unit

DE = {"date": "2024-01-01", "country": "DE"}
FR = {"date": "2024-01-01", "country": "FR"}
JOBS: list[tuple[Operation, str | None, dict[str, Any]]] = [
    (Operation.INSERT, None, {}),
    (Operation.INSERT, None, {"app_id": "loader", "write_partitions": [DE]}),
    (Operation.INSERT_SELF_READ, "country = 'DE'", {}),
    (Operation.MERGE, "country = 'DE'", {}),
    (Operation.MERGE, "country = 'FR'", {"write_partitions": [FR]}),
    (Operation.MERGE, "country = 'DE'", {"write_partitions": [DE], "reads_whole_table": True}),
    (Operation.MERGE, "t.id = s.id AND t.country = 'DE'", {"target_alias": "t"}),
    (Operation.UPDATE, "country = 'DE'", {}),
    (Operation.UPDATE, "upper(name) = 'X' AND country = 'FR'", {}),
    (Operation.DELETE, "id > 15", {}),
    (Operation.DELETE, "country = 'FR' OR country IS NULL", {"row_level_eligible": False}),
    (Operation.OPTIMIZE, "country = 'DE'", {}),
    (Operation.OPTIMIZE_ZORDER, "country = 'DE'", {}),
    (Operation.REPLACE_WHERE, "date = DATE'2024-01-01' AND country IN ('DE', 'FR')", {}),
    (Operation.REPLACE_WHERE, "country = 'FR'", {}),
    (Operation.OVERWRITE, None, {}),
    (Operation.SET_PROPERTIES, None, {"properties": {"owner": "team-a"}}),
    (Operation.SET_PROPERTIES, None, {"properties": {"delta.enableDeletionVectors": "true"}}),
    (Operation.SCHEMA_CHANGE, None, {}),
    (Operation.CREATE_TABLE, None, {}),
    (Operation.MINOR_COMPACT, None, {}),
    (Operation.MAJOR_COMPACT, None, {}),
]
TABLES = {"partitioned": {}, "unpartitioned_dv": {"partitioned": False, "dv": True},
          "write_serializable": {"level": "WriteSerializable"}}


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Snapshot]:
    return {name: _table(tmp_path_factory.mktemp(name), **kw) for name, kw in TABLES.items()}


def _footprints(snap: Snapshot) -> list[Footprint]:
    unpartitioned = not snap.partition_columns
    return [fp(snap, op, pred, **{k: v for k, v in kw.items() if not (unpartitioned and k == "write_partitions")})
            for op, pred, kw in JOBS]


def round_trip(footprint: Footprint) -> Footprint:
    return Footprint.from_json(json.loads(json.dumps(footprint.to_json(), allow_nan=False)))


@pytest.mark.parametrize("table", TABLES)
def test_footprints_round_trip_exactly(snapshots: dict[str, Snapshot], table: str) -> None:
    for footprint in _footprints(snapshots[table]):
        decoded = round_trip(footprint)
        assert decoded == footprint
        assert decoded.to_json() == footprint.to_json()


@pytest.mark.parametrize("table", TABLES)
def test_decoded_footprints_get_the_same_verdicts(snapshots: dict[str, Snapshot], table: str) -> None:
    snap = snapshots[table]
    originals = _footprints(snap)
    decoded = [round_trip(f) for f in originals]
    for (a, a2), (b, b2) in itertools.combinations_with_replacement(zip(originals, decoded, strict=True), 2):
        for model in MODELS:
            expected = can_conflict(a, b, snap, model)
            got = can_conflict(a2, b2, snap, model)
            assert (got, got.reason, got.orders) == (expected, expected.reason, expected.orders), (a.label, b.label)
            assert verdict(winner=a2, loser=b2, snapshot=snap, model=model) == verdict(
                winner=a, loser=b, snapshot=snap, model=model)


def test_the_form(snapshots: dict[str, Snapshot]) -> None:
    snap = snapshots["partitioned"]
    doc = fp(snap, Operation.MERGE, "country = 'DE'", app_id="job", write_partitions=[DE]).to_json()
    assert doc["operation"] == "MERGE" and doc["write_partitions"] == [DE]
    assert doc["read_predicate"]["kind"] == "comparison"
    assert doc["read_files"] == {"DE-0.parquet": DE, "DE-1.parquet": DE} == doc["removes"]
    assert doc["read_app_ids"] == ["job"] == doc["written_app_ids"]
    props = fp(snap, Operation.SET_PROPERTIES, properties={"delta.enableDeletionVectors": "true"}).to_json()
    assert props["metadata"]["configuration"] == {"delta.enableDeletionVectors": "true"}
    assert props["metadata"]["partitionColumns"] == ["date", "country"]  # the metaData action's own form
    assert props["protocol"] == {"minReaderVersion": 3, "minWriterVersion": 7,
                                 "readerFeatures": ["deletionVectors"], "writerFeatures": ["deletionVectors"]}
    assert isinstance(Footprint.from_json(props).metadata, Metadata)
    assert isinstance(Footprint.from_json(props).protocol, Protocol)


def test_fields_with_defaults_may_be_left_out(snapshots: dict[str, Snapshot]) -> None:
    footprint = fp(snapshots["partitioned"], Operation.UPDATE, "country = 'DE'")
    doc = footprint.to_json()
    for key in ("metadata", "protocol", "read_app_ids", "written_app_ids", "row_level_eligible", "read_predicate",
                "write_partitions"):
        del doc[key]
    decoded = Footprint.from_json(doc)
    assert decoded.metadata is None and decoded.read_app_ids == frozenset() and decoded.row_level_eligible
    assert decoded.read_predicate is None and decoded.write_partitions is None


def _valid(snapshots: dict[str, Snapshot]) -> dict[str, Any]:
    return fp(snapshots["partitioned"], Operation.SET_PROPERTIES, properties={"owner": "a"}).to_json()


@pytest.mark.parametrize(("key", "value", "message"), [
    ("operation", "TRUNCATE", "unknown operation 'TRUNCATE'"),
    ("operation", 1, "must be a string, got an integer"),
    ("label", None, "must be a string, got null"),
    ("read_whole_table", "false", "must be a boolean"),
    ("adds_files", 0, "must be a boolean, got an integer"),
    ("data_change", None, "must be a boolean"),
    ("blind_append", [], "must be a boolean"),
    ("row_level_eligible", 1, "must be a boolean"),
    ("read_files", [], "must be an object, got an array"),
    ("read_files", {"a.parquet": ["DE"]}, "partition values must be an object"),
    ("removes", {"a.parquet": {"country": 1}}, "partition value of 'country' must be a string or null"),
    ("write_partitions", {"country": "DE"}, "must be an array or null"),
    ("write_partitions", [{"country": True}], "must be a string or null"),
    ("read_app_ids", "app", "must be an array"),
    ("written_app_ids", ["a", 1], "must be an array of strings"),
    ("read_predicate", {"kind": "nope"}, "unknown node kind 'nope'"),
    ("read_predicate", "country = 'DE'", "must be an object, got a string"),
    ("metadata", [], "must be an object or null"),
    ("metadata", {"schemaString": "{}"}, "required field 'id' is missing"),
    ("metadata", {"id": "x", "schemaString": "not json"}, "schemaString is not valid JSON"),
    ("metadata", {"id": "x", "schemaString": "{}", "partitionColumns": "date"}, "'partitionColumns' must be"),
    ("protocol", {"minReaderVersion": 1}, "required field 'minWriterVersion' is missing"),
    ("protocol", {"minReaderVersion": -1, "minWriterVersion": 2}, "between 0 and 2^63-1"),
    ("protocol", {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": "dv"}, "array of strings"),
])
def test_bad_fields_are_named(snapshots: dict[str, Snapshot], key: str, value: Any, message: str) -> None:
    doc = _valid(snapshots)
    doc[key] = value
    with pytest.raises(FootprintDecodeError) as err:
        Footprint.from_json(doc)
    assert err.value.field is not None and err.value.field.startswith(key), err.value.field
    assert message in str(err.value) and f"field {key}" in str(err.value)


@pytest.mark.parametrize("key", ["operation", "label", "read_whole_table", "read_files", "removes", "adds_files",
                                 "data_change", "blind_append"])
def test_required_fields(snapshots: dict[str, Snapshot], key: str) -> None:
    doc = _valid(snapshots)
    del doc[key]
    with pytest.raises(FootprintDecodeError, match="required field is missing") as err:
        Footprint.from_json(doc)
    assert err.value.field == key


@pytest.mark.parametrize("doc", [None, [], "footprint", 3])
def test_not_an_object(doc: Any) -> None:
    with pytest.raises(FootprintDecodeError, match="must be an object"):
        Footprint.from_json(doc)


@pytest.fixture(scope="module")
def documents(snapshots: dict[str, Snapshot]) -> list[str]:
    return [json.dumps(f.to_json()) for f in _footprints(snapshots["partitioned"])]


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.data())
def test_mutated_footprints_decode_or_raise_the_typed_error(documents: list[str], data: st.DataObject) -> None:
    doc = json.loads(data.draw(st.sampled_from(documents)))
    container, key = data.draw(st.sampled_from(_locations(doc)))
    if data.draw(st.booleans()):
        container[key] = data.draw(JSON)
    else:
        del container[key]
    try:
        decoded = Footprint.from_json(doc)
    except FootprintDecodeError:
        return
    assert round_trip(decoded) == decoded
