"""Planning verdicts for pairs of jobs under the delta, databricks and maxcompute models."""

from __future__ import annotations

import pytest

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.expressions import TRUE
from airflow_delta_occ.engine.planner import Operation, can_conflict, plan_footprint, verdict

from .logbuilder import LogBuilder, add, commit_info, metadata, protocol

pytestmark = pytest.mark.unit


def _table(tmp_path, *, partitioned: bool = True, dv: bool = False, level: str | None = None):
    b = LogBuilder(tmp_path / "t")
    config = {}
    if dv:
        config["delta.enableDeletionVectors"] = "true"
    if level:
        config["delta.isolationLevel"] = level
    proto = protocol(3, 7, ["deletionVectors"], ["deletionVectors"]) if dv else protocol()
    b.commit(commit_info("CREATE TABLE"), proto,
             metadata(partition_columns=("date", "country") if partitioned else (), configuration=config))
    files = []
    for country in ("DE", "FR"):
        for i in range(2):
            pv = {"date": "2024-01-01", "country": country} if partitioned else {}
            stats = {"numRecords": 10, "minValues": {"id": i * 10}, "maxValues": {"id": i * 10 + 9},
                     "nullCount": {"id": 0}}
            files.append(add(f"{country}-{i}.parquet", pv, stats=stats))
    b.commit(commit_info(), *files)
    return DeltaLog.for_table(b.root).snapshot()


def fp(snap, op, pred=None, **kw):
    return plan_footprint(snap, op, pred, label=kw.pop("label", f"{op} {pred}"), **kw)


@pytest.mark.parametrize(("a", "b", "conflict", "exception"), [
    ((Operation.INSERT, None), (Operation.INSERT, None), False, None),
    ((Operation.MERGE, "country = 'DE'"), (Operation.MERGE, "country = 'FR'"), True, "ConcurrentAppendException"),
    ((Operation.UPDATE, "country = 'DE'"), (Operation.UPDATE, "country = 'FR'"), False, None),
    ((Operation.UPDATE, "country = 'DE'"), (Operation.DELETE, "country = 'DE'"), True, "ConcurrentAppendException"),
    ((Operation.UPDATE, "country = 'DE'"), (Operation.INSERT, None), True, "ConcurrentAppendException"),
    ((Operation.OPTIMIZE, "country = 'DE'"), (Operation.INSERT, None), False, None),
    ((Operation.OPTIMIZE, "country = 'DE'"), (Operation.DELETE, "country = 'DE'"), True, None),
    ((Operation.OPTIMIZE, "country = 'DE'"), (Operation.DELETE, "country = 'FR'"), False, None),
    ((Operation.REPLACE_WHERE, "date = DATE'2024-01-01' AND country = 'DE'"),
     (Operation.REPLACE_WHERE, "date = DATE'2024-01-01' AND country = 'FR'"), False, None),
    # Not every partition column pinned: the new rows may land anywhere, so the planner stays safe.
    ((Operation.REPLACE_WHERE, "country = 'DE'"), (Operation.REPLACE_WHERE, "country = 'FR'"), True, None),
])
def test_delta_model_partitioned(tmp_path, a, b, conflict, exception):
    snap = _table(tmp_path)
    v = can_conflict(fp(snap, *a), fp(snap, *b), snap, "delta")
    assert v.conflict is conflict, v.reason
    if exception:
        assert v.exception == exception


def test_metadata_changes(tmp_path):
    snap = _table(tmp_path)
    owner = fp(snap, Operation.SET_PROPERTIES, properties={"owner": "team-a"})
    v = can_conflict(owner, fp(snap, Operation.UPDATE, "country = 'DE'"), snap, "delta")
    assert v.conflict and v.exception == "MetadataChangedException"
    # Enabling deletion vectors is rebased over by delta-spark 4.1+, so it blocks nobody.
    enable_dv = fp(snap, Operation.SET_PROPERTIES, properties={"delta.enableDeletionVectors": "true"})
    assert not verdict(winner=enable_dv, loser=fp(snap, Operation.UPDATE, "country = 'DE'"), snapshot=snap)


def test_merge_with_pinned_write_partitions_is_disjoint(tmp_path):
    snap = _table(tmp_path)
    de = fp(snap, Operation.MERGE, "country = 'DE'", write_partitions=[{"date": "2024-01-01", "country": "DE"}])
    fr = fp(snap, Operation.MERGE, "country = 'FR'", write_partitions=[{"date": "2024-01-01", "country": "FR"}])
    assert not can_conflict(de, fr, snap, "delta")


def test_unpartitioned_dml_pairs_always_conflict_in_oss(tmp_path):
    snap = _table(tmp_path, partitioned=False, dv=True)
    v = can_conflict(fp(snap, Operation.UPDATE, "id < 5"), fp(snap, Operation.DELETE, "id > 15"), snap, "delta")
    assert v.conflict and v.exception == "ConcurrentAppendException"


def test_write_serializable_lets_blind_inserts_through(tmp_path):
    snap = _table(tmp_path, level="WriteSerializable")
    assert not can_conflict(fp(snap, Operation.UPDATE, "country = 'DE'"), fp(snap, Operation.INSERT), snap, "delta")
    snap = _table(tmp_path / "x")
    assert can_conflict(fp(snap, Operation.UPDATE, "country = 'DE'"), fp(snap, Operation.INSERT), snap, "delta")
    # Databricks defaults to WriteSerializable when the table sets nothing.
    assert not can_conflict(fp(snap, Operation.UPDATE, "country = 'DE'"), fp(snap, Operation.INSERT), snap,
                            "databricks")


def test_databricks_optimize_with_deletion_vectors(tmp_path):
    snap = _table(tmp_path, dv=True)
    dml = fp(snap, Operation.DELETE, "country = 'DE'")
    assert not can_conflict(fp(snap, Operation.OPTIMIZE, "country = 'DE'"), dml, snap, "databricks")
    assert can_conflict(fp(snap, Operation.OPTIMIZE_ZORDER, "country = 'DE'"), dml, snap, "databricks")
    assert can_conflict(fp(snap, Operation.OPTIMIZE, "country = 'DE'"), dml, snap, "delta")


def test_databricks_row_level_concurrency(tmp_path):
    snap = _table(tmp_path, partitioned=False, dv=True)
    v = can_conflict(fp(snap, Operation.UPDATE, "id < 5"), fp(snap, Operation.DELETE, "id > 15"), snap, "databricks")
    assert v.conflict and "same row" in v.reason
    assert not can_conflict(fp(snap, Operation.UPDATE, "id < 5"), fp(snap, Operation.INSERT), snap, "databricks")


@pytest.mark.parametrize(("earlier", "later", "later_fails"), [
    (Operation.OVERWRITE, Operation.INSERT, True),
    (Operation.INSERT, Operation.OVERWRITE, False),
    (Operation.INSERT, Operation.MINOR_COMPACT, False),
    (Operation.INSERT, Operation.MAJOR_COMPACT, True),
    (Operation.MINOR_COMPACT, Operation.UPDATE, False),
    (Operation.MAJOR_COMPACT, Operation.MINOR_COMPACT, True),
    (Operation.UPDATE, Operation.DELETE, True),
])
def test_maxcompute_order_matters(tmp_path, earlier, later, later_fails):
    snap = _table(tmp_path, partitioned=False)
    v = verdict(winner=fp(snap, earlier), loser=fp(snap, later), snapshot=snap, model="maxcompute")
    assert v.conflict is later_fails, v.reason


def test_maxcompute_disjoint_partitions(tmp_path):
    snap = _table(tmp_path)
    a = fp(snap, Operation.UPDATE, "country = 'DE'")
    b = fp(snap, Operation.DELETE, "country = 'FR'")
    assert not can_conflict(a, b, snap, "maxcompute")
    assert can_conflict(a, fp(snap, Operation.INSERT), snap, "maxcompute")


def test_unknown_model(tmp_path):
    snap = _table(tmp_path)
    with pytest.raises(ValueError, match="unknown conflict model"):
        can_conflict(fp(snap, Operation.INSERT), fp(snap, Operation.INSERT), snap, "oracle")  # type: ignore[arg-type]


def test_merge_with_not_matched_by_source_reads_the_whole_table(tmp_path):
    """delta-spark scans every file for such a MERGE (``filterFiles(true)``), however confined it is."""
    snap = _table(tmp_path)
    pinned = {"write_partitions": [{"date": "2024-01-01", "country": "DE"}]}
    nmbs = fp(snap, Operation.MERGE, "country = 'DE'", reads_whole_table=True, **pinned)
    assert nmbs.read_whole_table and len(nmbs.read_files) == 4
    assert nmbs.read_predicate == TRUE
    fr_update = fp(snap, Operation.UPDATE, "country = 'FR'")
    v = verdict(winner=fr_update, loser=nmbs, snapshot=snap)
    assert v.conflict and v.exception == "ConcurrentAppendException", v.reason
    plain = fp(snap, Operation.MERGE, "country = 'DE'", **pinned)
    assert set(plain.removes) == {"DE-0.parquet", "DE-1.parquet"}
    assert not can_conflict(plain, fr_update, snap, "delta")


def test_merge_with_not_matched_by_source_rewrites_every_file(tmp_path):
    """Measured on delta-spark 4.4: such a MERGE confined to DE removes and re-adds the files of every
    partition (FR's rows are copied), so a job that read FR fails when the MERGE commits first."""
    snap = _table(tmp_path)
    pinned = {"write_partitions": [{"date": "2024-01-01", "country": "DE"}]}
    nmbs = fp(snap, Operation.MERGE, "country = 'DE'", reads_whole_table=True, **pinned)
    assert set(nmbs.removes) == {"DE-0.parquet", "DE-1.parquet", "FR-0.parquet", "FR-1.parquet"}
    assert sorted(p["country"] for p in nmbs.write_partitions or ()) == ["DE", "FR"]
    fr_update = fp(snap, Operation.UPDATE, "country = 'FR'")
    v = verdict(winner=nmbs, loser=fr_update, snapshot=snap)
    assert v.conflict and v.exception == "ConcurrentAppendException", v.reason  # as delta-spark raised it
    fr_optimize = fp(snap, Operation.OPTIMIZE, "country = 'FR'")
    v = verdict(winner=nmbs, loser=fr_optimize, snapshot=snap)
    assert v.conflict and v.exception == "ConcurrentDeleteReadException", v.reason
    # A blind append into FR reads nothing: it commits after the MERGE, as on delta-spark.
    fr_append = fp(snap, Operation.INSERT, write_partitions=[{"date": "2024-01-01", "country": "FR"}])
    assert not verdict(winner=nmbs, loser=fr_append, snapshot=snap)


def test_planning_on_partitions_of_a_table_without_checkpoint_loads_neither_pyarrow_nor_numpy(tmp_path):
    """Columnar state is loaded for a checkpoint's rows or a statistics filter, not to plan on partitions."""
    import json
    import subprocess
    import sys

    root = _table(tmp_path).log.table_uri
    code = (
        "import sys\n"
        "from airflow_delta_occ.engine import DeltaLog, Footprint, Operation, can_conflict, plan_footprint\n"
        "from airflow_delta_occ.engine.planner import TableState\n"
        f"snap = DeltaLog.for_table({root!r}).snapshot()\n"
        "de = plan_footprint(snap, Operation.MERGE, \"country = 'DE'\", label='de')\n"
        "fr = plan_footprint(snap, Operation.UPDATE, \"country = 'FR'\", label='fr')\n"
        "state = TableState.of(snap)\n"
        "v = can_conflict(Footprint.from_json(de.to_json()), fr, TableState.from_json(state.to_json()))\n"
        "plain = sorted(m for m in ('pyarrow', 'numpy') if m in sys.modules)\n"
        "stats = [f.path for f in snap.files_matching(\"country = 'DE' AND id >= 10\")]\n"
        "print(__import__('json').dumps([v.conflict, sorted(de.read_files), plain, stats]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    conflict, read, loaded, stats = json.loads(out.stdout.strip().splitlines()[-1])
    assert (conflict, read, loaded, stats) == (True, ["DE-0.parquet", "DE-1.parquet"], [], ["DE-1.parquet"])
