"""A comparison binds to the condition Spark evaluates: both sides in Spark's common type, not the column's.

The reference below casts both sides the way Spark 4.2 does with ANSI on (measured: FLOAT against a
DECIMAL or DOUBLE compares as DOUBLE, BIGINT against DOUBLE as DOUBLE, INT against DECIMAL as a
wider DECIMAL, STRING against an integral type as BIGINT ...) with exact arithmetic; the engine's
bound predicate must give the same three-valued answer on every value, including FLOAT partition
values written as Java 17 writes them (not always the shortest text). ``tests/spark/
test_comparison_types.py`` checks the same on a real table.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import struct
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_delta_occ.engine import InvalidLiteralError
from airflow_delta_occ.engine.expressions import Comparison, In, Literal, has_unknown
from airflow_delta_occ.engine.predicates import (
    ColumnStats,
    FileStats,
    bind,
    evaluate_row,
    file_may_match,
    parse_predicate,
    to_sql,
)
from airflow_delta_occ.engine.schema import DecimalType, PrimitiveType, parse_schema

pytestmark = pytest.mark.unit

TYPES = {"y": "byte", "s": "short", "i": "integer", "l": "long", "f": "float", "d": "double",
         "dec": "decimal(5,2)", "dbig": "decimal(20,0)", "dwide": "decimal(38,10)", "dt": "date", "ts": "timestamp",
         "ntz": "timestamp_ntz", "str": "string", "flag": "boolean"}
SCHEMA = parse_schema(json.dumps({"type": "struct", "fields": [
    {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in TYPES.items()]}))


def b(text: str) -> Any:
    return bind(parse_predicate(text), SCHEMA)


# -- the forms the conflict pools rely on stay exact and unchanged ----------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("i = 3", "`i` = 3"),
    ("l = 3", "`l` = 3L"),
    ("dt = DATE'2024-01-01'", "`dt` = DATE'2024-01-01'"),
    ("dt = '2024-01-01'", "`dt` = DATE'2024-01-01'"),
    ("str = 'DE'", "`str` = 'DE'"),
    ("str IN ('DE', 'FR')", "`str` IN ('DE', 'FR')"),
    ("dec > 5", "`dec` > 5.00BD"),
    ("d = 1.5", "`d` = 1.5D"),
    ("ts >= '2024-01-01'", "`ts` >= TIMESTAMP'2024-01-01 00:00:00+00:00'"),
    ("i IN (1, 2.5)", "`i` IN (1)"),
    ("2.5 > i", "3 > `i`"),
    ("y = 1000", "`y` < -128Y"),
    ("i NOT IN (1.5)", "`i` >= -2147483648"),
    ("l = 9007199254740992.0D", "`l` >= 9007199254740992L AND `l` <= 9007199254740993L"),
    ("dt > TIMESTAMP'2024-01-01 12:00:00'", "`dt` > DATE'2024-01-01'"),
    ("ntz = TIMESTAMP'2024-01-01 12:00:00'", "`ntz` = TIMESTAMP_NTZ'2024-01-01 12:00:00'"),
    ("f > 0.1", "`f` >= 0.09999999776482582D"),
    ("f = 0.1", "`f` < CAST('-Infinity' AS FLOAT)"),
    ("f <=> 0.1", "FALSE"),
])
def test_bound_forms(text: str, expected: str) -> None:
    assert to_sql(b(text)) == expected


def test_a_same_type_comparison_keeps_the_columns_type() -> None:
    assert b("i = 3") == Comparison("=", b("i = 3").left, Literal(3, PrimitiveType("integer")))
    assert b("dec = 1.5").right == Literal(Decimal("1.50"), DecimalType(5, 2))
    assert b("str IN ('a', NULL)") == In(b("str = 'a'").left, (Literal("a", PrimitiveType("string")), Literal(None)))


@pytest.mark.parametrize("text", ["str = 1", "str = 1.5", "str = DATE'2024-01-01'", "str = true", "str IN ('1', 2)"])
def test_a_string_column_spark_casts_is_unknown(text: str) -> None:
    assert has_unknown(b(text))


@pytest.mark.parametrize("text", ["dt = 1", "flag = 1", "f = DATE'2024-01-01'", "i = 'abc'", "i = '1.5'",
                                  "dec = 'x'", "i = 200Y", "f = 3.5e38F", "i IN (1, DATE'2024-01-01')"])
def test_what_spark_refuses_is_refused(text: str) -> None:
    with pytest.raises(InvalidLiteralError):
        b(text)


@pytest.mark.parametrize(("text", "value"), [
    ("1 = 1.0", True), ("0.1F = 0.1D", False), ("9007199254740993 = 9007199254740992.0D", True),
    ("1.5D = 1.5BD", True), ("'1' = 1", True), ("DATE'2024-01-01' = TIMESTAMP'2024-01-01 00:00:00'", True),
    ("1 IN (1.0, 2)", True), ("0.1F IN (0.1)", False), ("9007199254740993 IN (9007199254740992, 1.5D)", True),
    ("1 IN ('1.0', 2.5)", True), ("NULL IN (1)", None), ("1 NOT IN (2, NULL)", None),
    ("16777217 = 16777216.0F", False),  # INT and FLOAT compare as DOUBLE
])
def test_literals_fold_in_sparks_type(text: str, value: bool | None) -> None:
    assert b(text) == Literal(value)


# -- the reference: Spark's casts, with exact arithmetic ---------------------------------------------

def f32(x: float) -> float:
    try:
        return float(struct.unpack("<f", struct.pack("<f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


INTEGRAL = {"byte": (-(2**7), 2**7 - 1), "short": (-(2**15), 2**15 - 1), "integer": (-(2**31), 2**31 - 1),
            "long": (-(2**63), 2**63 - 1)}
RANK = ["byte", "short", "integer", "long"]


def common(column: str, literal: str) -> str:
    """Spark's comparison type (measured), as ``double``, ``float``, ``exact`` or an integral name."""
    if column == literal:
        return "exact" if column in INTEGRAL or column.startswith("decimal") else column
    if literal == "string":
        return "long" if column in INTEGRAL else "double"
    if "float" in (column, literal) or "double" in (column, literal):
        return "double"
    return "exact"


def as_double(value: Any, kind: str) -> float:
    if kind == "float":
        return f32(float(value))
    return float(value)


def order_key(x: Any) -> Any:
    """Spark's order: NaN above every number, equal to itself."""
    return (1, 0) if isinstance(x, float) and math.isnan(x) else (0, x)


def reference(op: str, column: str, value: Any, literal: str, lit: Any) -> bool | None:
    if value is None:
        return False if op == "<=>" else None
    target = common(column, literal)
    if target == "double":
        a, c = as_double(value, column), as_double(lit, literal)
    elif target == "float":
        a, c = f32(value), f32(lit)
    else:
        a, c = Fraction(value), Fraction(int(lit) if literal == "string" else lit)
    ka, kc = order_key(a), order_key(c)
    return {"=": ka == kc, "<=>": ka == kc, "!=": ka != kc, "<": ka < kc, "<=": ka <= kc, ">": ka > kc,
            ">=": ka >= kc}[op]


# -- values and literals around each other -----------------------------------------------------------

COLUMN_OF = {"byte": "y", "short": "s", "integer": "i", "long": "l", "float": "f", "double": "d",
             "decimal(5,2)": "dec", "decimal(20,0)": "dbig", "decimal(38,10)": "dwide"}
BASES = [0, 1, -1, Fraction(1, 10), Fraction(3, 2), Fraction(5, 2), Fraction(-155, 100), 127, 128, -129,
         2**24 + 1, 2**31 - 1, 2**53, 2**53 + 1, 2**53 + 2, 2**63 - 1, Fraction(999_99, 100), 10**20,
         Fraction(1, 3), Fraction(52363342, 1) * 10**3, 3.4028234663852886e38, 1e-45]


def column_value(column: str, base: Fraction) -> Any:
    """``base`` as the nearest value of the column's type (``None`` when out of its range)."""
    if column in INTEGRAL:
        low, high = INTEGRAL[column]
        v = round(base)
        return v if low <= v <= high else None
    if column == "float":
        return f32(float(base))
    if column == "double":
        return float(base)
    precision, scale = (int(x) for x in column[len("decimal("):-1].split(","))
    v = Decimal(f"{round(base * 10**scale)}E-{scale}")
    return v if abs(v) < Decimal(10) ** (precision - scale) else None


def float_text(x: float, digits: int) -> str:
    """A text of the FLOAT ``x`` with ``digits`` significant digits, if it reads back as ``x``."""
    text = f"{x:.{digits}g}"
    return text if f32(float(text)) == x else repr(x)


def literal_sql(kind: str, base: Fraction) -> tuple[str, Any] | None:
    """SQL for a literal of ``kind`` near ``base`` and the value Spark reads, or ``None``."""
    if kind == "integer":
        v = round(base)
        return (str(v), v) if abs(v) < 10**38 else None
    if kind == "decimal":
        v = Decimal(f"{round(base * 1000)}E-3")
        text = f"{v:f}"
        return (text if "." in text else text + ".0", Decimal(text)) if len(v.as_tuple().digits) <= 38 else None
    if kind == "double":
        v = float(base)
        return (repr(v) + "D", v) if math.isfinite(v) else None
    if kind == "float":
        v = f32(float(base))
        return (repr(v) + "F", v) if math.isfinite(v) else None
    if kind == "long":
        v = round(base)
        return (f"{v}L", v) if -(2**63) <= v < 2**63 else None
    v = round(base)
    return (f"'{v}'", str(v)) if abs(v) < 2**63 else None


def spark_literal_type(kind: str, value: Any) -> str:
    if kind == "integer":
        return "integer" if -(2**31) <= value < 2**31 else "long" if -(2**63) <= value < 2**63 else "decimal"
    return {"decimal": "decimal", "double": "double", "float": "float", "long": "long", "string": "string"}[kind]


OPS = ["=", "!=", "<", "<=", ">", ">=", "<=>"]
offsets = st.sampled_from([Fraction(0), Fraction(1, 1000), Fraction(-1, 1000), Fraction(1, 2), Fraction(-1, 2),
                           Fraction(1), Fraction(-1), Fraction(1, 10**9)])
bases = st.one_of(st.sampled_from(BASES).map(Fraction), st.fractions(min_value=-(10**6), max_value=10**6,
                                                                      max_denominator=1000))


@settings(max_examples=3000, deadline=None)
@given(column=st.sampled_from(list(COLUMN_OF)), kind=st.sampled_from(["integer", "decimal", "double", "float",
                                                                      "long", "string"]),
       op=st.sampled_from(OPS), base=bases, offset=offsets, sign=st.sampled_from([1, -1]),
       digits=st.sampled_from([6, 8, 9]), negate=st.booleans())
def test_bound_comparisons_agree_with_sparks_casts(column: str, kind: str, op: str, base: Fraction,
                                                    offset: Fraction, sign: int, digits: int, negate: bool) -> None:
    value = column_value(column, sign * base)
    lit = literal_sql(kind, sign * base + offset)
    if value is None or lit is None:
        return
    text, lit_value = lit
    literal_type = spark_literal_type(kind, lit_value)
    name = COLUMN_OF[column]
    sql = f"{name} {op} {text}"
    bound = b(f"NOT ({sql})" if negate else sql)
    stored = float(float_text(value, digits)) if column == "float" else value  # Java 17 writes some FLOATs long
    expected = reference(op, column, value, literal_type, lit_value)
    if negate and expected is not None:
        expected = not expected
    assert evaluate_row(bound, {name: stored}) == expected, (sql, to_sql(bound), value, stored)
    stats = FileStats(1, {name: ColumnStats(stored, stored, 0)})
    if expected:
        assert file_may_match(bound, {}, stats), (sql, to_sql(bound))
        assert file_may_match(bound, {name: stored}, None), (sql, to_sql(bound))


@settings(max_examples=500, deadline=None)
@given(column=st.sampled_from(list(COLUMN_OF)), options=st.lists(
    st.tuples(st.sampled_from(["integer", "decimal", "double", "float"]), bases), min_size=1, max_size=4),
    base=bases, negated=st.booleans(), null=st.booleans())
def test_in_lists_agree_with_sparks_casts(column: str, options: list[tuple[str, Fraction]], base: Fraction,
                                          negated: bool, null: bool) -> None:
    value = column_value(column, base) if not null else None
    if value is None and not null:
        return
    literals = [literal_sql(kind, b_) for kind, b_ in options]
    if any(lit is None for lit in literals):
        return
    typed = [(spark_literal_type(kind, lit[1]), lit[1]) for (kind, _), lit in zip(options, literals, strict=True)
             if lit is not None]
    # IN compares the column and all options in one type.
    kinds = [column, *(t for t, _ in typed)]
    target = "float" if all(k == "float" for k in kinds) else "double" if {"float", "double"} & set(kinds) \
        else "exact"

    def convert(v: Any, kind: str) -> Any:
        return as_double(v, kind) if target == "double" else f32(v) if target == "float" else Fraction(v)

    name = COLUMN_OF[column]
    bound = b(f"{name} {'NOT ' if negated else ''}IN ({', '.join(lit[0] for lit in literals if lit is not None)})")
    expected = None if value is None else \
        any(order_key(convert(value, column)) == order_key(convert(v, t)) for t, v in typed) != negated
    stored = float(float_text(value, 9)) if column == "float" and value is not None else value
    assert evaluate_row(bound, {name: stored}) == expected, (to_sql(bound), value)


def test_date_against_timestamp_is_compared_at_midnight_utc() -> None:
    cases = {"dt = TIMESTAMP'2024-01-01 00:00:00'": [dt.date(2024, 1, 1)],
             "dt = TIMESTAMP'2024-01-01 12:00:00'": [],
             "dt < TIMESTAMP'2024-01-01 12:00:00'": [dt.date(2023, 12, 31), dt.date(2024, 1, 1)],
             "dt > TIMESTAMP'2024-01-01 00:00:00+02:00'": [dt.date(2024, 1, 1), dt.date(2024, 1, 2)],
             "dt <= TIMESTAMP_NTZ'2024-01-01 00:00:00'": [dt.date(2023, 12, 31), dt.date(2024, 1, 1)]}
    days = [dt.date(2023, 12, 31), dt.date(2024, 1, 1), dt.date(2024, 1, 2)]
    for text, expected in cases.items():
        assert [d for d in days if evaluate_row(b(text), {"dt": d})] == expected, text
        assert evaluate_row(b(f"NOT ({text})"), {"dt": None}) is None
