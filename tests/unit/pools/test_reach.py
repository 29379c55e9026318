"""Reach: two leased jobs whose reaches share no partition never conflict, so the arbiter may skip the pair.

The arbiter compares a request only with the jobs its reach meets (``arbiter.decide``). A reach that is
too narrow would let two conflicting jobs hold leases at once, so every pair of the planner's scenarios
is checked against ``lease_verdict`` itself, for every model, with and without deletion vectors.
"""

from __future__ import annotations

import copy
import datetime
import itertools
from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.planner import MODELS, TableState, plan_footprint
from airflow_delta_occ.pools.compare import PlannedJob, compact, lease_verdict, reach

from ..engine.logbuilder import SCHEMA, LogBuilder, add, commit_info, metadata, protocol
from .test_compare import PARTITIONED_MENU, UNPARTITIONED_MENU

pytestmark = pytest.mark.unit

MORE_PARTITIONED: list[tuple[str, str | None, dict[str, Any]]] = [
    ("UPDATE", "country IS NULL", {}),
    ("UPDATE", "country IN ('DE', 'FR') AND date = '2024-01-02'", {}),
    ("DELETE", "(country = 'IT' OR country = 'ES') AND id > 3", {}),
    ("UPDATE", "date = '2024-01-01' OR id = 7", {}),                 # pins nothing: may touch any partition
    ("UPDATE", "date > '2024-01-01' AND country = 'FR'", {}),
    ("INSERT", None, {"write_partitions": [{"date": "2024-01-09", "country": None}]}),
    ("INSERT", None, {"write_partitions": [{"date": "2024-01-02", "country": "FR"}]}),
    ("OPTIMIZE", "country = 'DE'", {}),
    ("REPLACE_WHERE", "date = '2024-01-02' AND country IN ('DE', 'FR')", {}),
    ("MERGE", "t.id = s.id AND t.date = '2024-01-02' AND t.country = 'DE'",
     {"target_alias": "t", "write_partitions": [{"date": "2024-01-02", "country": "DE"}]}),
]


def _table(root: Path, partitioned: bool, dv: bool, identity: bool) -> TableState:
    schema = copy.deepcopy(SCHEMA)
    if identity:
        schema["fields"][0]["metadata"] = {"delta.identity.start": 1, "delta.identity.step": 1}
    b = LogBuilder(root)
    config = {"delta.enableDeletionVectors": "true"} if dv else None
    b.commit(commit_info("CREATE TABLE"), protocol(),
             metadata(("date", "country") if partitioned else (), config, schema=schema))
    b.commit(commit_info(), *(add(f"f{i}.parquet", {"date": d, "country": c} if partitioned else {})
                              for i, (d, c) in enumerate(itertools.product(("2024-01-01", "2024-01-02"),
                                                                           ("DE", "FR", None)))))
    return b.root


@pytest.mark.parametrize("partitioned,dv,identity", [(True, False, False), (True, True, False),
                                                     (True, False, True), (False, True, False)])
@pytest.mark.parametrize("model", MODELS)
def test_jobs_whose_reaches_do_not_meet_never_conflict(tmp_path: Path, partitioned: bool, dv: bool,
                                                       identity: bool, model: str) -> None:
    snapshot = DeltaLog.for_table(_table(tmp_path / "t", partitioned, dv, identity)).snapshot()
    state = TableState.of(snapshot)
    menu = [*PARTITIONED_MENU, *MORE_PARTITIONED] if partitioned else UNPARTITIONED_MENU
    jobs = [PlannedJob(compact(plan_footprint(snapshot, op, predicate, label=f"{i}:{op} {predicate}", **options)),
                       state) for i, (op, predicate, options) in enumerate(menu)]
    reaches = [reach(job, model) for job in jobs]  # type: ignore[arg-type]
    apart = 0
    for (a, ra), (b, rb) in itertools.combinations(zip(jobs, reaches, strict=True), 2):
        assert ra.layout == rb.layout
        if not ra.apart(rb):
            continue
        apart += 1
        judged = lease_verdict(a, b, model)  # type: ignore[arg-type]
        assert not judged.conflict, f"{a.footprint.label} / {b.footprint.label} reach apart but {judged.reason}"
    if partitioned and not (identity and model == "databricks"):
        assert apart >= 40, "the index must leave most partition-disjoint pairs out"
    else:
        assert apart == 0, "on one partition, or with identity columns, every pair is compared"


def test_a_partition_is_one_key_however_its_value_was_written(tmp_path: Path) -> None:
    snapshot = DeltaLog.for_table(_table(tmp_path / "t", True, False, False)).snapshot()
    state = TableState.of(snapshot)
    pinned = PlannedJob(compact(plan_footprint(snapshot, "UPDATE", "date = DATE'2024-01-02' AND country = 'FR'")),
                        state)
    written = PlannedJob(compact(plan_footprint(snapshot, "INSERT", None, write_partitions=[
        {"date": "2024-01-02", "country": "FR"}])), state)
    a, b = reach(pinned, "delta"), reach(written, "delta")
    assert a.columns is not None and b.columns is not None and not a.apart(b)
    assert lease_verdict(pinned, written, "delta").conflict


def test_what_may_touch_any_partition_has_no_bounded_reach(tmp_path: Path) -> None:
    snapshot = DeltaLog.for_table(_table(tmp_path / "t", True, False, False)).snapshot()
    state = TableState.of(snapshot)

    def reach_of(op: str, predicate: str | None, **options: Any) -> object:
        return reach(PlannedJob(compact(plan_footprint(snapshot, op, predicate, **options)), state), "delta").columns

    assert reach_of("OPTIMIZE", None) == (None, None)               # whole table
    assert reach_of("INSERT", None) is None                         # new files anywhere
    assert reach_of("UPDATE", "date > '2024-01-01'") == (None, None)   # a range leaves the column open
    assert reach_of("SET_PROPERTIES", None, properties={"a": "b"}) is None   # a metadata change
    assert reach_of("UPDATE", "date = '2024-01-01' AND country = 'DE'") == (
        frozenset({datetime.date(2024, 1, 1)}), frozenset({"DE"}))
    assert reach_of("UPDATE", "country = 'FR'") == (None, frozenset({"FR"}))   # one column pinned is enough
    # pinned only inside a conjunct on two columns: left open, as the lease comparison leaves it
    assert reach_of("UPDATE", "(country = 'FR' AND date = '2024-01-01') OR (country = 'DE' AND id = 1)") == (
        None, None)


def _log(root: Path) -> LogBuilder:
    return LogBuilder(root)


def test_binary_partition_values_are_compared_as_the_filter_compares_them(tmp_path: Path) -> None:
    """Review: a pin was formatted and parsed back before it was indexed, which changes non-ASCII bytes, so a
    DELETE of k = X'C3BF' and an INSERT into the partition holding those bytes were taken for apart."""
    schema = copy.deepcopy(SCHEMA)
    schema["fields"].append({"name": "k", "type": "binary", "nullable": True, "metadata": {}})
    b = _log(tmp_path / "t")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata(("k",), schema=schema))
    b.commit(commit_info(), add("a.parquet", {"k": "a"}))
    snapshot = DeltaLog.for_table(b.root).snapshot()
    state = TableState.of(snapshot)
    delete = PlannedJob(compact(plan_footprint(snapshot, "DELETE", "k = X'C3BF'", label="delete")), state)
    insert = PlannedJob(compact(plan_footprint(snapshot, "INSERT", None, label="insert",
                                               write_partitions=[{"k": b"\xff"}])), state)
    for model in MODELS:
        if lease_verdict(delete, insert, model).conflict:  # type: ignore[arg-type]
            assert not reach(delete, model).apart(reach(insert, model)), model  # type: ignore[arg-type]


def test_plans_under_different_physical_names_are_never_apart(tmp_path: Path) -> None:
    """Review: a table replaced under column mapping keeps its logical schema with new physical names; a lease
    comparison reads one plan's partition values under the other's names (NULL, which meets every filter)."""
    def schema_with(prefix: str) -> dict[str, Any]:
        schema = copy.deepcopy(SCHEMA)
        for i, f in enumerate(schema["fields"]):
            f["metadata"] = {"delta.columnMapping.id": i + 1,
                             "delta.columnMapping.physicalName": f"{prefix}-{f['name']}"}
        return schema
    config = {"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "4"}
    b = _log(tmp_path / "t")
    b.commit(commit_info("CREATE TABLE"), protocol(2, 5), metadata(("country",), config, schema=schema_with("old")))
    b.commit(commit_info(), add("a.parquet", {"old-country": "DE"}), add("b.parquet", {"old-country": "FR"}))
    b.commit(commit_info("CREATE OR REPLACE TABLE"), protocol(2, 5),
             metadata(("country",), config, schema=schema_with("new")),
             {"remove": {"path": "a.parquet", "deletionTimestamp": 1, "dataChange": True}},
             {"remove": {"path": "b.parquet", "deletionTimestamp": 1, "dataChange": True}})
    b.commit(commit_info(), add("c.parquet", {"new-country": "DE"}), add("d.parquet", {"new-country": "FR"}))
    log = DeltaLog.for_table(b.root)
    old, new = log.snapshot(1), log.snapshot(3)
    de = PlannedJob(compact(plan_footprint(old, "DELETE", "country = 'DE'", label="de")), TableState.of(old))
    fr = PlannedJob(compact(plan_footprint(new, "DELETE", "country = 'FR'", label="fr")), TableState.of(new))
    assert lease_verdict(de, fr, "delta").conflict
    assert not reach(de, "delta").apart(reach(fr, "delta"))


def test_nan_partitions_are_one_value_as_spark_compares_them(tmp_path: Path) -> None:
    schema = copy.deepcopy(SCHEMA)
    schema["fields"].append({"name": "x", "type": "double", "nullable": True, "metadata": {}})
    b = _log(tmp_path / "t")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata(("x",), schema=schema))
    b.commit(commit_info(), add("a.parquet", {"x": "NaN"}), add("b.parquet", {"x": "1.0"}))
    snapshot = DeltaLog.for_table(b.root).snapshot()
    state = TableState.of(snapshot)
    nan = PlannedJob(compact(plan_footprint(snapshot, "DELETE", "x = double('NaN')", label="nan")), state)
    into_nan = PlannedJob(compact(plan_footprint(snapshot, "INSERT", None, label="into",
                                                 write_partitions=[{"x": float("nan")}])), state)
    into_one = PlannedJob(compact(plan_footprint(snapshot, "INSERT", None, label="into one",
                                                 write_partitions=[{"x": 1.0}])), state)
    assert lease_verdict(nan, into_nan, "delta").conflict and not reach(nan, "delta").apart(reach(into_nan, "delta"))
    assert reach(into_nan, "delta").columns == (frozenset({(1, 0.0)}),)   # NaN = NaN, as Spark has it
    assert reach(into_nan, "delta").apart(reach(into_one, "delta"))
