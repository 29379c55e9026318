"""Snapshot reconstruction from hand-written logs: reconciliation, checkpoints, time travel, errors."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from airflow_delta_occ.engine import (
    DeltaLog,
    InvalidVersionError,
    LogCorruptError,
    TableNotFoundError,
    UnsupportedProtocolError,
    VersionNotFoundError,
)
from airflow_delta_occ.engine.actions import AddFile

from .logbuilder import LogBuilder, add, commit_info, domain, dv, metadata, protocol, remove, txn

pytestmark = pytest.mark.unit


def _paths(snapshot) -> set[str]:
    return set(snapshot.file_paths())


@pytest.fixture
def table(tmp_path) -> LogBuilder:
    b = LogBuilder(tmp_path / "t")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata())
    return b


def _grow(b: LogBuilder, n: int) -> None:
    """Append ``n`` commits, each adding one file and removing the oldest every third commit."""
    for i in range(n):
        actions = [commit_info(), add(f"date=2024-01-0{i % 3 + 1}/f{i}.parquet",
                                      {"date": f"2024-01-0{i % 3 + 1}", "country": "DE" if i % 2 else "FR"})]
        if i % 3 == 2:
            actions.append(remove(f"date=2024-01-0{(i - 2) % 3 + 1}/f{i - 2}.parquet"))
        b.commit(*actions)


def test_reconciles_adds_and_removes_by_path(table):
    _grow(table, 9)
    snap = DeltaLog.for_table(table.root).snapshot()
    assert snap.version == 9
    assert _paths(snap) == {f"date=2024-01-0{i % 3 + 1}/f{i}.parquet" for i in range(9) if i not in (0, 3, 6)}
    assert snap.num_files == 6


def test_time_travel_gives_each_version(table):
    _grow(table, 6)
    log = DeltaLog.for_table(table.root)
    assert _paths(log.snapshot(1)) == {"date=2024-01-01/f0.parquet"}
    assert _paths(log.snapshot(3)) == {"date=2024-01-02/f1.parquet", "date=2024-01-03/f2.parquet"}
    assert log.snapshot(0).num_files == 0


def test_deletion_vector_update_replaces_only_its_logical_file(table):
    table.commit(commit_info(), add("a.parquet", {"date": "2024-01-01", "country": "DE"}))
    # DELETE with deletion vectors: remove the old logical file, add the same path with a DV.
    table.commit(commit_info("DELETE"), remove("a.parquet"),
                 add("a.parquet", {"date": "2024-01-01", "country": "DE"}, dv=dv("dv1")))
    table.commit(commit_info("DELETE"), remove("a.parquet", dv=dv("dv1")),
                 add("a.parquet", {"date": "2024-01-01", "country": "DE"}, dv=dv("dv2", cardinality=2)))
    snap = DeltaLog.for_table(table.root).snapshot()
    files = snap.files()
    assert len(files) == 1
    assert files[0].deletion_vector is not None
    assert files[0].deletion_vector.path_or_inline_dv == "dv2"
    assert files[0].deletion_vector.unique_id == "udv2@1"


def test_remove_with_other_dv_does_not_remove_file(table):
    table.commit(commit_info(), add("a.parquet", {"date": "2024-01-01", "country": "DE"}, dv=dv("x")))
    table.commit(commit_info(), remove("a.parquet", dv=dv("other")))
    assert DeltaLog.for_table(table.root).snapshot().num_files == 1


def test_latest_metadata_protocol_txn_and_domains_win(table):
    table.commit(commit_info(), txn("app-1", 3), domain("d1", '{"a":1}'), domain("d2"))
    table.commit(commit_info("SET TBLPROPERTIES"),
                 metadata(configuration={"delta.isolationLevel": "Serializable",
                                         "delta.enableDeletionVectors": "true"}),
                 protocol(3, 7, ["deletionVectors"], ["deletionVectors"]),
                 txn("app-1", 4), txn("app-2", 1), domain("d2", removed=True))
    snap = DeltaLog.for_table(table.root).snapshot()
    assert snap.isolation_level == "Serializable"
    assert snap.deletion_vectors_enabled is True
    assert snap.reader_features == frozenset({"deletionVectors"})
    assert snap.app_transaction_version("app-1") == 4
    assert snap.app_transaction_version("app-2") == 1
    assert snap.app_transaction_version("nope") is None
    assert set(snap.domain_metadata) == {"d1"}
    assert snap.commit_info is not None and snap.commit_info.operation == "SET TBLPROPERTIES"
    # Before the change, the defaults apply.
    old = DeltaLog.for_table(table.root).snapshot(1)
    assert old.isolation_level == "WriteSerializable"
    assert old.deletion_vectors_enabled is False


def test_schema_and_partition_values_are_typed(table):
    table.commit(commit_info(), add("x.parquet", {"date": "2024-02-29", "country": None}))
    snap = DeltaLog.for_table(table.root).snapshot()
    assert snap.schema.field_names == ["id", "name", "date", "country"]
    assert snap.schema.find("DATE").type.name == "date"
    assert snap.partition_values(snap.files()[0]) == {"date": dt.date(2024, 2, 29), "country": None}


@pytest.mark.parametrize("parts", [1, 3])
def test_checkpoint_plus_commits_equals_json_replay(table, parts):
    _grow(table, 12)
    expected = {v: _paths(DeltaLog.for_table(table.root).snapshot(v)) for v in range(13)}
    table.checkpoint(6, parts=parts)
    table.delete_commits(range(0, 6))  # log cleanup: only the checkpoint can rebuild 6..
    log = DeltaLog.for_table(table.root)
    for v in range(6, 13):
        assert _paths(log.snapshot(v)) == expected[v], v
    with pytest.raises(VersionNotFoundError, match="version 3 cannot be read"):
        log.snapshot(3)


@pytest.mark.parametrize("top_level", ["json", "parquet"])
def test_v2_checkpoint_with_sidecars(table, top_level):
    _grow(table, 10)
    table.commit(commit_info(), txn("app", 7))
    expected = _paths(DeltaLog.for_table(table.root).snapshot())
    expected_at_8 = _paths(DeltaLog.for_table(table.root).snapshot(8))
    table.v2_checkpoint(8, sidecars=3, top_level=top_level)
    table.delete_commits(range(0, 8))
    snap = DeltaLog.for_table(table.root).snapshot()
    assert _paths(snap) == expected
    assert snap.app_transaction_version("app") == 7
    assert _paths(DeltaLog.for_table(table.root).snapshot(8)) == expected_at_8


def test_v2_checkpoint_missing_sidecar_names_it(table):
    _grow(table, 4)
    _, sidecars = table.v2_checkpoint(4, sidecars=2)
    table.delete_commits(range(0, 4))
    os.remove(os.path.join(table.log_dir, "_sidecars", sidecars[1]))
    with pytest.raises(LogCorruptError, match=sidecars[1]):
        DeltaLog.for_table(table.root).snapshot()


def test_last_checkpoint_hint_stale_missing_or_wrong_is_harmless(table):
    _grow(table, 10)
    expected = _paths(DeltaLog.for_table(table.root).snapshot())
    table.checkpoint(3, write_last=True)
    table.checkpoint(7, write_last=False)  # stale hint: still says 3
    assert _paths(DeltaLog.for_table(table.root).snapshot()) == expected
    table.write_last_checkpoint(9)  # wrong hint: no checkpoint 9 exists
    assert _paths(DeltaLog.for_table(table.root).snapshot()) == expected
    os.remove(os.path.join(table.log_dir, "_last_checkpoint"))
    assert _paths(DeltaLog.for_table(table.root).snapshot()) == expected


def test_incomplete_multipart_checkpoint_falls_back_to_commits(table):
    _grow(table, 8)
    expected = _paths(DeltaLog.for_table(table.root).snapshot())
    names = table.checkpoint(6, parts=3)
    os.remove(os.path.join(table.log_dir, names[1]))
    assert _paths(DeltaLog.for_table(table.root).snapshot()) == expected


def test_incomplete_multipart_checkpoint_without_fallback_is_an_error(table):
    _grow(table, 8)
    names = table.checkpoint(6, parts=3)
    table.delete_commits(range(0, 6))
    os.remove(os.path.join(table.log_dir, names[2]))
    with pytest.raises(VersionNotFoundError, match=r"part\(s\) \[3\] of 3 missing"):
        DeltaLog.for_table(table.root).snapshot()


@pytest.mark.timeout(60)
def test_absurd_checkpoint_part_counts_cost_only_the_files_listed(table):
    """A file name claiming ten billion parts must not make the listing enumerate the missing ones.

    Such checkpoints are incomplete and skipped, as Delta does; the real checkpoint and the commits
    after it are still used (the commits before it are gone, so nothing else could rebuild the table).
    """
    _grow(table, 9)
    expected = _paths(DeltaLog.for_table(table.root).snapshot())
    table.checkpoint(6)
    table.delete_commits(range(0, 6))
    for name in (f"{0:020d}.checkpoint.9999999999.9999999999.parquet",
                 f"{7:020d}.checkpoint.0000000001.9999999999.parquet",  # one part of ten billion present
                 f"{8:020d}.checkpoint.0000000003.0000000002.parquet",  # a part beyond the count
                 f"{8:020d}.checkpoint.0000000000.0000000001.parquet"):  # part 0 does not exist
        with open(os.path.join(table.log_dir, name), "wb") as fh:
            fh.write(b"junk, not Parquet")
    started = time.monotonic()
    snap = DeltaLog.for_table(table.root).snapshot()
    assert time.monotonic() - started < 60  # only "did not hang": ten billion declared parts are not walked
    assert snap.version == 9 and _paths(snap) == expected
    with pytest.raises(VersionNotFoundError, match="9999999999 parts"):
        DeltaLog.for_table(table.root).snapshot(0)


def test_missing_table_and_empty_log(tmp_path):
    with pytest.raises(TableNotFoundError, match="_delta_log"):
        DeltaLog.for_table(str(tmp_path / "nothing")).snapshot()
    os.makedirs(tmp_path / "empty" / "_delta_log")
    with pytest.raises(TableNotFoundError, match="no commit"):
        DeltaLog.for_table(str(tmp_path / "empty")).snapshot()


def test_truncated_commit_names_file_and_line(table):
    table.commit(commit_info(), add("a.parquet", {"date": "2024-01-01", "country": "DE"}))
    path = os.path.join(table.log_dir, f"{1:020d}.json")
    with open(path) as fh:
        content = fh.read()
    with open(path, "w") as fh:
        fh.write(content[: len(content) - 20])
    with pytest.raises(LogCorruptError) as err:
        DeltaLog.for_table(table.root).snapshot()
    assert err.value.path == path and err.value.line == 2
    assert "00000000000000000001.json, line 2" in str(err.value)


def test_non_json_line_and_malformed_action(table):
    path = os.path.join(table.log_dir, f"{1:020d}.json")
    with open(path, "w") as fh:
        fh.write('{"commitInfo": {}}\nthis is not json\n')
    with pytest.raises(LogCorruptError, match="line 2"):
        DeltaLog.for_table(table.root).snapshot()
    with open(path, "w") as fh:
        fh.write('{"add": {"size": 3}}\n')
    with pytest.raises(LogCorruptError, match="malformed 'add' action"):
        DeltaLog.for_table(table.root).snapshot()


def test_missing_commit_in_the_middle_is_corruption(table):
    _grow(table, 5)
    table.delete_commits([3])
    with pytest.raises(LogCorruptError, match=r"00000000000000000003\.json is missing"):
        DeltaLog.for_table(table.root).snapshot()


def test_version_that_does_not_exist(table):
    _grow(table, 2)
    log = DeltaLog.for_table(table.root)
    with pytest.raises(VersionNotFoundError, match="version 7 cannot be read: no such version"):
        log.snapshot(7)
    with pytest.raises(VersionNotFoundError):
        log.snapshot(-1)


@pytest.mark.parametrize("version", ["1", b"1", True, False, 1.0, 0.5, [1]], ids=repr)
def test_a_version_that_is_not_an_integer_is_refused_by_name(table, version):
    """A templated version often arrives as text; it must be refused, not compared with ints (or read as 1/0)."""
    log = DeltaLog.for_table(table.root)
    with pytest.raises(InvalidVersionError, match=rf"version must be an integer, got {type(version).__name__}"):
        log.snapshot(version)
    with pytest.raises(InvalidVersionError, match="version must be an integer"):
        log.commits_after(version)
    with pytest.raises(InvalidVersionError, match="until must be an integer"):
        log.commits_after(0, until=version)


def test_integer_like_versions_are_accepted(table):
    _grow(table, 2)
    log = DeltaLog.for_table(table.root)
    assert log.snapshot(np.int64(1)).version == 1
    assert [c.version for c in log.commits_after(np.int32(0), until=np.int64(1))] == [1]


def test_unsupported_reader_feature_and_version(tmp_path):
    b = LogBuilder(tmp_path / "f")
    b.commit(commit_info(), protocol(3, 7, ["deletionVectors", "catalogManaged"], ["catalogManaged"]), metadata())
    with pytest.raises(UnsupportedProtocolError, match="catalogManaged") as err:
        DeltaLog.for_table(b.root).snapshot()
    assert err.value.features == frozenset({"catalogManaged"})
    b2 = LogBuilder(tmp_path / "g")
    b2.commit(commit_info(), protocol(4, 7), metadata())
    with pytest.raises(UnsupportedProtocolError, match="reader version 4"):
        DeltaLog.for_table(b2.root).snapshot()


def test_missing_metadata_or_protocol(tmp_path):
    b = LogBuilder(tmp_path / "m")
    b.commit(commit_info(), protocol())
    with pytest.raises(LogCorruptError, match="no metaData"):
        DeltaLog.for_table(b.root).snapshot()


def test_update_reads_only_new_commits_and_matches_full_load(table):
    _grow(table, 7)
    table.checkpoint(5)
    log = DeltaLog.for_table(table.root)
    snap = log.snapshot()
    assert snap.update() is snap
    _grow(table, 4)
    table.commit(commit_info(), txn("a", 9), metadata(configuration={"k": "v"}))
    updated = snap.update()
    full = log.snapshot()
    assert updated.version == full.version == 12
    assert _paths(updated) == _paths(full)
    assert updated.app_transaction_version("a") == 9
    assert updated.table_properties == {"k": "v"}
    assert _paths(snap) == _paths(log.snapshot(7))  # the old snapshot is unchanged


def test_update_after_log_cleanup_reloads(table):
    _grow(table, 5)
    log = DeltaLog.for_table(table.root)
    snap = log.snapshot(2)
    table.checkpoint(4)
    table.delete_commits(range(0, 4))
    assert _paths(snap.update()) == _paths(log.snapshot())


def test_commits_after_and_history(table):
    _grow(table, 4)
    log = DeltaLog.for_table(table.root)
    commits = log.commits_after(2)
    assert [c.version for c in commits] == [3, 4]
    assert [c.commit_info.operation for c in commits] == ["WRITE", "WRITE"]
    assert {a.path for c in commits for a in c.actions_of(AddFile)} == {
        "date=2024-01-03/f2.parquet", "date=2024-01-01/f3.parquet"}
    history = log.history(limit=2)
    assert [c.version for c in history] == [4, 3]
    assert log.history()[-1].commit_info.operation == "CREATE TABLE"
    table.checkpoint(3)
    table.delete_commits([0, 1])
    with pytest.raises(VersionNotFoundError):
        log.commits_after(0)


def test_engine_imports_neither_airflow_nor_spark():
    code = (
        "import sys, airflow_delta_occ.engine as e; "
        "bad=[m for m in sys.modules if m.split('.')[0] in ('airflow','pyspark','delta','py4j')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _stats(low: int, high: int, nulls: int = 0, n: int = 10) -> dict:
    return {"numRecords": n, "minValues": {"id": low}, "maxValues": {"id": high}, "nullCount": {"id": nulls}}


@pytest.fixture
def stats_table(table) -> LogBuilder:
    table.commit(commit_info(),
                 add("a.parquet", {"date": "2024-01-01", "country": "DE"}, stats=_stats(0, 9)),
                 add("b.parquet", {"date": "2024-01-01", "country": "FR"}, stats=_stats(10, 19)),
                 add("c.parquet", {"date": "2024-01-02", "country": "DE"}, stats=_stats(20, 29)),
                 add("d.parquet", {"date": "2024-01-02", "country": None}),
                 )
    return table


@pytest.mark.parametrize("with_checkpoint", [False, True])
@pytest.mark.parametrize(("predicate", "expected"), [
    ("country = 'DE'", {"a", "c"}),
    ("country IS NULL", {"d"}),
    ("date = DATE'2024-01-02' AND country != 'DE'", set()),
    ("id = 15", {"b", "d"}),  # d has no statistics: it may hold anything
    ("id BETWEEN 5 AND 12 AND country = 'DE'", {"a"}),
    # A conjunct mixing a partition and a data column is judged on statistics only, as Delta's data
    # skipping does: partition columns have no stats, so 'FR' cannot prune a and c here.
    ("id IN (3, 77) OR country = 'FR'", {"a", "b", "c", "d"}),
    ("id > 100 AND (id < 0 OR country = 'FR')", {"d"}),
    # A conjunct the engine cannot judge never widens an AND: the other conjuncts still narrow, as
    # Spark's partition pruning does (tests/spark/test_engine_vs_spark.py checks it on real Spark).
    ("rand() < 0.5 AND country = 'DE'", {"a", "c"}),
    ("upper(country) = 'DE' AND date = DATE'2024-01-01'", {"a", "b"}),
    ("(upper(country) = 'DE' OR id = 1) AND date = DATE'2024-01-02'", {"c", "d"}),
    ("upper(country) = 'DE'", {"a", "b", "c", "d"}),
    ("upper(country) = 'DE' OR country = 'FR'", {"a", "b", "c", "d"}),
])
def test_files_matching(stats_table, with_checkpoint, predicate, expected):
    if with_checkpoint:
        stats_table.checkpoint(1)
    snap = DeltaLog.for_table(stats_table.root).snapshot()
    assert {f.path.removesuffix(".parquet") for f in snap.files_matching(predicate)} == expected


def test_update_of_a_table_made_anew_at_the_same_path_loads_it_whole(table, tmp_path):
    import shutil

    _grow(table, 5)
    snap = DeltaLog.for_table(table.root).snapshot()
    shutil.rmtree(table.root)
    again = LogBuilder(table.root)
    again.commit(commit_info("CREATE TABLE"), protocol(), metadata())
    again.commit(commit_info(), add("date=2024-01-01/new.parquet", {"date": "2024-01-01", "country": "DE"}))
    updated = snap.update()   # version 1 < 5: not the same table's history
    assert updated.version == 1 and _paths(updated) == {"date=2024-01-01/new.parquet"}
    shutil.rmtree(table.root)
    with pytest.raises(TableNotFoundError):
        updated.update()
