"""Nothing escapes its partitions, proven on real delta-spark (issue #8).

Each test reads the SQL the operators build as an attacker and as a user whose other partitions
must stay untouched: NOT MATCHED BY SOURCE clauses, source rows of other partitions, partition
values that rendered to nothing, hostile conditions (judged by Spark's own parser), statements
smuggled through ``source_query``, and conditions that only look confined.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from airflow_delta_occ.engine import DeltaLog, DeltaOccError
from airflow_delta_occ.engine.planner import Operation, plan_footprint, verdict
from airflow_delta_occ.engine.sql_parser import to_sql
from airflow_delta_occ.exceptions import (
    ConflictFailure,
    JobSpecError,
    MissingPartitionConstraintError,
    PartitionSpecError,
    SourceOutsidePartitionsError,
    UnsafeExpressionError,
)
from airflow_delta_occ.jobs.partitions import NULL_PARTITION
from airflow_delta_occ.jobs.spec import JobSpec, RunIdentity
from airflow_delta_occ.jobs.sql import statement_sql
from airflow_delta_occ.operators.delta import (
    DeltaAppendOperator,
    DeltaDeleteOperator,
    DeltaMergeOperator,
    DeltaOptimizeOperator,
    DeltaOverwritePartitionsOperator,
    DeltaUpdateOperator,
)
from airflow_delta_occ.retry.classify import ConflictKind
from airflow_delta_occ.spark.runner import read_source

from .differential.harness import USER_METADATA_CONF, run_interleaved
from .jobs import context, rows, run_checked, source

DE = {"date": "2024-01-01", "country": "DE"}
FR = {"date": "2024-01-01", "country": "FR"}
FAIL_FAST = {"ConcurrentAppendException": "fail", "ConcurrentDeleteReadException": "fail"}


def nmbs_merge(table: str, src: str, **kw: Any) -> DeltaMergeOperator:
    """The example of docs/operators.md: upsert a partition and delete what the source no longer has."""
    return DeltaMergeOperator(task_id="sync_de", table=table, source=src, merge_condition="t.id = s.id",
                              partitions=DE, clauses=[{"kind": "matched_update_all"},
                                                      {"kind": "not_matched_insert_all"},
                                                      {"kind": "not_matched_by_source_delete"}], **kw)


def version(path: str) -> int:
    return DeltaLog.for_table(path).latest_version()


# -- 1. NOT MATCHED BY SOURCE ---------------------------------------------------------------------

def test_not_matched_by_source_clauses_stay_in_their_partitions(spark: Any, sales: str, tmp_path: Any) -> None:
    src = source(spark, tmp_path, "de", [(1, 11, "2024-01-01", "DE")])
    op = nmbs_merge(sales, src)
    spec = op.build_spec(DeltaLog.for_table(sales).snapshot(), RunIdentity("sales", "sync_de", "r1"))
    assert "`t`.`country` = 'DE'" in to_sql(spec.clauses[2].condition)
    result = op.execute(context("sync_de"))
    assert result["confirmed"] and int(result["metrics"]["numTargetRowsDeleted"]) == 1
    # DE row 2 is gone (not in the source); both FR rows are untouched.
    assert rows(spark, sales) == [(1, 11, "DE"), (3, 0, "FR"), (4, 0, "FR")]


def test_unconfined_not_matched_by_source_would_delete_other_partitions(spark: Any, sales: str,
                                                                        tmp_path: Any) -> None:
    """The control: the statement the operators built before the fix deletes every FR row."""
    src = source(spark, tmp_path, "de", [(1, 11, "2024-01-01", "DE")])
    spark.read.format("delta").load(src).createOrReplaceTempView("nmbs_src")
    spark.sql(f"MERGE INTO delta.`{sales}` AS t USING nmbs_src AS s ON (t.id = s.id) AND (t.country = 'DE') "
              "WHEN NOT MATCHED BY SOURCE THEN DELETE")
    assert rows(spark, sales) == [(1, 0, "DE")]


def test_not_matched_by_source_merge_reads_the_whole_table(spark: Any, sales: str, tmp_path: Any) -> None:
    """Confined or not, delta-spark reads every file for such a MERGE; the planner says so too."""
    src = source(spark, tmp_path, "de", [(1, 11, "2024-01-01", "DE")])
    snapshot = DeltaLog.for_table(sales).snapshot()

    def footprints(merge_spec: JobSpec, update_spec: JobSpec) -> tuple[Any, Any]:
        merge_fp = plan_footprint(snapshot, Operation.MERGE, merge_spec.condition, target_alias="t",
                                  reads_whole_table=True, write_partitions=[DE], label="merge DE")
        update_fp = plan_footprint(snapshot, Operation.UPDATE, update_spec.condition, label="update FR")
        return merge_fp, update_fp

    def merge_a(session: Any) -> None:
        spec = nmbs_merge(sales, src, conflict_policies=FAIL_FAST).build_spec(
            snapshot, RunIdentity("sales", "sync_de", session.conf.get(USER_METADATA_CONF)))
        run_checked(session, spec)

    update = DeltaUpdateOperator(task_id="u", table=sales, set={"v": "v + 1"}, partitions=FR,
                                 conflict_policies=FAIL_FAST)

    def update_b(session: Any) -> None:
        run_checked(session, update.build_spec(snapshot, RunIdentity("sales", "u", "run-b")))

    race = run_interleaved(spark, merge_a, update_b)
    assert isinstance(race.a_error, ConflictFailure) and race.a_error.kind is ConflictKind.APPEND, race.a_outcome
    merge_spec = nmbs_merge(sales, src).build_spec(snapshot, RunIdentity("sales", "sync_de", "x"))
    merge_fp, update_fp = footprints(merge_spec, update.build_spec(snapshot, RunIdentity("sales", "u", "x")))
    planned = verdict(winner=update_fp, loser=merge_fp, snapshot=snapshot)
    assert planned.conflict and planned.exception == "ConcurrentAppendException", planned.reason
    assert rows(spark, sales) == [(1, 0, "DE"), (2, 0, "DE"), (3, 1, "FR"), (4, 1, "FR")]


# -- 2. source rows outside the partitions --------------------------------------------------------

def test_source_rows_of_other_partitions_are_refused_before_anything_is_written(spark: Any, sales: str,
                                                                                tmp_path: Any) -> None:
    src = source(spark, tmp_path, "mixed", [(1, 11, "2024-01-01", "DE"), (3, 33, "2024-01-01", "FR"),
                                            (8, 88, "2024-01-02", "DE")])
    before = version(sales)
    merge = DeltaMergeOperator(task_id="m", table=sales, source=src, merge_condition="t.id = s.id", partitions=DE)
    with pytest.raises(SourceOutsidePartitionsError, match="2 source row") as err:
        merge.execute(context("m"))
    assert err.value.count == 2
    assert {(str(s["date"]), s["country"]) for s in err.value.samples} == {("2024-01-01", "FR"), ("2024-01-02", "DE")}
    for op in (DeltaAppendOperator(task_id="a", table=sales, source=src, partitions=DE),
               DeltaOverwritePartitionsOperator(task_id="w", table=sales, source=src, partitions=DE)):
        with pytest.raises(SourceOutsidePartitionsError, match="2 source row"):
            op.execute(context(op.task_id))
    assert version(sales) == before and len(rows(spark, sales)) == 4
    # An insert clause that writes the partition column from an expression is judged by that expression.
    insert = DeltaMergeOperator(task_id="i", table=sales, source=src, merge_condition="t.id = s.id", partitions=DE,
                                clauses=[{"kind": "not_matched_insert",
                                          "set": {"id": "s.id", "v": "s.v", "date": "s.date", "country": "'FR'"}}])
    with pytest.raises(SourceOutsidePartitionsError, match="3 source row"):
        insert.execute(context("i"))
    assert version(sales) == before


def test_source_rows_outside_can_be_dropped_explicitly(spark: Any, sales: str, tmp_path: Any,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="airflow_delta_occ.spark.early_abort")
    src = source(spark, tmp_path, "mixed", [(1, 11, "2024-01-01", "DE"), (3, 33, "2024-01-01", "FR"),
                                            (9, 99, "2024-01-01", "DE")])
    result = DeltaMergeOperator(task_id="m", table=sales, source=src, merge_condition="t.id = s.id", partitions=DE,
                                source_outside_partitions="drop").execute(context("m"))
    assert result["dropped_source_rows"] == 1 and result["confirmed"]
    assert rows(spark, sales) == [(1, 11, "DE"), (2, 0, "DE"), (3, 0, "FR"), (4, 0, "FR"), (9, 99, "DE")]
    appended = DeltaAppendOperator(task_id="a", table=sales, source=src, partitions=FR,
                                   source_outside_partitions="drop").execute(context("a"))
    assert appended["dropped_source_rows"] == 2
    assert rows(spark, sales).count((3, 33, "FR")) == 1
    # The source check's one query also tells early abort (on by default) whether any row is left to write: with
    # one row kept the append is watched; with every row dropped it may commit nothing, so it is never watched
    # (a commit cannot doom a job that writes nothing, and judging it as if it wrote would stop it for nothing).
    # (Whether the watch got to judge the kept-row append depends on how fast it ran, so only the refusal is read.)
    assert "no source rows" not in caplog.text
    caplog.clear()
    only_fr = source(spark, tmp_path, "only_fr", [(5, 55, "2024-01-01", "FR")])
    emptied = DeltaAppendOperator(task_id="e", table=sales, source=only_fr, partitions=DE,
                                  source_outside_partitions="drop").execute(context("e"))
    assert emptied["dropped_source_rows"] == 1
    assert "Early abort does not watch this append: it may commit no file (no source rows)" in caplog.text
    assert rows(spark, sales).count((5, 55, "FR")) == 0


def test_update_clauses_cannot_move_rows_out_of_the_partitions(sales: str) -> None:
    snapshot = DeltaLog.for_table(sales).snapshot()
    run = RunIdentity("sales", "x", "r")
    with pytest.raises(JobSpecError, match="would move rows out"):
        DeltaUpdateOperator(task_id="u", table=sales, set={"Country": "'FR'"}, partitions=DE).build_spec(snapshot, run)
    with pytest.raises(JobSpecError, match="would move rows out"):
        DeltaMergeOperator(task_id="m", table=sales, source="/s", merge_condition="t.id = s.id", partitions=DE,
                           clauses=[{"kind": "matched_update", "set": {"country": "s.country"}}]
                           ).build_spec(snapshot, run)


# -- 3. partition values that rendered to nothing -------------------------------------------------

@pytest.mark.parametrize("value", ["None", "", "  ", "null", None, ["DE", None]])
def test_partition_values_that_rendered_to_nothing_are_refused(spark: Any, sales: str, value: Any) -> None:
    before = version(sales)
    op = DeltaDeleteOperator(task_id="d", table=sales, where="id > 0", partitions={"date": "2024-01-01"})
    op.partitions = {"date": "2024-01-01", "country": value}  # as a template renders it, after parsing
    with pytest.raises(PartitionSpecError, match="'country'"):
        op.execute(context("d"))
    assert version(sales) == before and len(rows(spark, sales)) == 4


def test_the_null_partition_is_asked_for_explicitly(spark: Any, sales: str) -> None:
    spark.sql(f"INSERT INTO delta.`{sales}` VALUES (7, 0, DATE'2024-01-01', NULL)")
    result = DeltaDeleteOperator(task_id="d", table=sales,
                                 partitions={"date": "2024-01-01", "country": NULL_PARTITION}).execute(context("d"))
    assert "`country` IS NULL" in result["condition"]
    assert rows(spark, sales) == [(1, 0, "DE"), (2, 0, "DE"), (3, 0, "FR"), (4, 0, "FR")]


# -- 4. hostile conditions, judged by Spark's own parser ------------------------------------------

ATTACKS = [
    # CASE ... END hid the parentheses from the old checker; Spark closed the injected one.
    "CASE WHEN t.case = 1 THEN true ELSE true END) OR (t.end = 1",
    "id = 1) OR (1 = 1",
    "r'\\' ) OR (1=1 OR '' = '",
    "'\\u0027) OR (1=1 OR \\u0027' = 'x'",
    "id IN (SELECT id FROM other) OR true",
    "EXISTS (SELECT 1) OR true",
    "x -> true",
    "1 = 1 --",
    "id = 1; DELETE FROM t",
]
FRAGMENTS = st.sampled_from([
    "(", ")", " OR ", " AND ", "1=1", "CASE", " WHEN ", " THEN ", " ELSE ", " END", "t.case", "t.end", "'", '"',
    "`", "\\", "r'", "id", " = ", "true", "country", "NOT ", ",", "[", "]", "::int", "INTERVAL '1' DAY", "upper(",
    "X'", "\n", "'DE'", "t.id", "s.id", "--", ";", "x", "0", "IN (", "IS NULL", "BETWEEN 1 AND 2", "||", "-",
])


def _conjuncts(expr: Any) -> list[Any]:
    if expr.getClass().getSimpleName() == "And":
        return _conjuncts(expr.left()) + _conjuncts(expr.right())
    return [expr]


def _assert_confined(spark: Any, statement: str, condition_of: str, predicate: str) -> None:
    """Spark's parser reads ``statement``; each conjunct of ``predicate`` must be a top-level conjunct."""
    parser = spark._jsparkSession.sessionState().sqlParser()
    condition = getattr(parser.parsePlan(statement), condition_of)()
    tops = {c.toString() for c in _conjuncts(condition)}
    wanted = {c.toString() for c in _conjuncts(parser.parseExpression(predicate))}
    assert wanted <= tops, (statement, tops)


def _check(spark: Any, sales: str, where: str) -> None:
    """``where`` as a DELETE filter and as a MERGE condition: refused with a typed error, or confined."""
    snapshot = DeltaLog.for_table(sales).snapshot()
    run = RunIdentity("sales", "x", "r")
    builds = [
        (lambda: DeltaDeleteOperator(task_id="d", table=sales, where=where, partitions=DE), None, "condition",
         "`date` = DATE'2024-01-01' AND `country` = 'DE'"),
        (lambda: DeltaMergeOperator(task_id="m", table=sales, source="/s", merge_condition=where, partitions=DE),
         "src", "mergeCondition", "`t`.`date` = DATE'2024-01-01' AND `t`.`country` = 'DE'"),
    ]
    for build, view, condition_of, predicate in builds:
        try:
            spec = build().build_spec(snapshot, run)
        except DeltaOccError:  # refused with a typed error of the provider's tree, before Spark
            continue
        _assert_confined(spark, str(statement_sql(spec, view)), condition_of, predicate)


@pytest.mark.parametrize("where", ATTACKS)
def test_known_attacks_are_refused_or_confined(spark: Any, sales: str, where: str) -> None:
    _check(spark, sales, where)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(FRAGMENTS, min_size=1, max_size=14).map("".join))
# Found by this test in CI: the parser took a string after an interval's unit as another part, and
# rendered text Spark's parser refuses (a string without a unit is only ever a whole interval).
@example("INTERVAL '1' DAY''")
@example("INTERVAL '1' DAY'DE'")
def test_generated_hostile_conditions_never_escape_the_partition_predicate(spark: Any, sales: str,
                                                                            where: str) -> None:
    _check(spark, sales, where)


def test_an_escape_attempt_changes_nothing_on_the_table(spark: Any, sales: str) -> None:
    before = version(sales)
    for where in ATTACKS[:3]:
        with pytest.raises(UnsafeExpressionError):
            DeltaDeleteOperator(task_id="d", table=sales, where=where, partitions=DE).execute(context("d"))
    assert version(sales) == before and len(rows(spark, sales)) == 4
    # Spark's \u escape hides no quote from the provider: the text is one string literal, compared as data.
    DeltaDeleteOperator(task_id="d", table=sales, where=ATTACKS[3], partitions=DE).execute(context("d"))
    assert len(rows(spark, sales)) == 4


# -- 5. source_query must be a query --------------------------------------------------------------

def test_source_query_that_is_not_a_query_is_refused_before_anything_runs(spark: Any, sales: str,
                                                                          tmp_path: Any) -> None:
    other = source(spark, tmp_path, "other", [(1, 1, "2024-01-01", "DE")])
    for statement in (f"WITH c AS (SELECT 1) DELETE FROM delta.`{other}`",
                      f"WITH c AS (SELECT 1 AS id) INSERT INTO delta.`{other}` SELECT 5, 5, DATE'2024-01-01', 'DE'",
                      f"with c (x) as (select 1), d as (select 2) UPDATE delta.`{other}` SET v = 0",
                      f"(SELECT 1) ; DROP TABLE delta.`{other}`"):
        with pytest.raises(UnsafeExpressionError):
            DeltaMergeOperator(task_id="m", table=sales, source_query=statement, merge_condition="t.id = s.id")
        # The runner's own line: Spark's parser refuses it inside SELECT * FROM ( ... ).
        spec = SimpleNamespace(source=SimpleNamespace(path=None, table=None, query=statement, format="delta"))
        with pytest.raises(Exception):  # noqa: B017 - any refusal will do; the table check below is the point
            read_source(spark.newSession(), spec)
    assert rows(spark, other) == [(1, 1, "DE")] and version(other) == 0
    ok = DeltaMergeOperator(task_id="m", table=sales, merge_condition="t.id = s.id", partitions=DE,
                            source_query="WITH c AS (SELECT 1 AS id, 5 AS v) SELECT id, v, DATE'2024-01-01' AS date, "
                                         "'DE' AS country FROM c").execute(context("m"))
    assert ok["confirmed"] and rows(spark, sales)[0] == (1, 5, "DE")


# -- 6. strict_partitions looks at what the condition confines ------------------------------------

@pytest.mark.parametrize(("where", "confined"), [
    ("country = 'DE' OR 1=1", False),
    ("country = 'DE' OR country <> 'DE' OR country IS NULL", False),
    ("id = 1 OR country = 'DE'", False),
    ("upper(country) = 'DE'", False),
    ("country = 'DE'", True),
    ("country <> 'DE'", True),
    ("date >= '2024-01-01' AND id = 1", True),
    ("NOT (country = 'DE' OR 1=1)", True),
    # Excluding only NULL, or only impossible values, confines nothing.
    ("country = 'DE' OR country <> 'DE'", False),
    ("NOT (country IS NULL)", False),
    ("country >= ''", False),
    ("date >= DATE'0001-01-01'", False),
    ("country IS NULL", True),
])
def test_strict_partitions_checks_what_the_condition_confines(sales: str, where: str, confined: bool) -> None:
    snapshot = DeltaLog.for_table(sales).snapshot()
    op = DeltaDeleteOperator(task_id="d", table=sales, where=where, strict_partitions=True)
    if confined:
        op.build_spec(snapshot, RunIdentity("sales", "d", "r"))
    else:
        with pytest.raises(MissingPartitionConstraintError, match="not confined"):
            op.build_spec(snapshot, RunIdentity("sales", "d", "r"))


# -- 7. identifiers are the table's columns -------------------------------------------------------

def test_identifiers_resolve_case_insensitively_and_are_quoted_once(spark: Any, sales: str) -> None:
    snapshot = DeltaLog.for_table(sales).snapshot()
    run = RunIdentity("sales", "u", "r")
    spec = DeltaUpdateOperator(task_id="u", table=sales, set={"V": "v + 1"}, partitions=DE).build_spec(snapshot, run)
    assert {k: to_sql(v) for k, v in spec.set.items()} == {"v": "(`v` + 1)"}
    for bad in ({"v`) = 1, (`id": "0"}, {"nope": "1"}):
        with pytest.raises(JobSpecError, match="not a column of the table"):
            DeltaUpdateOperator(task_id="u", table=sales, set=bad, partitions=DE).build_spec(snapshot, run)
    with pytest.raises(JobSpecError, match="partition column"):
        DeltaOptimizeOperator(task_id="o", table=sales, zorder_by=["COUNTRY"]).build_spec(snapshot, run)
    spec = DeltaOptimizeOperator(task_id="o", table=sales, zorder_by=["ID"], partitions=DE).build_spec(snapshot, run)
    assert spec.zorder_by == ("id",)
    DeltaUpdateOperator(task_id="u", table=sales, set={"V": "v + 1"}, partitions=DE).execute(context("u"))
    assert rows(spark, sales)[:2] == [(1, 1, "DE"), (2, 1, "DE")]


def test_merge_confinement_needs_partitions_under_strict(sales: str) -> None:
    snapshot = DeltaLog.for_table(sales).snapshot()
    confined_on = "t.id = s.id AND t.date = DATE'2024-01-01' AND t.country = 'DE'"
    op = DeltaMergeOperator(task_id="m", table=sales, source="/s", merge_condition=confined_on, strict_partitions=True,
                            clauses=[{"kind": "matched_update_all"}, {"kind": "not_matched_by_source_delete"}])
    with pytest.raises(MissingPartitionConstraintError, match="NOT MATCHED BY SOURCE"):
        op.build_spec(snapshot, RunIdentity("sales", "m", "r"))


def test_insert_clauses_must_write_inside_the_partitions_deterministically(sales: str) -> None:
    snapshot = DeltaLog.for_table(sales).snapshot()
    for values, match in (({"id": "s.id", "v": "s.v", "date": "s.date"}, "does not set partition column"),
                          ({"id": "s.id", "v": "s.v", "date": "current_date", "country": "'DE'"}, "non-deterministic")):
        op = DeltaMergeOperator(task_id="m", table=sales, source="/s", merge_condition="t.id = s.id", partitions=DE,
                                clauses=[{"kind": "not_matched_insert", "set": values}])
        with pytest.raises(JobSpecError, match=match):
            op.build_spec(snapshot, RunIdentity("sales", "m", "r"))


def test_source_values_are_checked_as_the_values_delta_writes(spark: Any, tmp_path: Any) -> None:
    """A source ``hour INT`` 7 equals the string partition '07' in Spark's comparison but is written as '7'."""
    table = str(tmp_path / "hours")
    spark.sql(f"CREATE TABLE delta.`{table}` (id INT, hour STRING) USING delta PARTITIONED BY (hour)")
    spark.sql(f"INSERT INTO delta.`{table}` VALUES (1, '07')")
    src = str(tmp_path / "hours_src")
    spark.sql("SELECT 2 AS id, 7 AS hour").write.format("delta").save(src)
    before = version(table)
    with pytest.raises(SourceOutsidePartitionsError, match="1 source row"):
        DeltaAppendOperator(task_id="a", table=table, source=src, partitions={"hour": "07"}).execute(context("a"))
    assert version(table) == before


def test_columns_a_generated_partition_column_reads_cannot_be_set(spark: Any, tmp_path: Any) -> None:
    table = str(tmp_path / "events")
    spark.sql(f"CREATE TABLE delta.`{table}` (id INT, ts TIMESTAMP, d DATE GENERATED ALWAYS AS (CAST(ts AS DATE))) "
              "USING delta PARTITIONED BY (d)")
    snapshot = DeltaLog.for_table(table).snapshot()
    op = DeltaUpdateOperator(task_id="u", table=table, set={"TS": "ts + INTERVAL 3 DAYS"},
                             partitions={"d": "2024-01-01"})
    with pytest.raises(JobSpecError, match="partition column 'd' is generated"):
        op.build_spec(snapshot, RunIdentity("events", "u", "r"))
