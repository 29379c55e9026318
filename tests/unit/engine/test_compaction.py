"""What a running OPTIMIZE is certain to rewrite (``engine.compaction``), and when a winner dooms it: only the
loss of such a file, since delta-spark's OPTIMIZE commits again after any other conflict. Each rule is checked
both ways: a file counted as certain that delta-spark's bin packing might leave alone would abort a compaction
that commits. (tests/spark/test_early_abort.py and ``make prove-early-abort`` hold it to delta-spark itself.)"""

from __future__ import annotations

import pytest

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.compaction import (
    BATCH_SIZE_CONF,
    MAX_DELETED_ROWS_RATIO_CONF,
    MAX_FILE_SIZE_CONF,
    MIN_FILE_SIZE_CONF,
    CompactionSettings,
    surely_compacted,
)
from airflow_delta_occ.engine.early_abort import certain_conflict, running_commit
from airflow_delta_occ.engine.errors import ConflictKind, InvalidCommitError
from airflow_delta_occ.engine.planner import Operation

from .logbuilder import SCHEMA, LogBuilder, add, commit_info, dv, metadata, protocol, remove

pytestmark = pytest.mark.unit

DE, FR = {"date": "2024-01-01", "country": "DE"}, {"date": "2024-01-01", "country": "FR"}
ROWS = {"numRecords": 10}
SMALL = CompactionSettings(min_file_size=1000, max_file_size=1000)


def _table(tmp_path, *files, partitioned=True, features=None):
    b = LogBuilder(tmp_path / "t")
    b.commit(commit_info("CREATE TABLE"),
             protocol(3, 7, [], features) if features is not None else protocol(),
             metadata(partition_columns=("date", "country") if partitioned else ()))
    b.commit(commit_info(), *files)
    return b


def _partitioned_by(tmp_path, column, data_type, *files):
    """A table partitioned by one extra ``column`` of ``data_type``, with ``files`` as (path, value as written,
    size), each holding rows."""
    schema = {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": column, "type": data_type, "nullable": True,
                                                       "metadata": {}}]}
    b = LogBuilder(tmp_path / "t")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata(partition_columns=(column,), schema=schema))
    b.commit(commit_info(), *(add(path, {column: value}, stats=ROWS, size=size) for path, value, size in files))
    return b


def _plan(b, predicate=None, settings=SMALL, *, zorder=False, version=1):
    snapshot = DeltaLog.for_table(b.root).snapshot(version)
    bound = snapshot.bind(predicate) if predicate is not None else None
    return surely_compacted(snapshot, bound, settings, zorder=zorder)


def _paths(plan):
    return sorted(f.path for f in plan.files)


def _judge(b, predicate="country = 'DE'", settings=SMALL, *, op=Operation.OPTIMIZE, read_version=1):
    log = DeltaLog.for_table(b.root)
    running = running_commit(log.snapshot(read_version), op, predicate, commits=True, compaction=settings)
    return certain_conflict(running, log.commits_after(read_version))


def test_two_small_files_of_a_partition_that_fit_one_bin_are_certain(tmp_path):
    b = _table(tmp_path, add("de-0", DE, stats=ROWS), add("de-1", DE, stats=ROWS), add("fr-0", FR, stats=ROWS),
               add("fr-1", FR, stats=ROWS))
    plan = _plan(b, "country = 'DE'")
    assert _paths(plan) == ["de-0", "de-1"] and plan.commits
    assert _paths(_plan(b)) == ["de-0", "de-1", "fr-0", "fr-1"]


def test_a_partition_with_one_small_file_has_no_bin(tmp_path):
    # delta-spark drops a bin of one file: nothing of that partition is rewritten.
    b = _table(tmp_path, add("de-0", DE, stats=ROWS), add("de-big", DE, stats=ROWS, size=5000),
               add("fr-0", FR, stats=ROWS), add("fr-1", FR, stats=ROWS))
    assert _paths(_plan(b)) == ["fr-0", "fr-1"]
    plan = _plan(b, "country = 'DE'")
    assert plan.files == () and not plan.commits and plan.why_not


def test_candidates_that_may_not_fit_one_bin_are_not_certain(tmp_path):
    # 600 + 600 > maxFileSize 1000: two bins of one file each, both dropped; a sort among equal sizes or a
    # third file decides otherwise, so nothing of the partition counts.
    b = _table(tmp_path, add("de-0", DE, stats=ROWS, size=600), add("de-1", DE, stats=ROWS, size=600))
    assert _plan(b).files == ()
    assert _paths(_plan(b, settings=CompactionSettings(min_file_size=1000, max_file_size=1200))) == ["de-0", "de-1"]


def test_a_file_selected_only_for_its_deleted_rows_is_never_certain_but_counts_towards_the_bound(tmp_path):
    # A big file with a deletion vector may be selected (its deleted rows' ratio): it may join the bin.
    big_dv = add("de-big", DE, stats=ROWS, size=5000, dv=dv("abc", cardinality=9))
    b = _table(tmp_path, add("de-0", DE, stats=ROWS), add("de-1", DE, stats=ROWS), big_dv)
    assert _plan(b).files == ()   # 100 + 100 + 5000 may exceed the bin
    b2 = _table(tmp_path / "b2", add("de-0", DE, stats=ROWS), add("de-1", DE, stats=ROWS), big_dv)
    plan = _plan(b2, settings=CompactionSettings(min_file_size=1000, max_file_size=10_000))
    assert _paths(plan) == ["de-0", "de-1"]   # fits either way; the big file is not counted as certain


def test_zorder_rewrites_every_file_of_the_partitions_it_selects(tmp_path):
    b = _table(tmp_path, add("de-big", DE, stats=ROWS, size=5000), add("fr-0", FR, stats=ROWS))
    assert _paths(_plan(b, "country = 'DE'", zorder=True)) == ["de-big"]   # one file, rewritten by Z-ordering
    assert _paths(_plan(b, zorder=True)) == ["de-big", "fr-0"]


def test_partitions_written_differently_are_bounded_together(tmp_path):
    """delta-spark may group partition values that are equal once typed ('01' and '1'): their candidates count
    towards one bound. Two files written '1' are certain only while the group fits one bin."""
    b = _partitioned_by(tmp_path, "n", "integer", ("a", "1", 400), ("b", "1", 400), ("c", "01", 400))
    assert _plan(b).files == ()   # 1200 > 1000 once '01' joins '1'
    assert _paths(_plan(b, settings=CompactionSettings(min_file_size=1000, max_file_size=1200))) == ["a", "b"]


def test_nothing_is_certain_on_a_clustered_table_a_batched_optimize_or_an_unparseable_partition(tmp_path):
    files = (add("de-0", DE, stats=ROWS), add("de-1", DE, stats=ROWS))
    clustered = _table(tmp_path / "c", *files, features=["clustering", "domainMetadata"])
    assert _plan(clustered).files == () and "clustered" in _plan(clustered).why_not
    plain = _table(tmp_path / "p", *files)
    batched = CompactionSettings(min_file_size=1000, max_file_size=1000, batched=True)
    assert _plan(plain, settings=batched).files == ()
    odd = _table(tmp_path / "o", *files, add("odd", {"date": "not-a-date", "country": "DE"}, stats=ROWS))
    assert _plan(odd).files == ()


def test_an_optimize_commits_only_if_a_certain_file_holds_a_row(tmp_path):
    no_stats = _table(tmp_path / "n", add("de-0", DE), add("de-1", DE))
    assert _paths(_plan(no_stats)) == ["de-0", "de-1"] and not _plan(no_stats).commits
    all_deleted = _table(tmp_path / "d", add("de-0", DE, stats=ROWS, dv=dv("x", cardinality=10)),
                         add("de-1", DE, stats={"numRecords": 0}))
    assert not _plan(all_deleted).commits


def test_settings_are_read_as_delta_spark_reads_them():
    conf = {MIN_FILE_SIZE_CONF: "1048576", MAX_FILE_SIZE_CONF: " 2097152 ", MAX_DELETED_ROWS_RATIO_CONF: "0.5"}
    settings = CompactionSettings.from_conf(conf.get)
    assert settings == CompactionSettings(min_file_size=1048576, max_file_size=2097152, max_deleted_rows_ratio=0.5)
    assert CompactionSettings.from_conf({}.get) == CompactionSettings()
    assert CompactionSettings.from_conf({BATCH_SIZE_CONF: "1073741824"}.get).batched
    for bad in ({MIN_FILE_SIZE_CONF: "1g"}, {MAX_FILE_SIZE_CONF: "-1"}, {MAX_DELETED_ROWS_RATIO_CONF: "2"}):
        with pytest.raises(InvalidCommitError):
            CompactionSettings.from_conf(bad.get)


def _compacting(tmp_path):
    return _table(tmp_path, add("de-0", DE, stats=ROWS), add("de-1", DE, stats=ROWS), add("fr-0", FR, stats=ROWS))


def test_the_loss_of_a_file_it_rewrites_dooms_an_optimize(tmp_path):
    b = _compacting(tmp_path)
    b.commit(commit_info("DELETE", isBlindAppend=False), remove("de-1"))
    found = _judge(b)
    assert found is not None and found.kind is ConflictKind.DELETE_READ and found.version == 2


def test_a_new_deletion_vector_on_a_file_it_rewrites_dooms_an_optimize(tmp_path):
    b = _compacting(tmp_path)
    b.commit(commit_info("DELETE", isBlindAppend=False), remove("de-1"),
             add("de-1", DE, stats=ROWS, dv=dv("new", cardinality=1)))
    found = _judge(b)
    assert found is not None and found.kind is ConflictKind.DELETE_READ


def test_an_optimize_forgives_what_its_retry_forgives(tmp_path):
    """delta-spark's OPTIMIZE commits again after a conflict while its files are all still there: a metadata
    change, an append to its partition, a removal elsewhere, or a file removed and put back never doom it."""
    b = _compacting(tmp_path)
    wider = {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "extra", "type": "string", "nullable": True,
                                                       "metadata": {}}]}
    b.commit(commit_info("ADD COLUMNS"), metadata(schema=wider))
    b.commit(commit_info("WRITE", isBlindAppend=False), add("de-2", DE, stats=ROWS))
    b.commit(commit_info("DELETE", isBlindAppend=False), remove("fr-0"))
    b.commit(commit_info("ROW TRACKING BACKFILL", isBlindAppend=False), remove("de-0", data_change=False),
             add("de-0", DE, stats=ROWS, data_change=False))
    assert _judge(b) is None
    # The loss of a file it rewrites, after all that, dooms it with its first attempt's failure: the metadata
    # change, named as delta-spark's exception names it (the first winner that failed the attempt).
    b.commit(commit_info("OPTIMIZE", isBlindAppend=False), remove("de-1", data_change=False),
             add("de-9", DE, stats=ROWS, data_change=False))
    found = _judge(b)
    assert found is not None and found.version == 2 and found.kind is ConflictKind.METADATA
    assert "version 2 (ADD COLUMNS)" in found.describe()


def test_without_settings_or_certain_files_an_optimize_is_never_doomed(tmp_path):
    b = _compacting(tmp_path)
    b.commit(commit_info("DELETE", isBlindAppend=False), remove("de-1"))
    log = DeltaLog.for_table(b.root)
    running = running_commit(log.snapshot(1), Operation.OPTIMIZE, "country = 'DE'", commits=True)
    assert not running.commits and certain_conflict(running, log.commits_after(1)) is None
    assert running.uncertain == "no compaction settings"   # what the task log says instead
    lone = running_commit(log.snapshot(1), Operation.OPTIMIZE, "country = 'FR'", commits=True, compaction=SMALL)
    assert not lone.commits and "no partition has two small files" in lone.uncertain
    assert _judge(b, settings=CompactionSettings(min_file_size=50, max_file_size=1000)) is None   # no small file
    assert _judge(b, "country = 'FR'") is None   # one file: no bin


def test_zorder_is_doomed_by_the_loss_of_any_file_of_its_partitions(tmp_path):
    b = _table(tmp_path, add("de-big", DE, stats=ROWS, size=5000))
    b.commit(commit_info("UPDATE", isBlindAppend=False), remove("de-big"), add("de-new", DE, stats=ROWS))
    found = _judge(b, op=Operation.OPTIMIZE_ZORDER)
    assert found is not None and found.kind is ConflictKind.DELETE_READ
    assert _judge(b, op=Operation.OPTIMIZE) is None   # a lone big file is no compaction's


def test_float_partitions_delta_spark_may_group_are_bounded_together(tmp_path):
    """delta-spark casts FLOAT partition values to 32 bits: '0.1' and '0.10000000149011612' are one partition
    there. Bounded apart, two 400-byte files of '0.1' would look like one bin; with the third they need two, and
    sorted by size one of them may sit alone (dropped, never rewritten)."""
    b = _partitioned_by(tmp_path, "f", "float", ("a", "0.1", 400), ("b", "0.1", 400),
                        ("c", "0.10000000149011612", 300))
    assert _plan(b).files == ()
    assert _paths(_plan(b, settings=CompactionSettings(min_file_size=1000, max_file_size=1100))) == ["a", "b"]


def test_zorder_with_a_max_file_size_of_zero_is_not_certain_to_commit(tmp_path):
    # delta-spark divides the partition's size by maxFileSize when it Z-orders: the job fails, it does not commit.
    b = _table(tmp_path, add("de-0", DE, stats=ROWS))
    assert _plan(b, settings=CompactionSettings(max_file_size=0), zorder=True).files == ()
