"""Partition injection, JobSpec and the Airflow retry policy, without Spark."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from airflow_delta_occ.engine.schema import parse_schema
from airflow_delta_occ.engine.sql_parser import parse_predicate, to_sql
from airflow_delta_occ.exceptions import JobSpecError, PartitionSpecError, UnsafeExpressionError
from airflow_delta_occ.jobs.partitions import NULL_PARTITION, build_partition_filter, conjoin, parse_expression
from airflow_delta_occ.jobs.spec import JobSpec, MergeClause, RunIdentity, SourceRef, TableRef

pytestmark = pytest.mark.unit

SCHEMA = parse_schema(json.dumps({"type": "struct", "fields": [
    {"name": n, "type": t, "nullable": True, "metadata": {}}
    for n, t in [("id", "long"), ("date", "date"), ("country", "string"), ("hour", "integer"),
                 ("ts", "timestamp"), ("amount", "decimal(10,2)"), ("flag", "boolean")]]}))
PARTS = ["date", "country", "hour", "ts", "amount", "flag"]


@pytest.mark.parametrize(("partitions", "sql"), [
    ({"date": "2024-01-01"}, "`t`.`date` = DATE'2024-01-01'"),
    ({"DATE": dt.date(2024, 1, 1), "country": ["DE", "FR"]},
     "`t`.`date` = DATE'2024-01-01' AND `t`.`country` IN ('DE', 'FR')"),
    ({"hour": "7"}, "`t`.`hour` = 7"),
    ({"amount": "12.5"}, "`t`.`amount` = 12.50BD"),
    ({"flag": "true"}, "`t`.`flag` = TRUE"),
    ({"ts": "2024-01-01 10:00:00"}, "`t`.`ts` = TIMESTAMP'2024-01-01 10:00:00+00:00'"),
    ({"country": [NULL_PARTITION, "DE"]}, "(`t`.`country` = 'DE' OR `t`.`country` IS NULL)"),
    ({"country": "O'Brien\\"}, "`t`.`country` = 'O\\'Brien\\\\'"),
])
def test_partition_literals_are_typed_and_escaped(partitions, sql):
    assert build_partition_filter(SCHEMA, PARTS, partitions).to_sql("t") == sql


@pytest.mark.parametrize(("partitions", "match"), [
    ({"region": "EU"}, "not a column"),
    ({"id": 1}, "not a partition column"),
    ({"date": "2024-02-30"}, "type date"),
    ({"hour": "7 OR 1=1"}, "type integer"),
    ({"hour": 2**40}, "integer"),
    ({"flag": "yes please"}, "boolean"),
    ({"country": []}, "empty list"),
])
def test_bad_partitions(partitions, match):
    with pytest.raises(PartitionSpecError, match=match):
        build_partition_filter(SCHEMA, PARTS, partitions)


def test_render_expression_and_conjoin():
    assert to_sql(parse_expression(" t.id = s.id ", "on")) == "`t`.`id` = `s`.`id`"
    for bad in ["t.id = s.id; DROP TABLE t", "t.id = 1 -- x", "t.id = /* */ 1", "", "t.id = ("]:
        with pytest.raises(UnsafeExpressionError):
            parse_expression(bad, "on")
    assert conjoin(None, "") is None
    assert conjoin("a = 1", None) == "a = 1"
    assert conjoin("a = 1 OR b = 2", "c = 3") == "(a = 1 OR b = 2) AND (c = 3)"


def test_jobspec_round_trips_as_json():
    spec = JobSpec(operation="merge", target=TableRef(path="/t"), run=RunIdentity("d", "t", "r", 2, 3),
                   source=SourceRef(table="src"), condition=parse_predicate("t.id = s.id"),
                   clauses=(MergeClause("matched_update", set={"v": parse_predicate("`s`.`v`")}),
                            MergeClause("not_matched_insert_all")),
                   retry_policies={"ConcurrentAppendException": {"max_attempts": 2}}, planned_version=7)
    assert JobSpec.from_json(spec.to_json()) == spec and JobSpec.from_json(spec.to_json()).planned_version == 7
    for bad in (-1, "7", 1.5, True):
        data = json.loads(spec.to_json()) | {"planned_version": bad}
        with pytest.raises(JobSpecError, match="planned_version"):
            JobSpec.from_json(json.dumps(data))
    assert spec.run.app_id == "airflow:d/t/r/2"
    assert json.loads(spec.run.user_metadata())["airflow"]["try_number"] == 3


@pytest.mark.parametrize("kwargs", [
    {"operation": "truncate"},
    {"operation": "merge"},
    {"operation": "merge", "source": SourceRef(path="/s")},
    {"operation": "update"},
    {"operation": "overwrite_partitions", "source": SourceRef(path="/s")},
])
def test_incomplete_jobspecs_are_refused(kwargs):
    with pytest.raises(JobSpecError):
        JobSpec(target=TableRef(path="/t"), run=RunIdentity("d", "t", "r"), **kwargs)
    with pytest.raises(JobSpecError):
        TableRef(path="/t", name="db.t")
    with pytest.raises(JobSpecError):
        SourceRef(path="/s", query="SELECT 1")
    with pytest.raises(JobSpecError):
        MergeClause("matched_update")


@pytest.mark.parametrize(("partitions", "expected"), [
    ({"date": "2024-02-30"},
     r"day is out of range for month; expected a date as YYYY-MM-DD \(for example 2024-01-31\)"),
    ({"date": "31/01/2024"}, r"expected a date as YYYY-MM-DD"),
    ({"ts": "yesterday"}, r"expected a timestamp as YYYY-MM-DD\[ HH:MM:SS\[.ffffff\]\]\[\+HH:MM\]"),
    ({"flag": "yes please"}, r"expected true or false"),
])
def test_a_bad_partition_value_says_what_form_is_expected(partitions, expected):
    with pytest.raises(PartitionSpecError, match=expected):
        build_partition_filter(SCHEMA, PARTS, partitions)


def test_partitions_on_an_unpartitioned_table_say_to_use_where():
    with pytest.raises(PartitionSpecError, match=r"this table is not partitioned: confine the job with where= "
                                                 r"\(merge_condition= for a MERGE\) instead"):
        build_partition_filter(SCHEMA, [], {"country": "DE"})


def test_a_bad_typed_literal_in_a_condition_says_why():
    from airflow_delta_occ.engine.errors import InvalidLiteralError

    with pytest.raises(InvalidLiteralError, match="day is out of range for month; expected a date as YYYY-MM-DD"):
        parse_predicate("date = DATE'2024-02-30'")
