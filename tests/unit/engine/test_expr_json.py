"""Expressions as JSON: exact round trips for what the parser and ``bind`` build, typed errors for the rest.

The JSON travels between processes (job specs, leases, trigger arguments), so decoding is tested as
the handling of untrusted input: specific defects each name their place, and fuzzed documents
(random JSON, and valid documents with one part mutated) give an expression or an
``ExpressionDecodeError``, never another exception.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_delta_occ.engine import ExpressionDecodeError, InvalidLiteralError, PredicateError, PredicateSyntaxError
from airflow_delta_occ.engine.expr_json import MAX_JSON_DEPTH, MAX_NODES, expr_from_json, expr_to_json
from airflow_delta_occ.engine.expressions import (
    And,
    Column,
    Comparison,
    Expr,
    In,
    IsNull,
    Literal,
    Not,
    Or,
    Unknown,
    and_,
    split_conjuncts,
)
from airflow_delta_occ.engine.predicates import bind, parse_predicate, to_sql
from airflow_delta_occ.engine.schema import ArrayType, DecimalType, PrimitiveType, parse_schema
from airflow_delta_occ.engine.sql_parser import MAX_DEPTH, expression_depth

pytestmark = pytest.mark.unit

SCHEMA = parse_schema(json.dumps({"type": "struct", "fields": [
    {"name": name, "type": type_, "nullable": True, "metadata": {}} for name, type_ in [
        ("id", "long"), ("name", "string"), ("date", "date"), ("country", "string"), ("amount", "decimal(10,2)"),
        ("ts", "timestamp"), ("ntz", "timestamp_ntz"), ("flag", "boolean"), ("score", "double"),
        ("ratio", "float"), ("n", "integer"), ("small", "short"), ("tiny", "byte"), ("raw", "binary"),
        ("tags", {"type": "array", "elementType": "string", "containsNull": True}),
        ("address", {"type": "struct", "fields": [{"name": "city", "type": "string", "nullable": True,
                                                  "metadata": {}}]}),
    ]
]}))

# Conditions of test_expressions.py, and more literals of every kind.
CONDITIONS = [
    "a = 1 OR b = 2 AND NOT c = 3",
    "x = 'it\\'s'", "x = 'it''s'", 'x = "dq"', "x = 'a\\\\b'", "x = 'line\\nbreak'", "x = 'ab' 'cd'",
    "x = 12", "x = -3", "x = 1.50", "x = 2.5e3", "x = 10L", "x = 12.30BD",
    "date = DATE'2024-01-02' AND ts < TIMESTAMP'2024-01-01 10:00:00'",
    "t.country NOT IN ('DE', 'FR')", "x BETWEEN 1 AND 3", "x IS NOT NULL", "`we``ird` = 1",
    "upper(name) = 'X'", "id + 1 > 3", "name LIKE 'a%'", "CASE WHEN id > 1 THEN true ELSE false END",
    "id * 2 + 1 BETWEEN 1 AND 9", "CAST(id AS DECIMAL(10, 2)) > 1.5", "id::string = '1'",
    "d < current_date - INTERVAL '1' DAY", "name ILIKE ANY ('a%', 'b%')",
    "tags[0] = 'x' AND EXTRACT(YEAR FROM d) = 2024", "rand() < 0.5", "id > unix_timestamp()",
    "country = 'DE'' OR 1=1 --'", "country = 'DE\\' OR \\'1\\'=\\'1'",
    "t.id = s.id AND t.date = '2024-01-01'", "x IS DISTINCT FROM y", "x IS NOT DISTINCT FROM y",
    "a <=> NULL AND b != 1 AND c <> 2 AND d >= 3 AND e <= 4 AND f > 5 AND g < 6 AND h == 7",
    "x = 0.1F AND y = 3Y AND z = -2S AND w = 9223372036854775808 AND v = -1.5e-7D",
    "x = X'00ff' AND y = X'' AND z = TIMESTAMP_NTZ'2024-01-01 10:00:00.123456'",
    "x = TIMESTAMP'2024-06-01 12:00:00+02:00' AND y = TIMESTAMP_LTZ'2024-06-01'",
    "x = '\\uD800' AND y = '\u00e9\u4e2d\U0001F600' AND z = ''", "x = true AND y = false AND z IS NULL",
    "NOT NOT NOT (a = 1 OR (b = 2 OR c = 3)) AND (d = 4 AND (e = 5 AND f = 6))",
    "a IN (1, 2.5, 'x', NULL, DATE'2024-01-01', X'01', 1.0BD)", "(a IN (1)) IN (true)",
    "x = 00012 AND y = 1.000 AND z = .5 AND w = 1E+3BD",
]

BOUND = [
    "date = '2024-01-01' AND country IN ('DE', 'F''R', 'a\\\\b')",
    "id >= 10 OR name IS NOT NULL",
    "NOT (amount <= 12.5) AND ts < '2024-01-01 10:00:00'",
    "score = 1.5 AND flag = true AND id <=> NULL",
    "country NOT IN ('DE')",
    "score = 'NaN' OR score = 'Infinity' OR score = '-Infinity' OR score = -0.0",
    "ratio = 0.1F AND n = 3 AND small = -2 AND tiny = 7 AND amount = 3",
    "ts = '2024-01-01T10:00:00+05:30' AND ntz = '2024-01-01 10:00:00' AND date = TIMESTAMP'2024-01-01'",
    "raw = X'00ff' AND raw = 'text' AND address.city = 'Berlin'",
    "t.id = s.id AND t.date = '2024-01-01'",
    "upper(name) = 'X' AND tags = 'x'",
    "1 = 1 AND NULL = 1 AND flag",
]


def round_trip(expr: Expr) -> Expr:
    """Through text, as another process would receive it; only plain JSON types may appear."""
    text = json.dumps(expr_to_json(expr), allow_nan=False)
    return expr_from_json(json.loads(text))


def b(text: str) -> Expr:
    return bind(parse_predicate(text), SCHEMA, target_alias="t")


@pytest.mark.parametrize("text", CONDITIONS)
def test_parsed_conditions_round_trip(text: str) -> None:
    expr = parse_predicate(text)
    assert round_trip(expr) == expr
    assert to_sql(round_trip(expr)) == to_sql(expr)


@pytest.mark.parametrize("text", BOUND)
def test_bound_conditions_round_trip(text: str) -> None:
    expr = b(text)
    assert round_trip(expr) == expr


def test_values_keep_their_type() -> None:
    """``'1'``, ``1``, ``1.0`` and ``1BD`` are different literals and stay different."""
    values = ["1", 1, 1.0, Decimal("1"), Decimal("1.00"), True, None, b"1", dt.date(2024, 1, 1),
              dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1, tzinfo=dt.UTC)]
    for value in values:
        decoded = round_trip(Literal(value))
        assert isinstance(decoded, Literal)
        assert type(decoded.value) is type(value) and decoded.value == value
    assert round_trip(Literal(Decimal("1.00"))).value.as_tuple() == Decimal("1.00").as_tuple()
    offset = dt.timezone(dt.timedelta(hours=5, minutes=30))
    aware = round_trip(Literal(dt.datetime(2024, 1, 1, 10, tzinfo=offset))).value
    assert aware.utcoffset() == dt.timedelta(hours=5, minutes=30)
    assert math.copysign(1.0, round_trip(Literal(-0.0)).value) == -1.0


def test_special_floats_round_trip() -> None:
    for text in ("score = 'NaN'", "score = 'Infinity'", "score = '-Infinity'"):
        expr = b(text)
        assert round_trip(expr) == expr
    assert expr_to_json(b("score = 'NaN'"))["right"]["value"] == {"float": "nan"}


def test_form_is_documented_shape() -> None:
    doc = expr_to_json(parse_predicate("date = DATE'2024-01-01' AND country IN ('DE')"))
    assert doc == {"kind": "and", "args": [
        {"kind": "comparison", "op": "=", "left": {"kind": "column", "name": "date", "qualifier": None},
         "right": {"kind": "literal", "value": {"date": "2024-01-01"}, "type": "date"}},
        {"kind": "in", "value": {"kind": "column", "name": "country", "qualifier": None},
         "options": [{"kind": "literal", "value": {"str": "DE"}, "type": None}], "negated": False}]}


def test_optional_fields_may_be_left_out() -> None:
    assert expr_from_json({"kind": "column", "name": "a"}) == Column("a")
    assert expr_from_json({"kind": "literal", "value": {"int": "1"}}) == Literal(1)
    assert expr_from_json({"kind": "unknown", "text": "f(`a`)"}) == Unknown("f(`a`)")
    assert expr_from_json({"kind": "is_null", "value": {"kind": "column", "name": "a"}}) == IsNull(Column("a"))


def test_nested_types_round_trip() -> None:
    for data_type in (DecimalType(38, 10), ArrayType(PrimitiveType("string"), False), SCHEMA):
        assert round_trip(Literal(None, data_type)) == Literal(None, data_type)


# -- deep trees ------------------------------------------------------------------------------------

def test_the_deepest_trees_the_parser_accepts_round_trip() -> None:
    chain = parse_predicate(" = ".join(["a"] * 255))
    assert expression_depth(chain) == 255
    assert round_trip(chain) == chain
    conjuncts = parse_predicate(" AND ".join(["a = 1"] * 250))
    assert expression_depth(conjuncts) > 250
    assert round_trip(conjuncts) == conjuncts
    with pytest.raises(PredicateSyntaxError):
        parse_predicate(" AND ".join(["a = 1"] * 1000))


def test_long_conjunctions_stay_shallow_in_json() -> None:
    """Parenthesized groups pass the parser's depth limit; re-chaining their conjuncts (as the planner
    does with ``and_``) builds a left-deep chain of 10,000, which one ``args`` list holds."""
    group = "(" + " AND ".join(["a=1"] * 200) + ")"
    parsed = parse_predicate(" AND ".join([group] * 50))
    chained = and_(*split_conjuncts(parsed))
    doc = expr_to_json(chained)
    assert doc["kind"] == "and" and len(doc["args"]) == 10_000
    decoded = expr_from_json(json.loads(json.dumps(doc)))
    assert expr_to_json(decoded) == doc  # == on the tree itself recurses 10,000 frames deep
    assert isinstance(decoded, And) and decoded.right == Comparison("=", Column("a"), Literal(1))


def test_depth_and_size_limits() -> None:
    assert MAX_JSON_DEPTH == MAX_DEPTH
    deep: Expr = Column("a")
    for _ in range(MAX_JSON_DEPTH):
        deep = Not(deep)
    with pytest.raises(ValueError, match="nested more than 256 levels"):
        expr_to_json(deep)
    doc: dict[str, Any] = {"kind": "column", "name": "a"}
    for _ in range(100_000):  # far beyond what json or a recursive decoder could take
        doc = {"kind": "not", "child": doc}
    with pytest.raises(ExpressionDecodeError, match="nested more than 256 levels") as err:
        expr_from_json(doc)
    assert err.value.path.startswith("$.child.child") and len(str(err.value)) < 400
    wide = {"kind": "or", "args": [{"kind": "column", "name": "a"}] * MAX_NODES}
    with pytest.raises(ExpressionDecodeError, match=f"more than {MAX_NODES} nodes"):
        expr_from_json(wide)


# -- bad documents ---------------------------------------------------------------------------------

COL = {"kind": "column", "name": "a"}
ONE = {"kind": "literal", "value": {"int": "1"}}


def lit(value: Any, type_: Any = None) -> dict[str, Any]:
    return {"kind": "literal", "value": value, "type": type_}


@pytest.mark.parametrize(("doc", "path", "message"), [
    (None, "$", "must be an object, got null"),
    ([COL], "$", "must be an object, got an array"),
    ({"name": "a"}, "$", "unknown node kind None"),
    ({"kind": "function", "name": "f"}, "$", "unknown node kind 'function'"),
    ({"kind": ["and"]}, "$", "unknown node kind"),
    ({"kind": "column"}, "$", "required field 'name' is missing"),
    ({"kind": "column", "name": 1}, "$.name", "must be a string, got an integer"),
    ({"kind": "column", "name": "a", "qualifier": True}, "$.qualifier", "must be a string"),
    ({"kind": "comparison", "op": "LIKE", "left": COL, "right": ONE}, "$.op", "unknown comparison operator"),
    ({"kind": "comparison", "op": ["="], "left": COL, "right": ONE}, "$.op", "unknown comparison operator"),
    ({"kind": "comparison", "op": "=", "left": COL}, "$", "required field 'right'"),
    ({"kind": "comparison", "op": "=", "left": COL, "right": {"kind": "nope"}}, "$.right", "unknown node kind"),
    ({"kind": "in", "value": COL, "options": []}, "$.options", "at least 1"),
    ({"kind": "in", "value": COL, "options": {"0": ONE}}, "$.options", "must be an array"),
    ({"kind": "in", "value": COL, "options": [ONE, 5]}, "$.options[1]", "must be an object, got an integer"),
    ({"kind": "in", "value": COL, "options": [ONE], "negated": "yes"}, "$.negated", "must be a boolean"),
    ({"kind": "is_null", "value": COL, "negated": 0}, "$.negated", "must be a boolean"),
    ({"kind": "and", "args": [COL]}, "$.args", "at least 2"),
    ({"kind": "or", "args": [COL, COL, {"kind": "not"}]}, "$.args[2]", "required field 'child'"),
    ({"kind": "not", "child": "a"}, "$.child", "must be an object, got a string"),
    ({"kind": "unknown", "text": 3}, "$.text", "must be a string"),
    ({"kind": "unknown", "text": "f(a)", "deterministic": None}, "$.deterministic", "must be a boolean"),
    ({"kind": "unknown", "text": "1 = 1) OR (1 = 1"}, "$.text", "closes a bracket"),
    ({"kind": "unknown", "text": "f(a"}, "$.text", "leaves a bracket open"),
    ({"kind": "unknown", "text": "a[1)"}, "$.text", "closes a bracket"),
    ({"kind": "unknown", "text": "a -- comment"}, "$.text", "comments and ';'"),
    ({"kind": "unknown", "text": "a; DROP TABLE t"}, "$.text", "comments and ';'"),
    ({"kind": "unknown", "text": "'open"}, "$.text", "unterminated string"),
    ({"kind": "unknown", "text": "  "}, "$.text", "empty"),
    ({"kind": "literal"}, "$", "required field 'value'"),
    (lit(1), "$.value", "one key naming its type"),
    (lit({"int": "1", "str": "1"}), "$.value", "with 2 keys"),
    (lit({"complex": "1j"}), "$.value", "unknown value type 'complex'"),
    (lit({"null": 0}), "$.value.null", "null literal"),
    (lit({"bool": 1}), "$.value.bool", "must be a boolean, got an integer"),
    (lit({"str": None}), "$.value.str", "must be a string, got null"),
    (lit({"int": 1}), "$.value.int", "must be written as a string"),
    (lit({"int": "1.5"}), "$.value.int", "is not a whole number"),
    (lit({"int": " 1"}), "$.value.int", "canonical form"),
    (lit({"int": "1_000"}), "$.value.int", "canonical form"),
    (lit({"int": "\u0661"}), "$.value.int", "canonical form"),
    (lit({"int": "9" * 5000}), "$.value.int", "is not a whole number"),
    (lit({"float": "NaN"}), "$.value.float", "canonical form"),
    (lit({"float": "1e999"}), "$.value.float", "canonical form"),
    (lit({"float": "x"}), "$.value.float", "is not a floating-point number"),
    (lit({"decimal": "NaN"}), "$.value.decimal", "is not a finite decimal"),
    (lit({"decimal": "1.5e3"}), "$.value.decimal", "canonical form"),
    (lit({"date": "2024-13-01"}), "$.value.date", "is not a date"),
    (lit({"date": "20240101"}), "$.value.date", "canonical form"),
    (lit({"datetime": "2024-01-01 10:00:00"}), "$.value.datetime", "canonical form"),
    (lit({"bytes": "0"}), "$.value.bytes", "hexadecimal"),
    (lit({"bytes": "AB"}), "$.value.bytes", "canonical form"),
    (lit({"bytes": "\u0661\u0662"}), "$.value.bytes", "hexadecimal"),
    (lit({"int": "1"}, "int"), "$.type", "unknown data type 'int'"),
    (lit({"int": "1"}, "decimal(99,0)"), "$.type", "out of range"),
    (lit({"int": "1"}, {"type": "array"}), "$.type", "malformed type"),
    (lit({"int": "1"}, 5), "$.type", "malformed type"),
    (lit({"str": "2024-01-01"}, "date"), "$", "does not fit the literal's type date"),
    (lit({"bool": True}, "long"), "$", "does not fit"),
    (lit({"int": "1"}, "double"), "$", "does not fit"),
    (lit({"datetime": "2024-01-01T00:00:00"}, "timestamp"), "$", "does not fit"),
    (lit({"datetime": "2024-01-01T00:00:00+00:00"}, "timestamp_ntz"), "$", "does not fit"),
    (lit({"datetime": "2024-01-01T00:00:00"}, "date"), "$", "does not fit"),
    (lit({"str": "x"}, {"type": "array", "elementType": "string", "containsNull": True}), "$", "does not fit"),
])
def test_bad_documents_name_the_place(doc: Any, path: str, message: str) -> None:
    with pytest.raises(ExpressionDecodeError) as err:
        expr_from_json(doc)
    assert err.value.path == path
    assert message in str(err.value)
    assert isinstance(err.value, PredicateError)


def test_encoding_refuses_values_without_a_json_form() -> None:
    with pytest.raises(TypeError, match="complex"):
        expr_to_json(Comparison("=", Column("a"), Literal(1j)))
    with pytest.raises(ValueError, match="non-finite decimal"):
        expr_to_json(Literal(Decimal("NaN")))
    with pytest.raises(TypeError, match=r"not an expression at \$\.args\[1\]"):
        expr_to_json(And(Column("a"), "b"))  # type: ignore[arg-type]


# -- properties ------------------------------------------------------------------------------------

_OFFSETS = st.builds(lambda minutes: dt.timezone(dt.timedelta(minutes=minutes)), st.integers(-23 * 60, 23 * 60))
_TYPED_VALUES: list[tuple[Any, st.SearchStrategy[Any]]] = [
    (None, st.one_of(st.none(), st.booleans(), st.text(), st.integers(), st.floats(), st.binary(max_size=8),
                     st.decimals(allow_nan=False, allow_infinity=False), st.dates(), st.datetimes(),
                     st.datetimes(timezones=_OFFSETS))),
    (PrimitiveType("string"), st.text()),
    (PrimitiveType("long"), st.integers(-(2**63), 2**63 - 1)),
    (PrimitiveType("byte"), st.integers(-300, 300)),
    (PrimitiveType("double"), st.floats()),
    (PrimitiveType("float"), st.floats(width=32)),
    (DecimalType(10, 2), st.decimals(places=2, allow_nan=False, allow_infinity=False)),
    (PrimitiveType("boolean"), st.booleans()),
    (PrimitiveType("date"), st.dates()),
    (PrimitiveType("timestamp"), st.datetimes(timezones=st.just(dt.UTC))),
    (PrimitiveType("timestamp_ntz"), st.datetimes()),
    (PrimitiveType("binary"), st.binary(max_size=16)),
]
_UNKNOWN_TEXTS = st.sampled_from(["f(`a`)", "rand()", "CURRENT_DATE", "(`a` + 1)", "`a`[0]", "INTERVAL '1' DAY",
                                  "CAST(`a` AS DECIMAL(10, 2))", "`s`.`id`"])


@st.composite
def literals(draw: st.DrawFn) -> Literal:
    data_type, values = draw(st.sampled_from(_TYPED_VALUES))
    value = draw(values)
    if isinstance(value, float) and math.isnan(value):
        value = math.nan  # as values.py makes it; another NaN object is not equal to itself in a Literal
    return Literal(value, data_type)


def _leaves() -> st.SearchStrategy[Expr]:
    columns = st.builds(Column, st.text(max_size=5), st.one_of(st.none(), st.text(max_size=3)))
    unknowns = st.builds(Unknown, _UNKNOWN_TEXTS, st.booleans())
    return st.one_of(columns, literals(), unknowns)


def _compound(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
    ops = st.sampled_from(["=", "!=", "<", "<=", ">", ">=", "<=>"])
    return st.one_of(
        st.builds(Comparison, ops, children, children),
        st.builds(In, children, st.lists(children, min_size=1, max_size=3).map(tuple), st.booleans()),
        st.builds(IsNull, children, st.booleans()),
        st.builds(And, children, children),
        st.builds(Or, children, children),
        st.builds(Not, children),
    )


EXPRESSIONS = st.recursive(_leaves(), _compound, max_leaves=25)


@settings(max_examples=500, deadline=None)
@given(EXPRESSIONS)
def test_generated_expressions_round_trip(expr: Expr) -> None:
    assert round_trip(expr) == expr


_FRAGMENTS = st.sampled_from([
    "(", ")", " OR ", " AND ", "1=1", "CASE", " WHEN ", " THEN ", " ELSE ", " END", "t.case", "'", '"', "`",
    "\\", "r'", "id", " = ", "true", "NOT ", ",", "[", "]", "::int", "INTERVAL '1' DAY", "upper(", "X'", "'DE'",
    "s.id", "x", "0", "IN (", "IS NULL", " BETWEEN 1 AND 2", "||", "-", "\\u0027", "LIKE", "'a%'", "f(x)",
    "DATE'2024-01-01'", "1.5", "2e3", "3L", "0.1F", "NULL", " <=> ", "rand()", "'NaN'", "score", "ts", "amount",
])


@settings(max_examples=1500, deadline=None)
@given(st.lists(_FRAGMENTS, min_size=1, max_size=16).map("".join))
def test_whatever_the_parser_builds_round_trips(text: str) -> None:
    try:
        expr = parse_predicate(text)
    except (PredicateSyntaxError, InvalidLiteralError):
        return
    assert round_trip(expr) == expr
    try:
        bound = bind(expr, SCHEMA, target_alias="t")
    except PredicateError:
        return
    assert round_trip(bound) == bound


_KEYS = st.sampled_from(["kind", "name", "qualifier", "value", "type", "op", "left", "right", "options", "negated",
                         "args", "child", "text", "deterministic", "null", "bool", "str", "int", "float",
                         "decimal", "date", "datetime", "bytes"])
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                     st.sampled_from(["column", "literal", "comparison", "in", "is_null", "and", "or", "not",
                                      "unknown", "=", "1", "nan", "2024-01-01", "date", "decimal(10,2)", "f(a"]))
JSON = st.recursive(_SCALARS, lambda c: st.one_of(st.lists(c, max_size=4),
                                                  st.dictionaries(st.one_of(_KEYS, st.text(max_size=3)), c,
                                                                  max_size=4)), max_leaves=20)


def _decode_or_typed_error(doc: Any) -> None:
    try:
        expr = expr_from_json(doc)
    except ExpressionDecodeError:
        return
    assert round_trip(expr) == expr  # what decodes also encodes, and again to the same tree


@settings(max_examples=600, deadline=None)
@given(JSON)
def test_arbitrary_json_decodes_or_raises_the_typed_error(doc: Any) -> None:
    _decode_or_typed_error(doc)


def _locations(doc: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) in a document, found without recursion."""
    found: list[tuple[Any, Any]] = []
    stack = [doc]
    while stack:
        node = stack.pop()
        keys = list(node) if isinstance(node, dict) else range(len(node)) if isinstance(node, list) else []
        for key in keys:
            found.append((node, key))
            stack.append(node[key])
    return found


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EXPRESSIONS, st.data())
def test_mutated_documents_decode_or_raise_the_typed_error(expr: Expr, data: st.DataObject) -> None:
    doc = copy.deepcopy(expr_to_json(expr))
    locations = _locations(doc)
    if not locations:
        return
    container, key = data.draw(st.sampled_from(locations))
    action = data.draw(st.sampled_from(["replace", "delete", "add"]))
    if action == "replace":
        container[key] = data.draw(JSON)
    elif action == "delete":
        del container[key]
    elif isinstance(container, dict):
        container[data.draw(_KEYS)] = data.draw(JSON)
    else:
        container.insert(key, data.draw(JSON))
    _decode_or_typed_error(doc)
