"""No value that becomes statement text may hold ``${`` (issue #20).

Spark's variable substitution (``spark.sql.variable.substitute``, on by default) rewrites
``${conf}``, ``${env:NAME}`` and ``${system:NAME}`` anywhere in a statement's text, inside quoted
literals and backtick identifiers too, before it parses it. The runner turns it off; these tests
pin the second line: the marker is refused with a typed error when the DAG is parsed (static
values) or when the job is built (templated values), naming the argument, before anything runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_delta_occ.engine import Snapshot
from airflow_delta_occ.engine.expressions import Literal
from airflow_delta_occ.exceptions import StatementTextError, UnsafeExpressionError
from airflow_delta_occ.jobs.spec import JobSpec, MergeClause, RunIdentity, SourceRef, TableRef
from airflow_delta_occ.operators.delta import (
    DeltaAppendOperator,
    DeltaDeleteOperator,
    DeltaMergeOperator,
    DeltaOptimizeOperator,
    DeltaUpdateOperator,
)

pytestmark = pytest.mark.unit
RUN = RunIdentity("sales", "task", "manual__1")
MARKERS = ["${env:Q}", "${spark.sql.session.timeZone}", "x${system:user.home}", "${hivevar:a}"]


def _merge(**kw: Any) -> DeltaMergeOperator:
    args: dict[str, Any] = {"task_id": "m", "table": "/lake/sales", "source": "/lake/src",
                            "merge_condition": "t.id = s.id"}
    args.update(kw)
    return DeltaMergeOperator(**args)


STATIC_CASES = {
    "partition value": lambda m: DeltaDeleteOperator(task_id="d", table="/lake/sales", partitions={"country": m}),
    "partition value in a list": lambda m: DeltaDeleteOperator(task_id="d", table="/lake/sales",
                                                               partitions={"country": ["DE", m]}),
    "partition key": lambda m: DeltaDeleteOperator(task_id="d", table="/lake/sales", partitions={m: "DE"}),
    "table": lambda m: DeltaDeleteOperator(task_id="d", table=f"/lake/{m}", where="id = 1"),
    "table_name": lambda m: DeltaDeleteOperator(task_id="d", table_name=f"db.{m}", where="id = 1"),
    "where literal": lambda m: DeltaDeleteOperator(task_id="d", table="/lake/sales", where=f"country = '{m}'"),
    "where identifier": lambda m: DeltaDeleteOperator(task_id="d", table="/lake/sales", where=f"`{m}` = 1"),
    "set value": lambda m: DeltaUpdateOperator(task_id="u", table="/lake/sales", set={"name": f"'{m}'"}),
    "set key": lambda m: DeltaUpdateOperator(task_id="u", table="/lake/sales", set={m: "1"}),
    "merge condition": lambda m: _merge(merge_condition=f"t.id = s.id AND s.c = '{m}'"),
    "clause condition": lambda m: _merge(clauses=[{"kind": "matched_delete", "condition": f"s.c = '{m}'"}]),
    "clause set": lambda m: _merge(clauses=[{"kind": "matched_update", "set": {"v": f"'{m}'"}}]),
    "source path": lambda m: _merge(source=f"/lake/{m}"),
    "source table": lambda m: _merge(source=None, source_table=f"db.{m}"),
    "source query": lambda m: _merge(source=None, source_query=f"SELECT * FROM src WHERE c = '{m}'"),
    "target alias": lambda m: _merge(target_alias=m),
    "zorder_by": lambda m: DeltaOptimizeOperator(task_id="o", table="/lake/sales", zorder_by=[m]),
    "append source": lambda m: DeltaAppendOperator(task_id="a", table="/lake/sales", source=f"/lake/{m}"),
}


@pytest.mark.parametrize("marker", MARKERS)
@pytest.mark.parametrize("case", sorted(STATIC_CASES))
def test_a_static_value_with_a_substitution_marker_fails_at_dag_parse_time(case: str, marker: str) -> None:
    with pytest.raises(UnsafeExpressionError) as caught:
        STATIC_CASES[case](marker)
    assert "${" in str(caught.value) and "substitut" in str(caught.value)


def test_the_error_is_the_statement_text_error_for_plain_values() -> None:
    with pytest.raises(StatementTextError, match=r"partitions\['country'\]"):
        DeltaDeleteOperator(task_id="d", table="/lake/sales", partitions={"country": "${env:Q}"})
    with pytest.raises(StatementTextError, match="table"):
        DeltaDeleteOperator(task_id="d", table="/lake/${env:T}", where="id = 1")


@pytest.mark.parametrize("where", ["name = '\\u0024{env:Q}'", "name = '\\044{env:Q}'", "name = '$' '{env:Q}'"])
def test_escapes_that_spell_the_marker_fail_at_dag_parse_time(where: str) -> None:
    with pytest.raises(StatementTextError, match="where"):
        DeltaDeleteOperator(task_id="d", table="/lake/sales", where=where)


def test_a_dollar_or_a_brace_alone_is_data() -> None:
    DeltaDeleteOperator(task_id="d", table="/lake/sales", partitions={"country": "$5 {x}"})
    DeltaUpdateOperator(task_id="u", table="/lake/sales", set={"name": "'{a} $ b'"}, where="name = '$'")


def test_a_templated_value_is_checked_when_the_job_is_built(sales_log: tuple[str, Snapshot]) -> None:
    path, snapshot = sales_log
    op = DeltaDeleteOperator(task_id="d", table=path, partitions={"country": "{{ params.c }}"})
    op.partitions = {"country": "${env:Q}"}  # what the template rendered to
    with pytest.raises(StatementTextError, match=r"partitions\['country'\]"):
        op.build_spec(snapshot, RUN)
    op = DeltaUpdateOperator(task_id="u", table=path, set={"id": "{{ params.v }}"})
    op.set = {"id": "'${env:SECRET}'"}
    with pytest.raises(UnsafeExpressionError, match=r"\$\{"):
        op.build_spec(snapshot, RUN)


def test_string_literals_spark_would_join_into_a_marker_are_refused(sales_log: tuple[str, Snapshot]) -> None:
    """``'$' '{env:Q}'`` holds no marker as typed, but the rendered statement would: judge the rendering,
    at DAG parse time, and again when a templated value is built."""
    path, snapshot = sales_log
    with pytest.raises(StatementTextError):
        DeltaUpdateOperator(task_id="u", table=path, set={"country": "'$' '{env:Q}'"}, where="id = 1")
    op = DeltaUpdateOperator(task_id="u", table=path, set={"country": "{{ params.v }}"}, where="id = 1")
    op.set = {"country": "'$' '{env:Q}'"}
    with pytest.raises(StatementTextError):
        op.build_spec(snapshot, RUN)


SPEC_CASES = {
    "target path": lambda m: dict(target=TableRef(path=f"/lake/{m}")),
    "target name": lambda m: dict(target=TableRef(name=f"db.{m}")),
    "source path": lambda m: dict(operation="append", source=SourceRef(path=f"/lake/{m}")),
    "source table": lambda m: dict(operation="append", source=SourceRef(table=f"db.{m}")),
    "set": lambda m: dict(operation="update", set={"v": Literal(m)}),
    "set key": lambda m: dict(operation="update", set={m: Literal(1)}),
    "clause": lambda m: dict(operation="merge", source=SourceRef(path="/lake/src"),
                             clauses=(MergeClause("matched_update", set={"v": Literal(m)}),)),
    "zorder": lambda m: dict(operation="optimize", zorder_by=(m,)),
    "alias": lambda m: dict(operation="merge", source=SourceRef(path="/lake/src"), target_alias=m,
                            clauses=(MergeClause("matched_delete"),)),
}


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_a_spec_with_a_marker_is_refused_however_it_was_built(case: str) -> None:
    """A spec decoded from JSON (spark-submit) or built by hand gets the same check as the operators'."""
    from airflow_delta_occ.engine.sql_parser import parse_predicate

    fields: dict[str, Any] = {"operation": "delete", "target": TableRef(path="/lake/sales"), "run": RUN,
                              "condition": parse_predicate("id = 1"), "set": {"v": Literal(1)}}
    fields.update(SPEC_CASES[case]("${env:Q}"))
    with pytest.raises(StatementTextError):
        JobSpec(**fields)


@pytest.mark.parametrize("where", ["d > INTERVAL '1' DAY''", "d > INTERVAL '1' DAY 'DE'", "d > INTERVAL '1 day' ''"])
def test_an_interval_string_without_a_unit_is_only_a_whole_interval(where: str) -> None:
    """Spark reads ``INTERVAL '1' DAY ''`` as a syntax error; the provider must not render it."""
    with pytest.raises(UnsafeExpressionError, match="interval"):
        DeltaDeleteOperator(task_id="d", table="/lake/sales", where=where)
