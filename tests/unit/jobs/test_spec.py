"""Partition injection, JobSpec and the Airflow retry policy, without Spark."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from airflow.sdk.definitions.retry_policy import RetryAction

from airflow_delta_occ.engine import ConcurrentAppendException, TableNotFoundError
from airflow_delta_occ.engine.schema import parse_schema
from airflow_delta_occ.engine.sql_parser import parse_predicate
from airflow_delta_occ.exceptions import JobSpecError, PartitionSpecError, UnsafeExpressionError
from airflow_delta_occ.jobs.partitions import NULL_PARTITION, build_partition_filter, conjoin, render_expression
from airflow_delta_occ.jobs.spec import JobSpec, MergeClause, RunIdentity, SourceRef, TableRef
from airflow_delta_occ.retry.airflow import DeltaConflictRetryPolicy
from airflow_delta_occ.retry.classify import ConflictKind, conflict_failure

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
    assert render_expression(" t.id = s.id ", "on") == "`t`.`id` = `s`.`id`"
    for bad in ["t.id = s.id; DROP TABLE t", "t.id = 1 -- x", "t.id = /* */ 1", "", "t.id = ("]:
        with pytest.raises(UnsafeExpressionError):
            render_expression(bad, "on")
    assert conjoin(None, "") is None
    assert conjoin("a = 1", None) == "a = 1"
    assert conjoin("a = 1 OR b = 2", "c = 3") == "(a = 1 OR b = 2) AND (c = 3)"


def test_jobspec_round_trips_as_json():
    spec = JobSpec(operation="merge", target=TableRef(path="/t"), run=RunIdentity("d", "t", "r", 2, 3),
                   source=SourceRef(table="src"), condition=parse_predicate("t.id = s.id"),
                   clauses=(MergeClause("matched_update", set={"v": "s.v"}), MergeClause("not_matched_insert_all")),
                   retry_policies={"ConcurrentAppendException": {"max_attempts": 2}})
    assert JobSpec.from_json(spec.to_json()) == spec
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


def test_airflow_retry_policy():
    policy = DeltaConflictRetryPolicy()
    decision = policy.evaluate(ConcurrentAppendException(version=4, operation="MERGE"), 1, 3)
    assert decision.action is RetryAction.RETRY and decision.retry_delay is not None
    protocol = conflict_failure(ConflictKind.PROTOCOL, 1, RuntimeError("protocol changed"))
    assert policy.evaluate(protocol, 1, 3).action is RetryAction.FAIL
    assert policy.evaluate(TableNotFoundError("/t"), 1, 3).action is RetryAction.FAIL
    assert policy.evaluate(PartitionSpecError("bad"), 1, 3).action is RetryAction.FAIL
    assert policy.evaluate(ConnectionError("network"), 1, 3).action is RetryAction.DEFAULT


def test_platform_policies_come_from_config_and_tasks_override_them(monkeypatch):
    from airflow_delta_occ.config import conflict_policies as configured_policies
    from airflow_delta_occ.jobs.partitions import PartitionFilter
    from airflow_delta_occ.operators.delta import DeltaDeleteOperator

    monkeypatch.setenv("AIRFLOW__DELTA_OCC__CONFLICT_POLICIES", json.dumps(
        {"ConcurrentAppendException": {"max_attempts": 9, "initial_delay": 2}, "MetadataChangedException": "fail"}))
    assert configured_policies()["MetadataChangedException"] == {"action": "fail"}
    op = DeltaDeleteOperator(task_id="d", table="/lake/t", where="id = 1",
                             conflict_policies={"ConcurrentAppendException": {"initial_delay": 0.5}})
    spec_policies = op._common(None, RunIdentity("d", "t", "r"), PartitionFilter(()))["retry_policies"]
    assert spec_policies["ConcurrentAppendException"] == {"max_attempts": 9, "initial_delay": 0.5}
    assert spec_policies["MetadataChangedException"] == {"action": "fail"}


@pytest.mark.parametrize(("value", "problem"), [
    ("{not json", "Expecting property name"),
    ('["ConcurrentAppendException"]', "JSON object"),
    ('{"ConcurrentAppend": "retry"}', "unknown conflict 'ConcurrentAppend'"),
    ('{"ConcurrentAppendException": {"max_attempts": -1}}', "max_attempts must be a whole number"),
])
def test_bad_platform_policies_are_a_typed_error_naming_the_option(monkeypatch, value, problem):
    from airflow_delta_occ.config import conflict_policies as configured_policies
    from airflow_delta_occ.exceptions import ProviderConfigError

    monkeypatch.setenv("AIRFLOW__DELTA_OCC__CONFLICT_POLICIES", value)
    with pytest.raises(ProviderConfigError, match=r"\[delta_occ\] conflict_policies: .*" + re.escape(problem)):
        configured_policies()


def test_bad_task_policies_fail_when_the_dag_is_parsed():
    from airflow_delta_occ.operators.delta import DeltaDeleteOperator

    with pytest.raises(JobSpecError, match="conflict_policies: unknown conflict 'ConcurrentAppend'"):
        DeltaDeleteOperator(task_id="d", table="/lake/t", conflict_policies={"ConcurrentAppend": "skip"})
