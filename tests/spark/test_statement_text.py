"""The text Spark parses is the text the provider rendered, whatever the session's settings (issue #20).

A worker's Spark may be started with settings that change what SQL text means (a platform's
spark-defaults, a connection's ``spark_conf``, a Connect server's launch). Each is flipped here on
the SparkContext's own conf, where every new session of the process (the runner's private job
session among them) takes it from, and a real job runs on a table with hostile partition values:
its statement must mean what was rendered (exact rows after), or the job must refuse before
anything is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog, DeltaOccError
from airflow_delta_occ.exceptions import DeltaJobError, StatementTextError, UnsafeExpressionError
from airflow_delta_occ.operators.delta import DeltaDeleteOperator, DeltaMergeOperator, DeltaUpdateOperator
from airflow_delta_occ.spark.statements import STATEMENT_SETTINGS, pinned_settings

from .jobs import context

HOSTILE = "x' OR 1=1 --"
BACKSLASH = "a\\b"
FLIPPED = {
    "spark.sql.variable.substitute": "true",
    "spark.sql.parser.escapedStringLiterals": "true",
    "spark.sql.ansi.enabled": "false",
    "spark.sql.ansi.doubleQuotedIdentifiers": "true",
    "spark.sql.storeAssignmentPolicy": "LEGACY",
    "spark.sql.caseSensitive": "true",
    "spark.sql.parser.quotedRegexColumnNames": "true",
    "spark.sql.legacy.exponentLiteralAsDecimal.enabled": "true",
    "spark.sql.legacy.allowNegativeScaleOfDecimal": "true",
    "spark.sql.preserveCharVarcharTypeInfo": "true",
}
# The builder's session options (UTC, see spark.session) reach every new session over the SparkContext's
# conf, so the time zone cannot be flipped this way; the pinned_settings test flips it on a session.
TIME_ZONE = "spark.sql.session.timeZone"


def test_every_pinned_setting_is_flipped_here() -> None:
    assert set(FLIPPED) | {TIME_ZONE} == set(STATEMENT_SETTINGS)


@pytest.fixture
def context_conf(spark: Any) -> Iterator[Any]:
    """Set a conf on the SparkContext itself (as a worker whose Spark started with it), undone after."""
    jconf = spark.sparkContext._jsc.sc().conf()
    saved: dict[str, str | None] = {}

    def flip(key: str, value: str) -> None:
        saved.setdefault(key, jconf.get(key) if jconf.contains(key) else None)
        jconf.set(key, value)
        assert spark.newSession().conf.get(key) == value  # the runner's job session takes it

    yield flip
    for key, value in saved.items():
        if value is None:
            jconf.remove(key)
        else:
            jconf.set(key, value)


@pytest.fixture
def people(spark: Any, tmp_path: Any) -> str:
    """Partitioned by country, with partition values that hold a quote and a backslash."""
    path = str(tmp_path / "people")
    spark.createDataFrame([(1, 1, "n1", "DE"), (2, 2, "n2", "DE"), (3, 3, "n3", HOSTILE), (4, 4, "n4", BACKSLASH)],
                          "id INT, v INT, name STRING, country STRING") \
        .write.format("delta").partitionBy("country").save(path)
    return path


def table(spark: Any, path: str) -> list[tuple[Any, ...]]:
    fresh = spark.newSession()  # read with Spark's defaults, whatever a test flipped
    return sorted(tuple(r) for r in fresh.read.format("delta").load(path).select("id", "v", "name", "country")
                  .collect())


ORIGINAL = [(1, 1, "n1", "DE"), (2, 2, "n2", "DE"), (3, 3, "n3", HOSTILE), (4, 4, "n4", BACKSLASH)]


@pytest.mark.parametrize("key", sorted(FLIPPED))
def test_a_flipped_setting_does_not_change_what_the_statements_mean(spark: Any, people: str, context_conf: Any,
                                                                    key: str) -> None:
    context_conf(key, FLIPPED[key])
    DeltaDeleteOperator(task_id="d", table=people, partitions={"country": HOSTILE}).execute(context("d"))
    result = DeltaUpdateOperator(task_id="u", table=people, partitions={"country": BACKSLASH},
                                 set={"name": "'q\\'s \\\\ \"r\"'", "v": "v + 10"}).execute(context("u"))
    assert result["confirmed"]
    assert table(spark, people) == [(1, 1, "n1", "DE"), (2, 2, "n2", "DE"), (4, 14, "q's \\ \"r\"", BACKSLASH)]


@pytest.mark.parametrize("flip", [{}, {"spark.sql.ansi.enabled": "false"}])
def test_an_overflow_fails_the_job_and_writes_nothing_as_in_sparks_default(spark: Any, people: str,
                                                                            context_conf: Any,
                                                                            flip: dict[str, str]) -> None:
    for key, value in flip.items():
        context_conf(key, value)
    before = DeltaLog.for_table(people).latest_version()
    with pytest.raises(DeltaJobError, match=r"(?i)overflow"):
        DeltaUpdateOperator(task_id="u", table=people, partitions={"country": "DE"},
                            set={"v": "v + 2147483647"}).execute(context("u"))
    assert DeltaLog.for_table(people).latest_version() == before and table(spark, people) == ORIGINAL


def test_case_sensitive_sessions_resolve_names_as_the_provider_did(spark: Any, people: str,
                                                                   context_conf: Any) -> None:
    context_conf("spark.sql.caseSensitive", "true")
    DeltaDeleteOperator(task_id="d", table=people, where="ID = 1", partitions={"COUNTRY": "DE"}).execute(context("d"))
    assert table(spark, people) == ORIGINAL[1:]


def test_a_merge_reads_its_source_as_rendered_under_flipped_settings(spark: Any, people: str,
                                                                     context_conf: Any) -> None:
    for key in ("spark.sql.parser.quotedRegexColumnNames", "spark.sql.parser.escapedStringLiterals",
                "spark.sql.ansi.doubleQuotedIdentifiers"):
        context_conf(key, FLIPPED[key])
    DeltaMergeOperator(task_id="m", table=people, partitions={"country": HOSTILE}, merge_condition="t.id = s.id",
                       source_query="SELECT `id`, `v` + 100 AS `v`, 'm' AS `name`, 'x\\' OR 1=1 --' AS `country` "
                                    "FROM VALUES (3, 3), (9, 9) AS `src`(`id`, `v`)").execute(context("m"))
    assert table(spark, people) == sorted([*ORIGINAL[:2], (3, 103, "m", HOSTILE), (4, 4, "n4", BACKSLASH),
                                           (9, 109, "m", HOSTILE)])


def test_pinned_settings_turn_substitution_off_and_restore_the_sessions_own(spark: Any) -> None:
    session = spark.newSession()
    session.conf.set("spark.sql.variable.substitute", "true")
    session.conf.set("spark.sql.session.timeZone", "Asia/Tokyo")
    probe = "SELECT '${spark.sql.session.timeZone}' AS v"
    assert session.sql(probe).collect()[0]["v"] == "Asia/Tokyo"  # what Spark does by default
    with pinned_settings(session):
        assert session.sql(probe).collect()[0]["v"] == "${spark.sql.session.timeZone}"
        assert session.conf.get("spark.sql.session.timeZone") == "UTC"
    assert session.conf.get("spark.sql.variable.substitute") == "true"
    assert session.sql(probe).collect()[0]["v"] == "Asia/Tokyo"


def test_templated_markers_are_refused_before_anything_is_written(spark: Any, people: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The attacks of the issue, through templates (checked once rendered): nothing changes."""
    monkeypatch.setenv("Q", "x' OR '1'='1")
    monkeypatch.setenv("SECRET", "hunter2")
    before = DeltaLog.for_table(people).latest_version()
    attacks = [
        DeltaDeleteOperator(task_id="d", table=people, partitions={"country": "{{ params.c }}"},
                            strict_partitions=True),
        DeltaDeleteOperator(task_id="d", table=people, partitions={"country": "{{ params.c }}"}),
        DeltaUpdateOperator(task_id="u", table=people, set={"name": "{{ params.v }}"}, where="id = 1"),
        DeltaDeleteOperator(task_id="d", table="{{ params.t }}", where="id = 1"),
    ]
    rendered = [{"partitions": {"country": "${env:Q}"}},
                {"partitions": {"country": "${spark.sql.session.timeZone}"}},
                {"set": {"name": "'${env:SECRET}'"}},
                {"table": people + "${env:Q}"}]
    for op, values in zip(attacks, rendered, strict=True):
        for name, value in values.items():
            setattr(op, name, value)
        with pytest.raises(UnsafeExpressionError) as caught:
            op.execute(context(op.task_id))
        assert isinstance(caught.value, StatementTextError) or "${" in str(caught.value)
        assert "hunter2" not in str(caught.value)
    assert DeltaLog.for_table(people).latest_version() == before and table(spark, people) == ORIGINAL


def test_session_variables_and_identifier_cannot_rename_a_column(spark: Any, people: str) -> None:
    spark.sql("DECLARE OR REPLACE VARIABLE delta_occ_v INT DEFAULT 1")
    with pytest.raises(DeltaOccError, match="delta_occ_v"):
        DeltaDeleteOperator(task_id="d", table=people, where="id = delta_occ_v",
                            partitions={"country": "DE"}).execute(context("d"))
    with pytest.raises(UnsafeExpressionError, match="IDENTIFIER"):
        DeltaDeleteOperator(task_id="d", table=people, where="IDENTIFIER('id') = 1", partitions={"country": "DE"})
    assert table(spark, people) == ORIGINAL


# -- a commit that escaped is never reported as success ----------------------------------------------

def test_a_commit_outside_the_planned_partitions_fails_the_task_and_names_the_restore(spark: Any,
                                                                                      people: str) -> None:
    """Spark runs another statement than the one planned (here: a DELETE of another partition, tagged with
    this run, as a rewritten statement would be): the confirmation reads the commit's actions, fails
    with the partitions touched, the version and the RESTORE that undoes it, and that RESTORE works."""
    from airflow_delta_occ.exceptions import CommitOutsidePartitionsError
    from airflow_delta_occ.jobs.result import JobResult
    from airflow_delta_occ.spark.runner import run_job

    planned = DeltaDeleteOperator(task_id="d", table=people, partitions={"country": "DE"})
    prepared = planned.prepare(context("d"))
    other = DeltaDeleteOperator(task_id="d", table=people, partitions={"country": HOSTILE})
    ran = other.build_spec(prepared.snapshot, prepared.spec.run)  # the same task run, another statement
    result: JobResult = run_job(spark, ran).raise_for_status()
    assert table(spark, people) == [ORIGINAL[0], ORIGINAL[1], ORIGINAL[3]]
    with pytest.raises(CommitOutsidePartitionsError) as caught:
        planned.confirm(prepared, result)
    error = caught.value
    assert error.version == result.version and error.partitions == ({"country": HOSTILE},)
    assert f"VERSION AS OF {result.version - 1}" in str(error) and error.restore in str(error)
    assert "removed" in str(error) and "country=x' OR 1=1 --" in str(error)
    spark.sql(error.restore).collect()
    assert table(spark, people) == ORIGINAL


def test_commits_inside_their_partitions_are_confirmed(spark: Any, people: str) -> None:
    """The check fails no correct job: a DELETE, an UPDATE, an OPTIMIZE and a MERGE that deletes what
    its source lacks, each confined to its partition, are confirmed."""
    for op in (DeltaDeleteOperator(task_id="d", table=people, where="id = 1", partitions={"country": "DE"}),
               DeltaUpdateOperator(task_id="u", table=people, set={"v": "v + 1"}, partitions={"country": BACKSLASH}),
               DeltaMergeOperator(task_id="m", table=people, partitions={"country": HOSTILE},
                                  merge_condition="t.id = s.id",
                                  source_query="SELECT 9 AS id, 9 AS v, 'n9' AS name, 'x\\' OR 1=1 --' AS country",
                                  clauses=[{"kind": "not_matched_insert_all"},
                                           {"kind": "not_matched_by_source_delete"}])):
        assert op.execute(context(op.task_id))["confirmed"], op.task_id
    from airflow_delta_occ.operators.delta import DeltaOptimizeOperator

    spark.createDataFrame([(10, 10, "n10", HOSTILE)], "id INT, v INT, name STRING, country STRING") \
        .write.format("delta").mode("append").save(people)  # a second file there, for OPTIMIZE to compact
    result = DeltaOptimizeOperator(task_id="o", table=people, partitions={"country": HOSTILE}).execute(context("o"))
    assert result["confirmed"] and result["metrics"]["numRemovedFiles"] == "2", result["metrics"]
    assert table(spark, people) == [(2, 2, "n2", "DE"), (4, 5, "n4", BACKSLASH), (9, 9, "n9", HOSTILE),
                                    (10, 10, "n10", HOSTILE)]


def test_auto_compaction_in_the_jobs_name_neither_hides_an_escape_nor_replaces_the_jobs_commit(
        spark: Any, tmp_path: Any, context_conf: Any) -> None:
    """Delta's auto-compaction commits right after the job with the job's userMetadata: the result
    reports the job's own commit, and every commit in the run's name is checked."""
    from airflow_delta_occ.exceptions import CommitOutsidePartitionsError
    from airflow_delta_occ.spark.runner import run_job

    path = str(tmp_path / "compacted")
    spark.sql(f"CREATE TABLE delta.`{path}` (id INT, v INT, country STRING) USING delta PARTITIONED BY (country) "
              "TBLPROPERTIES (delta.autoOptimize.autoCompact = true)")
    for i in range(4):
        spark.sql(f"INSERT INTO delta.`{path}` VALUES ({i}, 0, 'DE'), ({10 + i}, 0, 'FR')")
    context_conf("spark.databricks.delta.autoCompact.minNumFiles", "2")
    update = DeltaUpdateOperator(task_id="u", table=path, partitions={"country": "DE"}, where="id = 0",
                                 set={"v": "v + 1"})
    result = update.execute(context("u"))
    history = {r["version"]: r["operation"] for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()}
    assert history[result["version"]] == "UPDATE" and "OPTIMIZE" in history.values(), history
    assert result["confirmed"] and result["metrics"]["numUpdatedRows"] == "1"

    planned = DeltaUpdateOperator(task_id="e", table=path, partitions={"country": "DE"}, where="id = 1",
                                  set={"v": "v + 1"})
    prepared = planned.prepare(context("e"))
    ran = DeltaUpdateOperator(task_id="e", table=path, partitions={"country": ["DE", "FR"]}, where="id IN (1, 11)",
                              set={"v": "v + 1"}).build_spec(prepared.snapshot, prepared.spec.run)
    escaped = run_job(spark, ran).raise_for_status()
    with pytest.raises(CommitOutsidePartitionsError, match="country=FR"):
        planned.confirm(prepared, escaped)
