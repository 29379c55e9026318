"""An IN list of thousands of values (``partitions=`` allows 10,000) is judged without deep recursion."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_a_long_in_list_is_judged_without_deep_recursion() -> None:
    """IN is folded in a loop: 5,000 partition values neither exhaust the stack nor change the answer."""
    from airflow_delta_occ.engine.expressions import Column, In, Literal
    from airflow_delta_occ.engine.predicates import evaluate_row, file_may_match

    values = tuple(Literal(f"v{i}") for i in range(5000))
    inside, outside = In(Column("c"), values), In(Column("c"), values, negated=True)
    assert evaluate_row(inside, {"c": "v4999"}) is True and evaluate_row(inside, {"c": "x"}) is False
    assert evaluate_row(outside, {"c": "v0"}) is False and evaluate_row(inside, {"c": None}) is None
    assert file_may_match(inside, {"c": "v4999"}, None) and not file_may_match(inside, {"c": "x"}, None)
    assert not file_may_match(In(Column("c"), ()), {"c": "x"}, None)
