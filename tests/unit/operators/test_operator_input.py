"""Bad input gets a typed error when the DAG file is parsed, before any table is read (issue #8)."""

from __future__ import annotations

import copy
import math
import pickle
from typing import Any

import pytest
from airflow.sdk.definitions.retry_policy import RetryAction

from airflow_delta_occ.engine.errors import DeltaOccError, LogCorruptError, PredicateSyntaxError
from airflow_delta_occ.engine.sql_parser import MAX_DEPTH, parse_predicate
from airflow_delta_occ.exceptions import (
    JobSpecError,
    PartitionSpecError,
    SourceOutsidePartitionsError,
    UnsafeExpressionError,
)
from airflow_delta_occ.jobs.partitions import NULL_PARTITION, partitions_mapping
from airflow_delta_occ.jobs.queries import check_source_query
from airflow_delta_occ.jobs.result import JobResult
from airflow_delta_occ.operators.delta import (
    DeltaAppendOperator,
    DeltaDeleteOperator,
    DeltaMergeOperator,
    DeltaOptimizeOperator,
    DeltaOverwritePartitionsOperator,
    DeltaUpdateOperator,
)
from airflow_delta_occ.operators.retry_policy import DeltaConflictRetryPolicy

pytestmark = pytest.mark.unit

T = {"task_id": "t", "table": "/lake/sales"}


def merge(**kw: Any) -> DeltaMergeOperator:
    kw.setdefault("source", "/lake/src")
    kw.setdefault("merge_condition", "t.id = s.id")
    return DeltaMergeOperator(**T, **kw)


@pytest.mark.parametrize(("build", "match"), [
    (lambda: merge(source_table="db.src"), "exactly one of source="),
    (lambda: merge(source=None), "exactly one of source="),
    (lambda: DeltaAppendOperator(**T), "exactly one of source="),
    (lambda: merge(clauses=[{"kind": "matched_upsert"}]), "unknown merge clause kind 'matched_upsert'"),
    (lambda: merge(clauses=[{"kind": "matched_update"}]), "needs a non-empty set"),
    (lambda: merge(clauses=[{"kind": "matched_delete", "set": {"v": "1"}}]), "takes no set"),
    (lambda: merge(clauses=[{"kind": "matched_delete", "when": "x"}]), "unknown field"),
    (lambda: merge(clauses="matched_update_all"), "must be a list"),
    (lambda: merge(clauses=[]), "at least one WHEN"),
    (lambda: merge(clauses=[{"kind": "matched_update", "set": ["v"]}]), "set must be a mapping"),
    (lambda: merge(target_alias="s"), "both 's'"),
    (lambda: DeltaDeleteOperator(**T), "needs where= or partitions="),
    (lambda: DeltaOverwritePartitionsOperator(**T, source="/s"), "needs partitions="),
    (lambda: DeltaUpdateOperator(**T, set={}), "non-empty mapping"),
    (lambda: DeltaUpdateOperator(**T, set="v = 1"), "non-empty mapping"),
    (lambda: DeltaOptimizeOperator(**T, zorder_by="id"), "must be a list"),
    (lambda: DeltaOptimizeOperator(**T, zorder_by=[1]), "column names"),
    (lambda: merge(source_outside_partitions="ignore"), "source_outside_partitions"),
    (lambda: DeltaDeleteOperator(task_id="t", table="", where="id = 1"), "non-empty string"),
    (lambda: merge(clauses=[{"kind": "matched_delete", "condition": "a = ; DROP"}]), "not accepted"),
    (lambda: merge(clauses=[{"kind": "matched_update", "set": {"v": None}}]), "must be SQL text"),
    (lambda: DeltaUpdateOperator(**T, set={"v": 1.5}), "must be SQL text"),
    (lambda: DeltaUpdateOperator(**T, set={"v": "s.v +"}), "not accepted"),
])
def test_job_shape_errors_at_parse_time(build: Any, match: str) -> None:
    with pytest.raises(JobSpecError, match=match):
        build()


@pytest.mark.parametrize(("partitions", "match"), [
    (["date", "2024-01-01"], "must be a mapping"),
    ("date=2024-01-01", "JSON object"),
    ('["DE"]', "must be a mapping"),
    ({"country": None}, "NULL_PARTITION"),
    ({"country": "None"}, "rendered to 'None'"),
    ({"country": ""}, "rendered to ''"),
    ({"country": " NULL "}, "rendered to"),
    ({"country": ["DE", None]}, "is None"),
    ({"country": []}, "empty list"),
    ({"country": {"a": 1}}, "flat list"),
    ({"country": [["DE"]]}, "flat list"),
    ({"": "DE"}, "column names"),
    ({1: "DE"}, "column names"),
    ("[" * 100_000 + "]" * 100_000, "JSON object"),
    ({}, "partitions is empty"),
    ("{}", "partitions is empty"),
    ({"country": b""}, "empty bytes"),
])
def test_partitions_shape_and_missing_values_at_parse_time(partitions: Any, match: str) -> None:
    with pytest.raises(PartitionSpecError, match=match):
        DeltaDeleteOperator(**T, partitions=partitions)


def test_templates_wait_for_rendering_and_the_null_partition_is_explicit() -> None:
    DeltaDeleteOperator(**T, partitions={"date": "{{ ds }}", "country": NULL_PARTITION})
    DeltaDeleteOperator(**T, partitions="{{ params.partitions }}")
    assert partitions_mapping('{"country": "DE"}') == {"country": "DE"}
    with pytest.raises(PartitionSpecError, match="rendered to 'None'"):
        partitions_mapping({"country": "None"}, rendered=True)
    # The sentinel survives the copies Airflow makes of operators and their arguments.
    assert copy.deepcopy({"c": NULL_PARTITION})["c"] is NULL_PARTITION
    assert pickle.loads(pickle.dumps(NULL_PARTITION)) is NULL_PARTITION


@pytest.mark.parametrize("policy", [
    {"max_attempts": 2.5}, {"max_attempts": True}, {"max_attempts": 0}, {"max_attempts": 10**9},
    {"initial_delay": math.nan}, {"max_delay": math.inf}, {"jitter": -1}, {"multiplier": "2"},
    {"initial_delay": None},
])
def test_conflict_policy_numbers_must_be_finite_and_of_the_right_type(policy: dict[str, Any]) -> None:
    with pytest.raises(JobSpecError, match="conflict_policies"):
        merge(conflict_policies={"ConcurrentAppendException": policy})


def test_conflict_policies_must_be_a_mapping() -> None:
    with pytest.raises(JobSpecError, match="conflict_policies: expected a mapping"):
        merge(conflict_policies=["ConcurrentAppendException"])


@pytest.mark.parametrize("text", [
    "(" * 10_000 + "id = 1" + ")" * 10_000,
    "NOT " * 10_000 + "id = 1",
    "- " * 10_000 + "1 = 1",
    " AND ".join(["id = 1"] * 5_000),
    "f(" * 5_000 + "1" + ")" * 5_000,
    "CASE WHEN " * 3_000 + "true",
    "a" + "[0]" * 10_000 + " = 1",
])
def test_deep_nesting_is_a_typed_error_not_a_recursion_error(text: str) -> None:
    with pytest.raises(PredicateSyntaxError, match=r"levels|in a row|nested|signs"):
        parse_predicate(text)
    with pytest.raises(UnsafeExpressionError):
        DeltaDeleteOperator(**T, where=text)


def test_a_long_but_shallow_condition_is_accepted() -> None:
    parse_predicate(" AND ".join(["id = 1"] * (MAX_DEPTH - 1)))
    parse_predicate("id IN (" + ", ".join(map(str, range(5000))) + ")")


@pytest.mark.parametrize("query", [
    "WITH c AS (SELECT 1) DELETE FROM t",
    "with c (x) as (select 1), d as (select 2) MERGE INTO t USING d ON true WHEN MATCHED THEN DELETE",
    "WITH RECURSIVE c AS (SELECT 1) INSERT INTO t SELECT * FROM c",
    "DELETE FROM t", "INSERT INTO t VALUES (1)", "DROP TABLE t", "CREATE TABLE x AS SELECT 1",
    "SELECT 1; DROP TABLE t", "SELECT 1 -- hi", "SELECT 'unterminated", "",
    "EXECUTE IMMEDIATE 'DROP TABLE t'", "BEGIN DELETE FROM t; END",
    "FROM src INSERT INTO t SELECT *", "FROM src INSERT OVERWRITE TABLE t SELECT * INSERT INTO u SELECT *",
    "WITH c AS (SELECT 1) FROM c INSERT INTO t SELECT *", "(FROM src INSERT INTO t SELECT *)",
    "WITH a AS (SELECT 1) (INSERT INTO t SELECT 1)", "SELECT * FROM (FROM s INSERT INTO t SELECT *)",
    "SELECT 1) AS a, (SELECT 2", "SELECT reflect('java.lang.System', 'exit', 0)",
    "SELECT TRANSFORM(x) USING 'rm -rf /lake' AS (y) FROM VALUES (1) AS t(x)", "SELECT `java_method`('a', 'b')",
    "SELECT system.builtin.`try_reflect`('a', 'b')", "SELECT IDENTIFIER('reflect')('java.lang.System', 'exit', 0)",
])
def test_source_query_must_be_a_query(query: str) -> None:
    with pytest.raises(UnsafeExpressionError):
        check_source_query(query)
    with pytest.raises(JobSpecError):
        merge(source=None, source_query=query)


@pytest.mark.parametrize("query", [
    "SELECT * FROM src", "  select 1 AS id", "WITH c AS (SELECT 1 AS id) SELECT * FROM c",
    "WITH c(id) AS (SELECT 1), d AS (SELECT 2) SELECT * FROM c JOIN d", "(SELECT 1) UNION (SELECT 2)",
    "VALUES (1, 2)", "FROM src SELECT id", "TABLE src", "SELECT `delete` FROM src",
    "SELECT * FROM (SELECT 1) AS insert_free", "SELECT 'INSERT INTO t' AS text",
    "SELECT * FROM a JOIN b USING (id)", "SELECT transform(tags, x -> upper(x)) AS tags FROM src",
    "SELECT ';' AS semicolon_in_a_string",
])
def test_queries_are_accepted(query: str) -> None:
    assert check_source_query(query) == query


def test_refusals_from_spark_submit_come_back_as_the_same_class_and_are_never_retried() -> None:
    with pytest.raises(SourceOutsidePartitionsError, match="2 source row"):
        JobResult.from_json({"status": "rejected", "table": "/t", "operation": "merge",
                             "error_type": "SourceOutsidePartitionsError",
                             "error": "2 source row(s) would be written outside"}).raise_for_status()
    with pytest.raises(JobSpecError, match="SomethingElse: text"):
        JobResult.from_json({"status": "rejected", "table": "/t", "operation": "merge", "error_type": "SomethingElse",
                             "error": "text"}).raise_for_status()
    policy = DeltaConflictRetryPolicy()
    for error in (SourceOutsidePartitionsError("x", count=1), PartitionSpecError("x"), UnsafeExpressionError("x"),
                  PredicateSyntaxError("x", text="x", position=0), LogCorruptError("bad line", path="0.json", line=1)):
        assert isinstance(error, DeltaOccError)
        assert policy.evaluate(error, 1, 3).action is RetryAction.FAIL


def test_niladic_names_are_non_deterministic_quoted_or_not() -> None:
    from airflow_delta_occ.engine.expressions import is_deterministic

    for text in ("current_date", "`current_date`", "`Current_Timestamp`", "user"):
        assert not is_deterministic(parse_predicate(f"d = {text}")), text


def test_strict_witnesses_stay_inside_the_column_type() -> None:
    from airflow_delta_occ.engine.constraints import excludes_some_partition
    from airflow_delta_occ.engine.expressions import Column, Comparison, Literal
    from airflow_delta_occ.engine.schema import PrimitiveType

    types = {"hour": PrimitiveType("integer")}
    assert not excludes_some_partition(Comparison("<=", Column("hour"), Literal(2**31 - 1)), types)
    assert excludes_some_partition(Comparison("<=", Column("hour"), Literal(7)), types)


def test_a_value_that_does_not_convert_is_not_taken_for_the_null_partition() -> None:
    from airflow_delta_occ.engine.schema import PrimitiveType
    from airflow_delta_occ.jobs.partitions import PartitionFilter

    pfilter = PartitionFilter((("hour", (8, None)),), (("hour", PrimitiveType("integer")),))
    sql = pfilter.over({"hour": "TRY_CAST(`s`.`hour` AS integer)"}, {"hour": "`s`.`hour`"})
    assert sql == "(TRY_CAST(`s`.`hour` AS integer) = 8 OR `s`.`hour` IS NULL)"


@pytest.mark.parametrize("policy", [{"ConcurrentAppendException": "retry"}, "retry", lambda exc: True])
def test_a_retry_policy_that_is_not_a_policy_fails_at_dag_parse_time(policy: Any) -> None:
    """Airflow would log "Retry policy evaluation failed, falling back" at failure time and retry a
    permanent error; the provider's own policy would be gone (issue #20)."""
    from airflow_delta_occ.operators.delta import DeltaDeleteOperator

    with pytest.raises(JobSpecError, match="RetryPolicy"):
        DeltaDeleteOperator(task_id="d", table="/lake/t", where="id = 1", retry_policy=policy)
    with pytest.raises(JobSpecError, match="RetryPolicy"):
        DeltaDeleteOperator(task_id="d", table="/lake/t", where="id = 1", default_args={"retry_policy": policy})
    with pytest.raises(JobSpecError, match="RetryPolicy"):
        DeltaDeleteOperator.partial(task_id="d", table="/lake/t", retry_policy=policy)


def test_an_airflow_retry_policy_of_the_authors_own_is_kept() -> None:
    from airflow.sdk import RetryPolicy

    from airflow_delta_occ.operators.delta import DeltaDeleteOperator

    class Mine(RetryPolicy):
        def evaluate(self, exception: BaseException, try_number: int, max_tries: int, context: Any = None) -> Any:
            raise NotImplementedError

    mine = Mine()
    assert DeltaDeleteOperator(task_id="d", table="/lake/t", where="id = 1", retry_policy=mine).retry_policy is mine
