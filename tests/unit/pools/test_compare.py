"""Lease verdicts: never less cautious than the planner, robust to plans at different versions, and still
concurrent for jobs confined to different partitions."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog, Snapshot
from airflow_delta_occ.engine.planner import MODELS, Footprint, TableState, can_conflict, plan_footprint
from airflow_delta_occ.pools.compare import PairJudge, PlannedJob, compact, lease_verdict

from ..engine.logbuilder import LogBuilder, add, commit_info, metadata, protocol

pytestmark = pytest.mark.unit


def _stats(low: int, high: int) -> dict[str, Any]:
    return {"numRecords": 10, "minValues": {"id": low}, "maxValues": {"id": high}, "nullCount": {"id": 0}}


def _table(root: Path, partitioned: bool, dv: bool = False) -> LogBuilder:
    b = LogBuilder(root)
    config = {"delta.enableDeletionVectors": "true"} if dv else None
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata(("date", "country") if partitioned else (), config))
    files = []
    for i, (date, country) in enumerate(itertools.product(("2024-01-01", "2024-01-02"), ("DE", "FR"))):
        for j in range(2):
            files.append(add(f"f{i}{j}.parquet", {"date": date, "country": country} if partitioned else {},
                             stats=_stats(100 * i + 10 * j, 100 * i + 10 * j + 9)))
    b.commit(commit_info(), *files)
    return b


# (operation, predicate, planner options): a menu like the differential suite's, in partition terms
PARTITIONED_MENU: list[tuple[str, str | None, dict[str, Any]]] = [
    ("UPDATE", "country = 'DE' AND date = '2024-01-01'", {}),
    ("UPDATE", "country = 'FR'", {}),
    ("DELETE", "country = 'DE' AND id >= 5", {}),
    ("DELETE", "date >= '2024-01-02' AND id < 120", {}),
    ("MERGE", "t.id = s.id AND t.country = 'DE' AND t.date = '2024-01-01'",
     {"target_alias": "t", "write_partitions": [{"date": "2024-01-01", "country": "DE"}]}),
    ("MERGE", "t.id = s.id AND t.country = 'FR'", {"target_alias": "t"}),
    ("MERGE", "t.country = 'IT' AND t.date = '2024-01-03'",
     {"target_alias": "t", "write_partitions": [{"date": "2024-01-03", "country": "IT"}], "reads_whole_table": True}),
    ("OPTIMIZE", None, {}),
    ("OPTIMIZE", "date = '2024-01-02'", {}),
    ("OPTIMIZE_ZORDER", "country = 'FR' AND date = '2024-01-02'", {}),
    ("INSERT", None, {"write_partitions": [{"date": "2024-01-01", "country": "DE"}]}),
    ("INSERT", None, {"write_partitions": [{"date": "2024-01-03", "country": "ES"}]}),
    ("INSERT", None, {}),
    ("INSERT_SELF_READ", "country = 'FR'", {"write_partitions": [{"date": "2024-01-01", "country": "FR"}]}),
    ("REPLACE_WHERE", "country = 'ES' AND date = '2024-01-03'", {}),
    ("UPDATE", "country = 'ES'", {}),                              # a partition with no files yet
    ("SET_PROPERTIES", None, {"properties": {"team": "x"}}),
    ("SCHEMA_CHANGE", None, {}),
]
UNPARTITIONED_MENU: list[tuple[str, str | None, dict[str, Any]]] = [
    ("UPDATE", "id < 5", {}),
    ("DELETE", "id >= 300", {}),
    ("MERGE", "t.id = s.id", {"target_alias": "t"}),
    ("OPTIMIZE", None, {}),
    ("INSERT", None, {}),
    ("SET_PROPERTIES", None, {"properties": {"team": "x"}}),
]


def _footprints(snapshot: Snapshot, menu: list[tuple[str, str | None, dict[str, Any]]]) -> list[Footprint]:
    return [plan_footprint(snapshot, op, predicate, label=f"{i}:{op} {predicate}", **options)
            for i, (op, predicate, options) in enumerate(menu)]


@pytest.mark.parametrize("partitioned,dv", [(True, False), (True, True), (False, False), (False, True)])
@pytest.mark.parametrize("model", MODELS)
def test_a_lease_verdict_is_never_less_cautious_than_the_planner(tmp_path: Path, partitioned: bool, dv: bool,
                                                                  model: str) -> None:
    snapshot = DeltaLog.for_table(_table(tmp_path / "t", partitioned, dv).root).snapshot()
    state = TableState.of(snapshot)
    footprints = _footprints(snapshot, PARTITIONED_MENU if partitioned else UNPARTITIONED_MENU)
    judged = 0
    for a, b in itertools.combinations_with_replacement(footprints, 2):
        planner = can_conflict(a, b, snapshot, model)  # type: ignore[arg-type]
        lease = lease_verdict(PlannedJob(compact(a), state), PlannedJob(compact(b), state), model)  # type: ignore[arg-type]
        if planner.conflict:
            assert lease.conflict, f"{a.label} / {b.label}: planner says {planner.reason}; lease says {lease.reason}"
        judged += 1
    assert judged == len(footprints) * (len(footprints) + 1) // 2


@pytest.fixture
def sales(tmp_path: Path) -> LogBuilder:
    return _table(tmp_path / "sales", partitioned=True)


def _at(builder: LogBuilder) -> Snapshot:
    return DeltaLog.for_table(builder.root).snapshot()


def _job(snapshot: Snapshot, op: str, predicate: str | None = None, **options: Any) -> PlannedJob:
    return PlannedJob(compact(plan_footprint(snapshot, op, predicate, label=f"{op} {predicate}", **options)),
                      TableState.of(snapshot))


def test_jobs_confined_to_different_partitions_stay_concurrent(sales: LogBuilder) -> None:
    snapshot = _at(sales)
    de = _job(snapshot, "UPDATE", "country = 'DE'")                 # date left open
    fr = _job(snapshot, "DELETE", "country = 'FR' AND id > 3")
    fr_merge = _job(snapshot, "MERGE", "t.id = s.id AND t.country = 'FR' AND t.date = '2024-01-02'",
                    target_alias="t", write_partitions=[{"date": "2024-01-02", "country": "FR"}])
    for model in MODELS:
        assert not lease_verdict(de, fr, model), model
        assert not lease_verdict(de, fr_merge, model), model
    assert lease_verdict(fr, fr_merge, "delta").conflict


def test_two_open_ranges_may_meet_in_a_partition_neither_plan_knows(sales: LogBuilder) -> None:
    snapshot = _at(sales)
    later = _job(snapshot, "UPDATE", "date >= '2024-02-01'")     # no file today
    later_too = _job(snapshot, "DELETE", "date > '2024-03-01'")
    assert not can_conflict(later.footprint, later_too.footprint, snapshot, "delta")  # nothing to touch today
    verdict = lease_verdict(later, later_too, "delta")
    assert verdict.conflict, "a partition created before they run may be rewritten by both"
    pinned = _job(snapshot, "UPDATE", "date = '2024-01-15'")
    assert not lease_verdict(later, pinned, "delta"), "a pinned partition the range does not admit never meets it"


def test_an_update_of_a_partition_with_no_files_yet_conflicts_with_an_insert_into_it(sales: LogBuilder) -> None:
    snapshot = _at(sales)
    update_es = _job(snapshot, "UPDATE", "country = 'ES' AND date = '2024-01-03'")
    insert_es = _job(snapshot, "INSERT", write_partitions=[{"date": "2024-01-03", "country": "ES"}])
    # At plan time the UPDATE touches no file; once the INSERT commits, it rewrites the new ones.
    assert not can_conflict(update_es.footprint, insert_es.footprint, snapshot, "maxcompute")
    assert lease_verdict(update_es, insert_es, "maxcompute").conflict
    assert lease_verdict(update_es, insert_es, "delta").conflict


def test_plans_at_different_versions_are_compared_by_partition(sales: LogBuilder) -> None:
    before = _at(sales)
    compaction = _job(before, "OPTIMIZE", "country = 'DE' AND date = '2024-01-01'")
    sales.commit(commit_info(), add("new.parquet", {"date": "2024-01-01", "country": "DE"}, stats=_stats(900, 999)))
    after = _at(sales)
    delete_new = _job(after, "DELETE", "country = 'DE' AND date = '2024-01-01' AND id >= 900")
    assert delete_new.footprint.removes and compaction.table.version < delete_new.table.version
    # The compaction, planned before new.parquet existed, will compact it too when it runs.
    verdict = lease_verdict(compaction, delete_new, "delta")
    assert verdict.conflict, verdict.reason
    other = _job(after, "DELETE", "country = 'FR' AND id >= 900")
    assert not lease_verdict(compaction, other, "delta")


def test_a_metadata_change_between_plans_is_judged_under_both_states(sales: LogBuilder) -> None:
    before = _at(sales)
    append_de = _job(before, "INSERT", write_partitions=[{"date": "2024-01-05", "country": "DE"}])
    sales.commit(commit_info("SET TBLPROPERTIES"),
                 metadata(configuration={"delta.isolationLevel": "WriteSerializable"}))
    after = _at(sales)
    merge_de = _job(after, "MERGE", "t.country = 'DE'", target_alias="t",
                    write_partitions=[{"date": "2024-01-05", "country": "DE"}])
    # Under WriteSerializable a blind append never fails a MERGE; under the Serializable it was planned at, it does.
    assert not can_conflict(append_de.footprint, merge_de.footprint, TableState.of(after), "delta")
    assert lease_verdict(append_de, merge_de, "delta").conflict


def test_a_repartitioned_table_always_conflicts(tmp_path: Path, sales: LogBuilder) -> None:
    flat = _at(_table(tmp_path / "flat", partitioned=False))
    verdict = lease_verdict(_job(_at(sales), "INSERT"), _job(flat, "INSERT"), "delta")
    assert verdict.conflict and "partitioning changed" in verdict.reason


def test_the_judge_remembers_pairs_and_treats_an_unjudgeable_pair_as_a_conflict(sales: LogBuilder) -> None:
    snapshot = _at(sales)
    a, b = _job(snapshot, "UPDATE", "country = 'DE'"), _job(snapshot, "UPDATE", "country = 'FR'")
    judge = PairJudge(capacity=1)
    assert not judge.verdict("a", a, "b", b, "delta") and not judge.verdict("b", b, "a", a, "delta")
    broken = PlannedJob(a.footprint, TableState(snapshot.version, snapshot.metadata, snapshot.protocol))
    verdict = judge.verdict("x", broken, "y", b, "no-such-model")  # type: ignore[arg-type]
    assert verdict.conflict and "could not compare" in verdict.reason


def test_compact_keeps_one_entry_per_partition(sales: LogBuilder) -> None:
    footprint = plan_footprint(_at(sales), "OPTIMIZE", None)
    assert len(footprint.removes) == 8
    small = compact(footprint)
    assert len(small.removes) == len(small.read_files) == 4
    assert Footprint.from_json(small.to_json()) == small


def test_the_null_partition_is_judged_like_any_other(sales: LogBuilder) -> None:
    snapshot = _at(sales)
    null_country = _job(snapshot, "UPDATE", "country IS NULL")
    de = _job(snapshot, "UPDATE", "country = 'DE'")
    into_null = _job(snapshot, "INSERT", write_partitions=[{"date": "2024-01-09", "country": None}])
    into_de = _job(snapshot, "INSERT", write_partitions=[{"date": "2024-01-09", "country": "DE"}])
    assert not lease_verdict(null_country, de, "delta"), "country IS NULL never meets country = 'DE'"
    assert lease_verdict(null_country, into_null, "delta").conflict, "an append into the NULL partition is read"
    assert not lease_verdict(null_country, into_de, "delta")
    assert lease_verdict(de, into_de, "delta").conflict


def test_a_null_partition_beside_values_is_compacted_and_judged(tmp_path: Path) -> None:
    """An OPTIMIZE of a table with a NULL partition value beside others failed to build its lease request:
    partitions were sorted as tuples, and None does not compare with a string."""
    b = LogBuilder(tmp_path / "t")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata(("date", "country")))
    b.commit(commit_info(), add("a.parquet", {"date": "2024-01-01", "country": "DE"}),
             add("b.parquet", {"date": "2024-01-01", "country": None}))
    snapshot = _at(b)
    optimize = _job(snapshot, "OPTIMIZE")
    assert len(optimize.footprint.removes) == 2
    verdict = lease_verdict(optimize, _job(snapshot, "UPDATE", "country IS NULL"), "delta")
    assert verdict.conflict and "could not compare" not in verdict.reason
    assert not lease_verdict(optimize, _job(snapshot, "INSERT", write_partitions=[
        {"date": "2024-01-01", "country": None}]), "delta").conflict   # compaction and a blind append
