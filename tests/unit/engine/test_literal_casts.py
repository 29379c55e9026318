"""Text becomes a column's value exactly as Spark's cast reads it, or is refused (table: ``spark_casts.py``)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest

from airflow_delta_occ.engine import InvalidLiteralError
from airflow_delta_occ.engine.schema import DecimalType, PrimitiveType
from airflow_delta_occ.engine.values import coerce_literal, format_partition_value, parse_partition_value

from .spark_casts import CASES, Case, Refused, SparkOnly, engine_type, same_value

pytestmark = pytest.mark.unit

def _id(case: Case) -> str:
    return f"{case.spark_type}-{case.text!r}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_a_literal_is_read_as_sparks_cast_reads_it_or_refused(case: Case) -> None:
    data_type = engine_type(case.spark_type)
    if isinstance(case.expected, Refused | SparkOnly):
        with pytest.raises(InvalidLiteralError, match=re.escape(f"type {data_type.simple_string()}")):
            coerce_literal(case.text, data_type, None)
    else:
        value = coerce_literal(case.text, data_type)
        assert same_value(value, case.expected), (value, case.expected)


@pytest.mark.parametrize("case", [c for c in CASES if c.text], ids=_id)
def test_a_partition_value_in_the_log_is_read_the_same_way(case: Case) -> None:
    data_type = engine_type(case.spark_type)
    if isinstance(case.expected, Refused | SparkOnly):
        with pytest.raises((ValueError, ArithmeticError)):
            parse_partition_value(case.text, data_type)
    else:
        assert same_value(parse_partition_value(case.text, data_type), case.expected)


@pytest.mark.parametrize("case", [c for c in CASES if not isinstance(c.expected, Refused | SparkOnly)], ids=_id)
def test_the_stored_form_of_an_accepted_value_reads_back_as_the_value(case: Case) -> None:
    data_type = engine_type(case.spark_type)
    value = coerce_literal(case.text, data_type)
    stored = format_partition_value(value, data_type)
    assert stored is not None
    if isinstance(value, Decimal) and value == 0:
        assert not stored.startswith("-"), stored  # a Spark decimal has no negative zero
    assert same_value(parse_partition_value(stored, data_type), value)


@pytest.mark.parametrize(("text", "type_name"), [("1_000", "integer"), ("1_0.50", "decimal(10,2)"),
                                                 ("\u0661\u0662", "integer"), ("\u0661\u0662", "double")])
def test_the_error_names_the_text_and_the_column(text: str, type_name: str) -> None:
    data_type: Any = DecimalType(10, 2) if type_name.startswith("decimal") else PrimitiveType(type_name)
    expected = rf"{re.escape(repr(text))} .*column 'amount' of type {re.escape(type_name)}"
    with pytest.raises(InvalidLiteralError, match=expected):
        coerce_literal(text, data_type, "amount")
