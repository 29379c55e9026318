"""Early abort's judge: a running job is "doomed" only when even the smallest commit it is certain to make
fails on a commit that won. Each case here can fail both ways: a missed certainty and, worse, a false one.
(tests/spark/test_differential.py holds the judge to delta-spark's real outcomes.)"""

from __future__ import annotations

import pytest

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.early_abort import certain_conflict, running_commit
from airflow_delta_occ.engine.errors import ConflictKind
from airflow_delta_occ.engine.planner import Operation

from .logbuilder import SCHEMA, LogBuilder, add, commit_info, metadata, protocol, remove

pytestmark = pytest.mark.unit

DE, FR = {"date": "2024-01-01", "country": "DE"}, {"date": "2024-01-01", "country": "FR"}


def _table(tmp_path, *, level: str | None = None, partitioned: bool = True):
    b = LogBuilder(tmp_path / "t")
    config = {"delta.isolationLevel": level} if level else {}
    b.commit(commit_info("CREATE TABLE"), protocol(),
             metadata(partition_columns=("date", "country") if partitioned else (), configuration=config))
    b.commit(commit_info(), add("de-0.parquet", DE if partitioned else {}),
             add("fr-0.parquet", FR if partitioned else {}))
    return b


def _judge(b, operation, predicate=None, *, commits=True, read_version=1, **kw):
    log = DeltaLog.for_table(b.root)
    running = running_commit(log.snapshot(read_version), operation, predicate, commits=commits, **kw)
    return certain_conflict(running, log.commits_after(read_version))


def test_a_file_added_in_the_partition_read_dooms_the_job(tmp_path):
    b = _table(tmp_path)
    b.commit(commit_info("WRITE"), add("de-1.parquet", DE))
    found = _judge(b, Operation.UPDATE, "country = 'DE'")
    assert found is not None and found.kind is ConflictKind.APPEND and found.version == 2
    assert "version 2 (WRITE)" in found.describe()


def test_a_file_added_elsewhere_or_before_the_read_does_not(tmp_path):
    b = _table(tmp_path)
    b.commit(commit_info("WRITE"), add("fr-1.parquet", FR))
    assert _judge(b, Operation.UPDATE, "country = 'DE'") is None
    b.commit(commit_info("WRITE"), add("de-1.parquet", DE))
    assert _judge(b, Operation.UPDATE, "country = 'DE'", read_version=3) is None   # in the job's snapshot


def test_a_job_not_certain_to_commit_is_never_doomed(tmp_path):
    # delta-spark skips the commit of a statement that changed nothing: it cannot fail.
    b = _table(tmp_path)
    b.commit(commit_info("WRITE"), add("de-1.parquet", DE))
    assert _judge(b, Operation.UPDATE, "country = 'DE'", commits=False) is None


def test_a_table_whose_commits_are_backfilled_later_is_never_judged(tmp_path):
    """With coordinated commits a commit is ratified first and written as <version>.json later: a commit the
    job's transaction read may not show yet, and could later pass for a winner."""
    b = LogBuilder(tmp_path / "t")
    b.commit(commit_info("CREATE TABLE"), protocol(3, 7, [], ["coordinatedCommits-preview"]),
             metadata(partition_columns=("date", "country")))
    b.commit(commit_info(), add("de-0.parquet", DE))
    b.commit(commit_info("WRITE"), add("de-1.parquet", DE))
    assert _judge(b, Operation.UPDATE, "country = 'DE'") is None
    plain = _table(tmp_path / "plain")
    plain.commit(commit_info("WRITE"), add("de-1.parquet", DE))
    assert _judge(plain, Operation.UPDATE, "country = 'DE'") is not None


def test_a_removed_file_dooms_only_when_the_scan_surely_read_it(tmp_path):
    b = _table(tmp_path)
    b.commit(commit_info("DELETE"), remove("de-0.parquet"))
    found = _judge(b, Operation.DELETE, "country = 'DE'")
    assert found is not None and found.kind is ConflictKind.DELETE_READ
    # A data conjunct lets data skipping drop the file from the scan: no certainty.
    assert _judge(b, Operation.DELETE, "country = 'DE' AND id = 3") is None
    # A MERGE skips only on its target's conjuncts: the join conjunct does not count.
    found = _judge(b, Operation.MERGE, "t.id = s.id AND t.country = 'DE'", target_alias="t")
    assert found is not None and found.kind is ConflictKind.DELETE_READ
    assert _judge(b, Operation.MERGE, "t.id = s.id AND t.country = 'DE' AND t.id > 5", target_alias="t") is None
    # A compaction records only the files it picks.
    assert _judge(b, Operation.OPTIMIZE, "country = 'DE'") is None


def test_a_blind_append_winner_under_write_serializable_does_not_doom(tmp_path):
    b = _table(tmp_path, level="WriteSerializable")
    b.commit(commit_info("WRITE", isBlindAppend=True), add("de-1.parquet", DE))
    assert _judge(b, Operation.UPDATE, "country = 'DE'") is None
    b.commit(commit_info("MERGE", isBlindAppend=False), add("de-2.parquet", DE))
    found = _judge(b, Operation.UPDATE, "country = 'DE'")
    assert found is not None and found.version == 3


def test_a_schema_change_dooms_even_a_blind_append(tmp_path):
    b = _table(tmp_path)
    wider = {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "extra", "type": "string", "nullable": True,
                                                       "metadata": {}}]}
    b.commit(commit_info("ADD COLUMNS"), metadata(schema=wider))
    found = _judge(b, Operation.INSERT)
    assert found is not None and found.kind is ConflictKind.METADATA


def test_an_unparseable_partition_value_is_not_taken_as_a_match(tmp_path):
    # The commit check assumes such a file matches (conservative there); a certainty cannot.
    b = _table(tmp_path)
    b.commit(commit_info("WRITE", isBlindAppend=False), add("odd.parquet", {"date": "not-a-date", "country": "DE"}))
    assert _judge(b, Operation.UPDATE, "country = 'DE'") is None


def test_the_first_fatal_winner_is_named_and_earlier_ones_rebased(tmp_path):
    b = _table(tmp_path)
    b.commit(commit_info("WRITE"), add("fr-1.parquet", FR))
    b.commit(commit_info("MERGE"), add("de-1.parquet", DE))
    b.commit(commit_info("MERGE"), add("de-2.parquet", DE))
    found = _judge(b, Operation.MERGE, "t.id = s.id AND t.country = 'DE'", target_alias="t")
    assert found is not None and found.version == 3 and found.operation == "MERGE"


def test_an_unpartitioned_read_is_doomed_by_any_added_file(tmp_path):
    b = _table(tmp_path, partitioned=False)
    b.commit(commit_info("WRITE", isBlindAppend=False), add("x.parquet"))
    found = _judge(b, Operation.UPDATE, "id = 3")
    assert found is not None and found.kind is ConflictKind.APPEND


def test_a_whole_table_merge_is_not_doomed_by_the_removal_of_a_file_added_after_its_read(tmp_path):
    # delta-spark records a NOT MATCHED BY SOURCE MERGE as a read of every file of its snapshot
    # (filterFiles(TRUE)), not as readWholeTable: a file a blind append added later, then removed, was not read.
    b = _table(tmp_path, level="WriteSerializable")
    b.commit(commit_info("STREAMING UPDATE", isBlindAppend=True), add("fr-new.parquet", FR))
    b.commit(commit_info("DELETE", isBlindAppend=False), remove("fr-new.parquet"))
    merge = {"target_alias": "t", "reads_whole_table": True}
    assert _judge(b, Operation.MERGE, "t.id = s.id AND t.country = 'DE'", **merge) is None
    b.commit(commit_info("DELETE", isBlindAppend=False), remove("fr-0.parquet"))   # one it did read
    found = _judge(b, Operation.MERGE, "t.id = s.id AND t.country = 'DE'", **merge)
    assert found is not None and found.kind is ConflictKind.DELETE_READ and found.version == 4


def test_the_judge_takes_winners_one_at_a_time_and_its_verdict_stands(tmp_path):
    """The watch judges each commit once, as it lands, and gets the verdict a judgement of them all would give."""
    from airflow_delta_occ.engine.early_abort import CommitJudge

    b = _table(tmp_path)
    for i in range(30):
        b.commit(commit_info("WRITE"), add(f"fr-{i + 1}.parquet", FR))
    b.commit(commit_info("MERGE"), add("de-1.parquet", DE))
    b.commit(commit_info("WRITE"), add("fr-99.parquet", FR))
    log = DeltaLog.for_table(b.root)
    running = running_commit(log.snapshot(1), Operation.UPDATE, "country = 'DE'", commits=True)
    judge = CommitJudge(running)
    verdicts = [judge.judge(c) for c in log.commits_after(1)]
    assert verdicts[:30] == [None] * 30
    assert verdicts[30] is not None and verdicts[30].version == 32 and verdicts[31] is verdicts[30]
    at_once = certain_conflict(running, log.commits_after(1))
    assert at_once is not None and (at_once.version, at_once.kind) == (32, verdicts[30].kind)


# -- a row that surely meets an UPDATE's or DELETE's condition, from the log alone ------------------------------

def _with_files(tmp_path, *adds, schema=None):
    b = LogBuilder(tmp_path / "rows")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata(schema=schema))
    b.commit(commit_info("WRITE"), *adds)
    return DeltaLog.for_table(b.root).snapshot()


def _stats(n, mins=None, maxs=None, nulls=None):
    return {"numRecords": n, "minValues": mins or {}, "maxValues": maxs or {}, "nullCount": nulls or {}}


def test_a_partition_with_a_counted_row_holds_a_row_for_a_partition_condition(tmp_path):
    snap = _with_files(tmp_path, add("de.parquet", DE, stats=_stats(3)), add("fr.parquet", FR, stats=_stats(0)))
    assert snap.holds_a_row_matching("country = 'DE'")
    assert snap.holds_a_row_matching("date = '2024-01-01'")
    assert not snap.holds_a_row_matching("country = 'FR'")   # its one file has no row
    assert not snap.holds_a_row_matching("country = 'IT'")   # no such partition


def test_statistics_prove_a_row_only_when_every_row_of_a_file_meets_the_condition(tmp_path):
    ids = _stats(4, {"id": 5}, {"id": 9}, {"id": 0})
    snap = _with_files(tmp_path, add("de.parquet", DE, stats=ids))
    assert snap.holds_a_row_matching("id > 3 AND country = 'DE'")
    assert snap.holds_a_row_matching("id >= 5 AND id <= 9")
    assert snap.holds_a_row_matching("NOT (id < 5)")
    assert snap.holds_a_row_matching("id IN (1, 2) OR id > 4")
    assert snap.holds_a_row_matching("id IS NOT NULL")
    # The statistics cannot show that a row meets these (one may, or may not): Spark must be asked.
    for condition in ("id > 5", "id = 7", "id != 7", "id IN (5, 6, 7, 8, 9)", "id IS NULL", "name = 'a'",
                      "id > 3 AND country = 'FR'"):
        assert not snap.holds_a_row_matching(condition), condition


def test_nulls_unknown_counts_and_missing_statistics_prove_nothing(tmp_path):
    may_be_null = _stats(4, {"id": 5}, {"id": 9}, {"id": 1})
    assert not _with_files(tmp_path / "a", add("f", DE, stats=may_be_null)).holds_a_row_matching("id > 3")
    uncounted = _stats(4, {"id": 5}, {"id": 9})   # no null count: a NULL id may be in every row but one
    assert not _with_files(tmp_path / "b", add("f", DE, stats=uncounted)).holds_a_row_matching("id > 3")
    assert not _with_files(tmp_path / "c", add("f", DE)).holds_a_row_matching("country = 'DE'")


def test_a_file_whose_rows_its_deletion_vector_removed_holds_no_row(tmp_path):
    dv = {"storageType": "i", "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f", "offset": 1, "sizeInBytes": 36,
          "cardinality": 4}
    all_gone = add("f", DE, stats=_stats(4, {"id": 5}, {"id": 9}, {"id": 0}), dv=dv)
    assert not _with_files(tmp_path / "a", all_gone).holds_a_row_matching("country = 'DE'")
    some_left = add("f", DE, stats=_stats(5, {"id": 5}, {"id": 9}, {"id": 0}), dv=dv)
    assert _with_files(tmp_path / "b", some_left).holds_a_row_matching("id > 3")


def test_columns_spark_compares_otherwise_than_by_value_prove_nothing(tmp_path):
    fields = [{"name": "c", "type": "string", "nullable": True,
               "metadata": {"__CHAR_VARCHAR_TYPE_STRING": "char(3)"}},
              {"name": "k", "type": "string", "nullable": True,
               "metadata": {"__COLLATIONS": {"k": "spark.UTF8_LCASE"}}},
              {"name": "x", "type": "double", "nullable": True, "metadata": {}},
              {"name": "n", "type": "long", "nullable": True, "metadata": {}}]
    schema = {"type": "struct", "fields": fields}
    stats = _stats(2, {"c": "a  ", "k": "A", "x": 1.0, "n": 1}, {"c": "a  ", "k": "A", "x": 1.0, "n": 1},
                   {"c": 0, "k": 0, "x": 0, "n": 0})
    b = LogBuilder(tmp_path / "typed")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata(partition_columns=(), schema=schema))
    b.commit(commit_info("WRITE"), add("f", {}, stats=stats))
    snap = DeltaLog.for_table(b.root).snapshot()
    assert snap.holds_a_row_matching("n = 1")
    # CHAR pads ('a' equals 'a  ' in Spark), a collation folds case ('a' equals 'A'), doubles have NaN and -0.0.
    for condition in ("c != 'a'", "k != 'a'", "x = 1.0", "x > 0"):
        assert not snap.holds_a_row_matching(condition), condition


def test_decimal_statistics_are_read_exactly(tmp_path):
    """delta-spark writes a DECIMAL bound as an exact JSON number; read through a binary float, 0.100000000000000001
    became 0.1, so the log "showed" a row meeting `d = 0.1` (none does) and pruning dropped the file for `d > 0.1`."""
    schema = {"type": "struct", "fields": [{"name": "d", "type": "decimal(38,18)", "nullable": True, "metadata": {}}]}
    b = LogBuilder(tmp_path / "dec")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata(partition_columns=(), schema=schema))
    text = '{"numRecords": 1, "minValues": {"d": 0.100000000000000001}, "maxValues": {"d": 0.100000000000000001}, ' \
           '"nullCount": {"d": 0}}'
    b.commit(commit_info("WRITE"), {"add": {"path": "f", "partitionValues": {}, "size": 100,
                                            "modificationTime": 1700000000000, "dataChange": True, "stats": text}})
    snap = DeltaLog.for_table(b.root).snapshot()
    for none_meets in ("d = 0.1", "d <= 0.1", "d < 0.100000000000000001", "NOT (d > 0.1)"):
        assert not snap.holds_a_row_matching(none_meets), none_meets
    assert snap.holds_a_row_matching("d = 0.100000000000000001") and snap.holds_a_row_matching("d > 0.1")
    assert [f.path for f in snap.files_matching("d > 0.1")] == ["f"]
