"""Engine transactions and conflict checks on hand-built logs (delta-spark's rules, scenario by scenario).

Each test opens the losing transaction A first, lets a winner B commit, then commits A: the order
delta-spark's own suites use. The differential suite in tests/spark proves the same rules against
real delta-spark; these tests pin each rule down cheaply, one at a time.
"""

from __future__ import annotations

import json
import os
import threading

import pytest

from airflow_delta_occ.engine import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    DeltaLog,
    InvalidCommitError,
    IsolationLevel,
    MetadataChangedException,
    ProtocolChangedException,
    Transaction,
    UnsupportedProtocolError,
)
from airflow_delta_occ.engine.actions import AddFile, Metadata, Protocol
from airflow_delta_occ.engine.errors import CommitRetriesExceededError

from .logbuilder import SCHEMA, LogBuilder, add, commit_info, metadata, protocol

pytestmark = pytest.mark.unit

_counter = iter(range(1_000_000))


def new_file(part: str | None = None, *, data_change: bool = True, partitioned: bool = True) -> AddFile:
    n = next(_counter)
    pv = {"date": "2024-01-01", "country": part} if partitioned else {}
    prefix = f"country={part}/" if partitioned else ""
    return AddFile(path=f"{prefix}f{n}.parquet", partition_values=pv, size=10, modification_time=1,
                   data_change=data_change, stats=json.dumps({"numRecords": 1}))


@pytest.fixture
def partitioned(tmp_path) -> str:
    """Partitioned by (date, country): A_DE and B_FR in date 2024-01-01, version 1."""
    b = LogBuilder(tmp_path / "p")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata())
    b.commit(commit_info(), add("country=DE/a.parquet", {"date": "2024-01-01", "country": "DE"}),
             add("country=FR/b.parquet", {"date": "2024-01-01", "country": "FR"}))
    return b.root


@pytest.fixture
def unpartitioned(tmp_path) -> str:
    b = LogBuilder(tmp_path / "u")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata(partition_columns=()))
    b.commit(commit_info(), add("a.parquet"), add("b.parquet"))
    return b.root


def start(root: str, operation: str = "WRITE", **kw) -> Transaction:
    return Transaction.start(root, operation=operation, **kw)


def file_named(root: str, name: str) -> AddFile:
    return next(f for f in DeltaLog.for_table(root).snapshot().files() if f.path.endswith(name))


# -- no conflict: the commit is rebased and lands one version later -----------------------------------

def test_blind_appends_never_conflict(partitioned):
    a, b = start(partitioned), start(partitioned)
    a.add_files([new_file("DE")])
    b.add_files([new_file("DE")])
    assert b.commit().version == 2
    result = a.commit()
    assert (result.version, result.attempts, result.winners_checked, result.is_blind_append) == (3, 2, (2,), True)
    assert DeltaLog.for_table(partitioned).snapshot().num_files == 4


def test_disjoint_partitions_rebase(partitioned):
    a, b = start(partitioned, "DELETE"), start(partitioned, "DELETE")
    a.remove_files(a.read_files("country = 'DE'"))
    a.add_files([new_file("DE")])
    b.remove_files(b.read_files("country = 'FR'"))
    b.add_files([new_file("FR")])
    b.commit()
    assert a.commit().version == 3


def test_data_predicate_on_partitioned_table_reads_every_partition(partitioned):
    # 'country = DE OR id > 5' mixes partition and data columns: its partition part is TRUE.
    a, b = start(partitioned, "DELETE"), start(partitioned)
    a.remove_files(a.read_files("country = 'DE' OR id > 5"))
    b.read_files("country = 'FR'")
    b.add_files([new_file("FR")])
    b.commit()
    with pytest.raises(ConcurrentAppendException) as info:
        a.commit()
    assert info.value.version == 2 and info.value.partition == {"date": "2024-01-01", "country": "FR"}


# -- ConcurrentAppendException ---------------------------------------------------------------------------

def test_non_blind_add_into_read_partition_conflicts(partitioned):
    a, b = start(partitioned, "UPDATE"), start(partitioned, "UPDATE")
    a.read_files("country = 'DE'")
    a.add_files([new_file("DE")])
    b.read_files("country = 'DE'")
    b.add_files([new_file("DE")])
    b.commit()
    with pytest.raises(ConcurrentAppendException) as info:
        a.commit()
    e = info.value
    assert (e.version, e.operation, e.error_class) == (2, "UPDATE", "DELTA_CONCURRENT_APPEND")
    assert "country=DE" in str(e) and "version 2" in str(e)
    assert DeltaLog.for_table(partitioned).latest_version() == 2  # nothing written by the loser


def test_blind_append_conflicts_with_reader_under_serializable(partitioned):
    a, b = start(partitioned, "DELETE"), start(partitioned)
    a.remove_files(a.read_files("country = 'DE'"))
    b.add_files([new_file("DE")])
    b.commit()
    with pytest.raises(ConcurrentAppendException):
        a.commit()


def test_blind_append_does_not_conflict_under_write_serializable(partitioned):
    setup = start(partitioned, "SET TBLPROPERTIES")
    setup.set_table_properties({"delta.isolationLevel": "WriteSerializable"})
    setup.commit()
    a, b = start(partitioned, "DELETE"), start(partitioned)
    a.remove_files(a.read_files("country = 'DE'"))
    b.add_files([new_file("DE")])
    b.commit()
    result = a.commit()
    assert result.isolation_level is IsolationLevel.WRITE_SERIALIZABLE and result.version == 4


def test_metadata_change_sees_blind_appends_even_under_write_serializable(partitioned):
    setup = start(partitioned, "SET TBLPROPERTIES")
    setup.set_table_properties({"delta.isolationLevel": "WriteSerializable"})
    setup.commit()
    a, b = start(partitioned, "MERGE"), start(partitioned)
    a.read_files("country = 'DE'")
    a.set_table_properties({"comment": "schema evolution"})
    b.add_files([new_file("DE")])
    b.commit()
    with pytest.raises(ConcurrentAppendException):
        a.commit()


def test_unpartitioned_any_non_blind_add_conflicts(unpartitioned):
    # Statistics do not narrow the append check: a reader of a.parquet still sees b's rewrite.
    a, b = start(unpartitioned, "DELETE"), start(unpartitioned, "DELETE")
    a.remove_files([file_named(unpartitioned, "a.parquet")])
    a.track_read([file_named(unpartitioned, "a.parquet")])
    b.read_files()
    b.remove_files([file_named(unpartitioned, "b.parquet")])
    b.add_files([new_file(partitioned=False)])
    b.commit()
    with pytest.raises(ConcurrentAppendException) as info:
        a.commit()
    assert info.value.partition == {}


def test_read_whole_table_conflicts_with_any_add(partitioned):
    a, b = start(partitioned), start(partitioned, "UPDATE")
    a.read_files("country = 'DE'")
    a.read_whole_table()
    a.add_files([new_file("DE")])
    b.read_files("country = 'IT'")
    b.add_files([new_file("IT")])
    b.commit()
    with pytest.raises(ConcurrentAppendException):
        a.commit()


# -- delete checks -----------------------------------------------------------------------------------------

def test_removed_read_file_is_delete_read(partitioned):
    a, b = start(partitioned, "UPDATE"), start(partitioned, "DELETE")
    a.read_files("country = 'DE'")
    a.add_files([new_file("IT")])  # writes elsewhere, reads DE
    b.remove_files(b.read_files("country = 'DE'"))
    b.commit()
    with pytest.raises(ConcurrentDeleteReadException) as info:
        a.commit()
    assert info.value.path == "country=DE/a.parquet"


def test_append_check_comes_before_delete_read(partitioned):
    a, b = start(partitioned, "UPDATE"), start(partitioned, "UPDATE")
    a.remove_files(a.read_files("country = 'DE'"))
    a.add_files([new_file("DE")])
    b.remove_files(b.read_files("country = 'DE'"))
    b.add_files([new_file("DE")])
    b.commit()
    with pytest.raises(ConcurrentAppendException):
        a.commit()


def test_delete_delete_without_reads(partitioned):
    a, b = start(partitioned, "DELETE"), start(partitioned, "DELETE")
    target = file_named(partitioned, "a.parquet")
    a.remove_files([target])
    b.remove_files([target])
    b.commit()
    with pytest.raises(ConcurrentDeleteDeleteException):
        a.commit()


# -- OPTIMIZE: dataChange=false commits are checked at snapshot isolation --------------------------------

def test_compaction_does_not_conflict_with_appends(partitioned):
    a, b = start(partitioned, "OPTIMIZE"), start(partitioned, "UPDATE")
    files = a.read_files("country = 'DE'")
    a.remove_files(files, data_change=False)
    a.add_files([new_file("DE", data_change=False)])
    b.read_files("country = 'DE'")
    b.add_files([new_file("DE")])
    b.commit()
    result = a.commit()
    assert result.isolation_level is IsolationLevel.SNAPSHOT_ISOLATION and result.version == 3


def test_compaction_conflicts_when_its_input_was_deleted(partitioned):
    a, b = start(partitioned, "OPTIMIZE"), start(partitioned, "DELETE")
    a.remove_files(a.read_files("country = 'DE'"), data_change=False)
    a.add_files([new_file("DE", data_change=False)])
    b.remove_files(b.read_files("country = 'DE'"))
    b.commit()
    with pytest.raises(ConcurrentDeleteReadException):
        a.commit()


def test_winning_compaction_fails_dml_on_same_partition(partitioned):
    a, b = start(partitioned, "DELETE"), start(partitioned, "OPTIMIZE")
    a.remove_files(a.read_files("country = 'DE'"))
    b.remove_files(b.read_files("country = 'DE'"), data_change=False)
    b.add_files([new_file("DE", data_change=False)])
    b.commit()
    with pytest.raises(ConcurrentAppendException):
        a.commit()


# -- metadata, protocol, application transactions ----------------------------------------------------------

def test_metadata_change_fails_concurrent_writer(partitioned):
    a, b = start(partitioned, "UPDATE"), start(partitioned, "SET TBLPROPERTIES")
    a.read_files("country = 'DE'")
    a.add_files([new_file("DE")])
    b.set_table_properties({"owner": "team-a"})
    b.commit()
    with pytest.raises(MetadataChangedException):
        a.commit()


def test_deletion_vector_enablement_is_rebased_over(tmp_path):
    b_ = LogBuilder(tmp_path / "t")
    b_.commit(commit_info("CREATE TABLE"), protocol(3, 7, ["deletionVectors"], ["deletionVectors"]),
              metadata(partition_columns=()))
    a, b = start(b_.root, "WRITE"), start(b_.root, "SET TBLPROPERTIES")
    a.add_files([new_file(partitioned=False)])
    b.set_table_properties({"delta.enableDeletionVectors": "true"})
    b.commit()
    assert a.commit().version == 2
    # Disabling is not on the allow-list.
    a, b = start(b_.root, "WRITE"), start(b_.root, "SET TBLPROPERTIES")
    a.add_files([new_file(partitioned=False)])
    b.set_table_properties({"delta.enableDeletionVectors": "false"})
    b.commit()
    with pytest.raises(MetadataChangedException):
        a.commit()


def test_protocol_upgrade_on_both_sides(partitioned):
    a, b = start(partitioned, "UPGRADE PROTOCOL"), start(partitioned, "UPGRADE PROTOCOL")
    a.update_protocol(Protocol(1, 3))
    b.update_protocol(Protocol(1, 3))
    b.commit()
    with pytest.raises(ProtocolChangedException):
        a.commit()


def test_concurrent_create_of_a_table(tmp_path):
    root = str(tmp_path / "new")
    meta = Metadata(id="x", schema_string=json.dumps(SCHEMA), partition_columns=(), configuration={})
    a, b = start(root, "CREATE TABLE"), start(root, "CREATE TABLE")
    for t in (a, b):
        t.update_protocol(Protocol(1, 2))
        t.update_metadata(meta)
    assert b.commit().version == 0
    with pytest.raises(ProtocolChangedException, match="same path"):
        a.commit()


def test_app_transaction_dependency(partitioned):
    a, b = start(partitioned), start(partitioned)
    assert a.txn_version("etl") is None
    a.add_files([new_file("DE")])
    a.set_transaction("etl", 1)
    b.set_transaction("other", 1)
    b.commit()
    assert a.commit().version == 3
    a, b = start(partitioned), start(partitioned)
    assert a.txn_version("etl") == 1
    a.set_transaction("etl", 2)
    b.set_transaction("etl", 2)
    b.commit()
    with pytest.raises(ConcurrentTransactionException):
        a.commit()


# -- bad input and limits ----------------------------------------------------------------------------------

def test_invalid_commits_write_nothing(partitioned):
    t = start(partitioned)
    t.add_files([AddFile("x.parquet", {"country": "DE"}, 1, 1, True)])
    with pytest.raises(InvalidCommitError, match="partitioned by"):
        t.commit()
    t = start(partitioned)
    f = new_file("DE")
    t.add_files([f, f])
    with pytest.raises(InvalidCommitError, match="twice"):
        t.commit()
    t = start(str(os.path.join(partitioned, "missing")))
    t.add_files([new_file(partitioned=False)])
    with pytest.raises(InvalidCommitError, match="first commit"):
        t.commit()
    assert DeltaLog.for_table(partitioned).latest_version() == 1


def test_unknown_writer_feature_is_refused(tmp_path):
    b = LogBuilder(tmp_path / "t")
    b.commit(commit_info(), protocol(3, 7, [], ["someFutureFeature"]), metadata(partition_columns=()))
    t = start(b.root)
    t.add_files([new_file(partitioned=False)])
    with pytest.raises(UnsupportedProtocolError, match="someFutureFeature"):
        t.commit()


def test_row_tracking_table_refuses_data_writes(tmp_path):
    b = LogBuilder(tmp_path / "t")
    b.commit(commit_info(), protocol(3, 7, [], ["rowTracking", "domainMetadata"]), metadata(partition_columns=()))
    t = start(b.root)
    t.add_files([new_file(partitioned=False)])
    with pytest.raises(UnsupportedProtocolError, match="row tracking"):
        t.commit()


def test_retries_are_bounded(partitioned):
    a = start(partitioned, max_attempts=2)
    a.add_files([new_file("DE")])
    for _ in range(1):
        b = start(partitioned)
        b.add_files([new_file("DE")])
        b.commit()
    # The only free version after the rebase is taken before the second attempt, by racing it here.
    original = a.log.storage.put_if_absent
    calls = []

    def racing_put(path, data):
        calls.append(path)
        if len(calls) == 2:
            w = start(partitioned)
            w.add_files([new_file("DE")])
            w.commit()
        return original(path, data)

    a.log.storage.put_if_absent = racing_put  # type: ignore[method-assign]
    with pytest.raises(CommitRetriesExceededError):
        a.commit()


def test_many_threads_append_contiguously(partitioned):
    errors = []

    def writer():
        try:
            t = start(partitioned)
            t.add_files([new_file("DE")])
            t.commit()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    log = DeltaLog.for_table(partitioned)
    assert log.latest_version() == 9
    assert log.snapshot().num_files == 10
