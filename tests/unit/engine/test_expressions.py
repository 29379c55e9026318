"""Predicate parsing, binding, rendering and evaluation, including a soundness property for stats."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_delta_occ.engine import (
    InvalidLiteralError,
    PredicateError,
    PredicateSyntaxError,
    UnknownColumnError,
)
from airflow_delta_occ.engine.expressions import (
    And,
    Column,
    Comparison,
    In,
    IsNull,
    Literal,
    Not,
    Or,
    Unknown,
    has_unknown,
    is_deterministic,
    is_partition_only,
    references,
    split_conjuncts,
)
from airflow_delta_occ.engine.predicates import (
    ColumnStats,
    FileStats,
    bind,
    evaluate_partition,
    evaluate_row,
    file_may_match,
    parse_predicate,
    to_sql,
)
from airflow_delta_occ.engine.schema import DecimalType, PrimitiveType, parse_schema
from airflow_delta_occ.engine.stats import parse_file_stats

pytestmark = pytest.mark.unit

SCHEMA = parse_schema(json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "name", "type": "string", "nullable": True, "metadata": {}},
    {"name": "date", "type": "date", "nullable": True, "metadata": {}},
    {"name": "country", "type": "string", "nullable": True, "metadata": {}},
    {"name": "amount", "type": "decimal(10,2)", "nullable": True, "metadata": {}},
    {"name": "ts", "type": "timestamp", "nullable": True, "metadata": {}},
    {"name": "flag", "type": "boolean", "nullable": True, "metadata": {}},
    {"name": "score", "type": "double", "nullable": True, "metadata": {}},
    {"name": "tags", "type": {"type": "array", "elementType": "string", "containsNull": True},
     "nullable": True, "metadata": {}},
    {"name": "address", "type": {"type": "struct", "fields": [
        {"name": "city", "type": "string", "nullable": True, "metadata": {}}]}, "nullable": True, "metadata": {}},
]}))


def b(text: str, alias: str | None = None) -> Any:
    return bind(parse_predicate(text), SCHEMA, target_alias=alias)


# -- parsing ----------------------------------------------------------------------------------------

def test_precedence_or_and_not() -> None:
    expr = parse_predicate("a = 1 OR b = 2 AND NOT c = 3")
    assert expr == Or(Comparison("=", Column("a"), Literal(1)),
                      And(Comparison("=", Column("b"), Literal(2)), Not(Comparison("=", Column("c"), Literal(3)))))


@pytest.mark.parametrize(("text", "value"), [
    ("x = 'it\\'s'", "it's"),
    ("x = 'it''s'", "its"),  # Spark: two adjacent literals, no doubled-quote escape
    ('x = "dq"', "dq"),
    ("x = 'a\\\\b'", "a\\b"),
    ("x = 'line\\nbreak'", "line\nbreak"),
    ("x = 'ab' 'cd'", "abcd"),
    ("x = 12", 12),
    ("x = -3", -3),
    ("x = 1.50", Decimal("1.50")),
    ("x = 2.5e3", 2500.0),
    ("x = 10L", 10),
    ("x = 12.30BD", Decimal("12.30")),
])
def test_literals(text: str, value: Any) -> None:
    expr = parse_predicate(text)
    assert isinstance(expr, Comparison) and expr.right.value == value
    assert expr.right.type == (PrimitiveType("long") if text.endswith("L") else None)


def test_typed_literals_and_keywords_as_columns() -> None:
    expr = parse_predicate("date = DATE'2024-01-02' AND ts < TIMESTAMP'2024-01-01 10:00:00'")
    assert isinstance(expr, And)
    assert expr.left == Comparison("=", Column("date"), Literal(dt.date(2024, 1, 2), PrimitiveType("date")))
    assert expr.right.right.value == dt.datetime(2024, 1, 1, 10, tzinfo=dt.UTC)
    with pytest.raises(InvalidLiteralError):
        parse_predicate("date = DATE'2024-13-01'")


def test_in_between_is_null_and_qualified_columns() -> None:
    assert parse_predicate("t.country NOT IN ('DE', 'FR')") == In(
        Column("country", "t"), (Literal("DE"), Literal("FR")), negated=True)
    assert parse_predicate("x BETWEEN 1 AND 3") == And(Comparison(">=", Column("x"), Literal(1)),
                                                      Comparison("<=", Column("x"), Literal(3)))
    assert parse_predicate("x IS NOT NULL") == IsNull(Column("x"), negated=True)
    assert parse_predicate("`we``ird` = 1").left == Column("we`ird")


@pytest.mark.parametrize(("text", "deterministic"), [
    ("upper(name) = 'X'", True),
    ("id + 1 > 3", True),
    ("name LIKE 'a%'", True),
    ("CASE WHEN id > 1 THEN true ELSE false END", True),
    ("id * 2 + 1 BETWEEN 1 AND 9", True),
    ("CAST(id AS DECIMAL(10, 2)) > 1.5", True),
    ("id::string = '1'", True),
    ("d < current_date - INTERVAL '1' DAY", False),
    ("name ILIKE ANY ('a%', 'b%')", True),
    ("tags[0] = 'x' AND EXTRACT(YEAR FROM d) = 2024", True),
    ("rand() < 0.5", False),
    ("id > unix_timestamp()", False),
])
def test_constructs_outside_the_subset_become_unknown(text: str, deterministic: bool) -> None:
    expr = parse_predicate(text)
    assert has_unknown(expr)
    assert is_deterministic(expr) is deterministic


@pytest.mark.parametrize("text", [
    "", "id =", "(id = 1", "id = 1)", "id = 'open", "id = 1 -- comment", "id = 1; DROP TABLE t",
    "id = 1 /* x */", "AND id = 1", "id = 1 id = 2", "id IN ()",
])
def test_syntax_errors_name_a_position(text: str) -> None:
    with pytest.raises(PredicateSyntaxError) as err:
        parse_predicate(text)
    assert 0 <= err.value.position <= len(text)


def test_injection_attempts_stay_inert_literals() -> None:
    expr = parse_predicate("country = 'DE'' OR 1=1 --'")
    assert expr == Comparison("=", Column("country"), Literal("DE OR 1=1 --"))
    expr = parse_predicate("country = 'DE\\' OR \\'1\\'=\\'1'")
    assert isinstance(expr, Comparison) and expr.right.value == "DE' OR '1'='1"


# -- binding ----------------------------------------------------------------------------------------

def test_bind_resolves_case_insensitively_and_coerces_literals() -> None:
    expr = b("DATE = '2024-01-01' AND Amount > 5 AND ts >= '2024-01-01'")
    conjuncts = split_conjuncts(expr)
    assert conjuncts[0] == Comparison("=", Column("date"), Literal(dt.date(2024, 1, 1), PrimitiveType("date")))
    assert conjuncts[1].right == Literal(Decimal("5.00"), DecimalType(10, 2))
    assert conjuncts[2].right.value == dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    assert references(expr) == {"date", "amount", "ts"}


def test_bind_errors_name_the_column() -> None:
    with pytest.raises(UnknownColumnError, match="'nope'") as err:
        b("nope = 1")
    assert "country" in str(err.value)
    with pytest.raises(InvalidLiteralError, match="column 'date'"):
        b("date = 'not-a-date'")
    with pytest.raises(InvalidLiteralError, match="column 'id'"):
        b("id = 'abc'")
    with pytest.raises(InvalidLiteralError, match="column 'id'"):
        b("id = DATE'2024-01-01'")  # Spark: DATATYPE_MISMATCH
    with pytest.raises(InvalidLiteralError, match="column 'amount'"):
        b("amount = 'abc'")  # compared as DOUBLE: Spark's cast fails
    with pytest.raises(PredicateError, match="used as a condition"):
        b("name")


def test_bind_foreign_columns_and_unorderable_types_become_unknown() -> None:
    assert b("t.id = s.id AND t.date = '2024-01-01'", alias="t") == And(
        Unknown("`t`.`id` = `s`.`id`"), Comparison("=", Column("date"), Literal(dt.date(2024, 1, 1),
                                                                                PrimitiveType("date"))))
    assert has_unknown(b("tags = 'x'"))
    assert b("address.city = 'Berlin'") == Comparison("=", Column("address.city"), Literal("Berlin",
                                                                                         PrimitiveType("string")))
    assert b("1 = 1") == Literal(True)
    assert b("NULL = 1") == Literal(None)


def test_is_partition_only() -> None:
    assert is_partition_only(b("date = '2024-01-01' OR country IS NULL"), {"date", "country"})
    assert not is_partition_only(b("date = '2024-01-01' AND id = 1"), {"date", "country"})
    assert not is_partition_only(b("upper(country) = 'DE'"), {"date", "country"})


@pytest.mark.parametrize("text", [
    "date = '2024-01-01' AND country IN ('DE', 'F''R', 'a\\\\b')",
    "id >= 10 OR name IS NOT NULL",
    "NOT (amount <= 12.5) AND ts < '2024-01-01 10:00:00'",
    "score = 1.5 AND flag = true AND id <=> NULL",
    "country NOT IN ('DE')",
])
def test_to_sql_round_trips(text: str) -> None:
    expr = b(text)
    assert b(to_sql(expr)) == expr


def test_to_sql_escapes_for_spark() -> None:
    expr = b("country = 'x\\' OR 1=1 --'")
    assert to_sql(expr) == "`country` = 'x\\' OR 1=1 --'"
    assert to_sql(b("date = '2024-01-01'"), qualifier="t") == "`t`.`date` = DATE'2024-01-01'"


# -- exact evaluation -------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "row", "expected"), [
    ("country = 'DE'", {"country": None}, None),
    ("country <=> NULL", {"country": None}, True),
    ("country IN ('DE', NULL)", {"country": "FR"}, None),
    ("country NOT IN ('DE', NULL)", {"country": "FR"}, None),
    ("country NOT IN ('DE', 'FR')", {"country": None}, None),
    ("country = 'DE' OR country IS NULL", {"country": None}, True),
    ("NOT (country = 'DE')", {"country": None}, None),
    ("country = 'DE' AND country IS NOT NULL", {"country": None}, False),
    ("country = 'DE' AND country IS NULL", {"country": None}, None),
    ("score > 1.0", {"score": float("nan")}, True),
    ("score = score", {"score": float("nan")}, True),
])
def test_three_valued_logic(text: str, row: dict[str, Any], expected: bool | None) -> None:
    assert evaluate_row(b(text), row) is expected


def test_evaluate_partition_requires_partition_columns() -> None:
    with pytest.raises(ValueError, match="no value for column 'id'"):
        evaluate_partition(b("id = 1"), {"date": dt.date(2024, 1, 1)})


# -- statistics -------------------------------------------------------------------------------------

def _stats(**columns: ColumnStats) -> FileStats:
    return FileStats(num_records=10, columns=columns)


def test_file_may_match_uses_ranges_and_null_counts() -> None:
    s = _stats(id=ColumnStats(10, 20, 0), name=ColumnStats("a", "m", 10))
    assert file_may_match(b("id = 15"), {}, s)
    assert not file_may_match(b("id = 25"), {}, s)
    assert not file_may_match(b("id < 10"), {}, s)
    assert file_may_match(b("id <= 10"), {}, s)
    assert not file_may_match(b("id IS NULL"), {}, s)
    assert not file_may_match(b("name = 'c'"), {}, s)  # every name is NULL
    assert file_may_match(b("name IS NULL"), {}, s)
    assert file_may_match(b("NOT (id = 15)"), {}, s)
    assert not file_may_match(b("id = 25 AND name IS NULL"), {}, s)
    assert file_may_match(b("id = 25 OR name IS NULL"), {}, s)
    assert file_may_match(b("id = 25"), {}, None)  # no stats: keep
    assert file_may_match(b("amount = 3"), {}, s)  # no stats for the column: keep


def test_partition_values_are_exact() -> None:
    pv = {"date": dt.date(2024, 1, 1), "country": None}
    assert file_may_match(b("date = '2024-01-01'"), pv, None)
    assert not file_may_match(b("date = '2024-01-02'"), pv, None)
    assert not file_may_match(b("country = 'DE'"), pv, None)
    assert not file_may_match(b("country NOT IN ('DE')"), pv, None)
    assert file_may_match(b("country IS NULL AND id = 3"), pv, None)


def test_stats_parser_widens_untrustworthy_bounds() -> None:
    long_max = "z" * 32
    stats = parse_file_stats(json.dumps({
        "numRecords": 5,
        "minValues": {"name": "a" * 40, "ts": "2024-01-01T00:00:00.000Z", "address": {"city": "B"}},
        "maxValues": {"name": long_max, "ts": "2024-01-01T10:00:00.123Z", "id": "garbage"},
        "nullCount": {"name": 0, "ts": 1, "address": {"city": 2}},
    }), SCHEMA)
    assert stats is not None and stats.num_records == 5
    assert stats.columns["name"].max is None  # may be a truncated prefix
    assert stats.columns["name"].min == "a" * 40
    assert stats.columns["ts"].max == dt.datetime(2024, 1, 1, 10, 0, 0, 123999, tzinfo=dt.UTC)
    assert stats.columns["id"].max is None
    assert stats.columns["address.city"] == ColumnStats("B", None, 2)
    assert parse_file_stats("not json", SCHEMA) is None
    assert parse_file_stats(None, SCHEMA) is None


# -- soundness property -----------------------------------------------------------------------------

COLUMNS = {"id": st.one_of(st.none(), st.integers(-5, 5)),
           "name": st.one_of(st.none(), st.sampled_from(["a", "b", "c", "dd"])),
           "date": st.one_of(st.none(), st.sampled_from([dt.date(2024, 1, d) for d in (1, 2, 3)])),
           "country": st.one_of(st.none(), st.sampled_from(["DE", "FR"]))}
PARTITIONS = ("date", "country")


def _literal_for(column: str) -> st.SearchStrategy[Any]:
    return COLUMNS[column]


@st.composite
def predicates(draw: st.DrawFn, depth: int = 0) -> Any:
    kind = draw(st.sampled_from(["cmp", "in", "null", "and", "or", "not"] if depth < 3 else ["cmp", "in", "null"]))
    column = draw(st.sampled_from(sorted(COLUMNS)))
    if kind == "cmp":
        op = draw(st.sampled_from(["=", "!=", "<", "<=", ">", ">=", "<=>"]))
        lit = Literal(draw(_literal_for(column)))
        return Comparison(op, Column(column), lit) if draw(st.booleans()) else Comparison(op, lit, Column(column))
    if kind == "in":
        options = tuple(Literal(v) for v in draw(st.lists(_literal_for(column), min_size=1, max_size=3)))
        return In(Column(column), options, negated=draw(st.booleans()))
    if kind == "null":
        return IsNull(Column(column), negated=draw(st.booleans()))
    if kind == "not":
        return Not(draw(predicates(depth + 1)))
    left, right = draw(predicates(depth + 1)), draw(predicates(depth + 1))
    return And(left, right) if kind == "and" else Or(left, right)


@st.composite
def files(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    partition = {c: draw(COLUMNS[c]) for c in PARTITIONS}
    rows = draw(st.lists(st.fixed_dictionaries({c: COLUMNS[c] for c in ("id", "name")}), min_size=0, max_size=6))
    return partition, [{**r, **partition} for r in rows]


def _exact_stats(rows: list[dict[str, Any]]) -> FileStats:
    columns = {}
    for c in ("id", "name"):
        values = [r[c] for r in rows if r[c] is not None]
        columns[c] = ColumnStats(min(values) if values else None, max(values) if values else None,
                                 sum(1 for r in rows if r[c] is None))
    return FileStats(num_records=len(rows), columns=columns)


@settings(max_examples=600, deadline=None)
@given(predicates(), files())
def test_stats_pruning_never_drops_a_file_with_a_matching_row(expr: Any, file: Any) -> None:
    partition, rows = file
    if any(evaluate_row(expr, row) is True for row in rows):
        assert file_may_match(expr, partition, _exact_stats(rows))


@settings(max_examples=400, deadline=None)
@given(predicates(), files())
def test_partition_only_predicates_are_exact(expr: Any, file: Any) -> None:
    if not is_partition_only(expr, PARTITIONS):
        return
    partition, _ = file
    assert file_may_match(expr, partition, None) is (evaluate_partition(expr, partition) is True)


# -- rendering from the tree --------------------------------------------------------------------------

_FRAGMENTS = st.sampled_from([
    "(", ")", " OR ", " AND ", "1=1", "CASE", " WHEN ", " THEN ", " ELSE ", " END", "t.case", "t.end", "'", '"',
    "`", "\\", "r'", "id", " = ", "true", "NOT ", ",", "[", "]", "::int", "INTERVAL '1' DAY", "upper(", "X'",
    "'DE'", "s.id", "x", "0", "IN (", "IS NULL", " BETWEEN 1 AND 2", "||", "-", "\\u0027", "LIKE", "'a%'", "f(x)",
])


@settings(max_examples=1500, deadline=None)
@given(st.lists(_FRAGMENTS, min_size=1, max_size=16).map("".join))
def test_rendering_parses_back_to_the_same_tree_and_keeps_an_injected_conjunct_on_top(text: str) -> None:
    """Whatever the text, the provider's rendering is a fixed point of the parser, and ANDing the
    partition predicate to it leaves that predicate a top-level conjunct."""
    try:
        expr = parse_predicate(text)
    except (PredicateSyntaxError, InvalidLiteralError):
        return
    rendered = to_sql(expr)
    assert parse_predicate(rendered) == expr
    partition = parse_predicate("`t`.`country` = 'DE'")
    final = parse_predicate(f"({rendered}) AND ({to_sql(partition)})")
    assert partition in split_conjuncts(final)


@pytest.mark.parametrize(("text", "canonical"), [
    ("CASE WHEN t.case = 1 THEN true ELSE true END = t.end", "(CASE WHEN `t`.`case` = 1 THEN TRUE ELSE TRUE END) = "
                                                            "`t`.`end`"),
    ("r'\\x' = \"a'b\"", "'\\\\x' = 'a\\'b'"),
    ("upper(name) LIKE 'A%' ESCAPE '!'", "((upper(`name`)) LIKE 'A%' ESCAPE '!')"),
    ("a + b * c > 1", "(`a` + (`b` * `c`)) > 1"),
    ("x IS DISTINCT FROM y", "NOT `x` <=> `y`"),
    ("d < current_date - INTERVAL 1 DAY", "`d` < ((CURRENT_DATE) - (INTERVAL 1 DAY))"),
])
def test_canonical_rendering(text: str, canonical: str) -> None:
    assert to_sql(parse_predicate(text)) == canonical


@pytest.mark.parametrize("text", ["true BETWEEN 1 AND 2", "1 < TRUE", "TRUE = 1"])
def test_booleans_compared_with_numbers_are_not_guessed(text: str) -> None:
    """Spark casts the boolean (TRUE = 1 is true); the engine keeps such a comparison unknown, never
    folds it to a constant and never raises a raw TypeError."""
    from airflow_delta_occ.engine.expressions import has_unknown
    from airflow_delta_occ.engine.predicates import bind
    from airflow_delta_occ.engine.schema import parse_schema

    schema = parse_schema('{"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": true, '
                          '"metadata": {}}]}')
    assert has_unknown(bind(parse_predicate(text), schema))
