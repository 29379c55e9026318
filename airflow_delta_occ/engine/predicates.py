"""Predicates over a table: binding to the schema, exact evaluation on rows and partitions, and a
conservative "may this file hold a matching row?" test on file statistics.

Soundness is the rule for files: a file that contains a row for which the predicate is TRUE is
never excluded. The statistics test is an abstract interpretation: each sub-expression yields the
set of truth values (TRUE, FALSE, NULL) it *may* take over the rows of a file; partition columns are
constant over a file (exact), other columns are known only as a [min, max] range plus null counts.
The file may match when TRUE is in the set of the whole predicate. Over-approximating the sets is
always safe; it only keeps a file that could have been skipped.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation, localcontext
from typing import Any

from .errors import InvalidLiteralError, PredicateError, UnknownColumnError
from .expressions import (
    And,
    Column,
    Comparison,
    ComparisonOp,
    Expr,
    In,
    IsNull,
    Literal,
    Not,
    Or,
    Unknown,
    and_,
    has_unknown,
    is_deterministic,
    is_partition_only,
    or_,
    references,
    split_conjuncts,
    walk,
)
from .schema import DataType, DecimalType, PrimitiveType, StructField, StructType
from .sql_parser import parse_predicate, render_identifier, render_literal, to_sql
from .values import coerce_literal, is_comparable

__all__ = [
    "And", "Column", "ColumnStats", "Comparison", "Expr", "FileStats", "In", "IsNull", "Literal", "Not", "Or",
    "StatsRange", "Unknown", "and_", "bind", "evaluate_partition", "evaluate_row", "every_row_matches",
    "file_may_match", "has_unknown", "is_deterministic", "is_partition_only", "or_", "parse_predicate", "references",
    "split_conjuncts", "stats_range", "to_sql", "walk",
]


@dataclass(frozen=True)
class ColumnStats:
    """Bounds of one column in one file; ``None`` means unknown (never used to prune)."""

    min: Any = None
    max: Any = None
    null_count: int | None = None


@dataclass(frozen=True)
class FileStats:
    num_records: int | None
    columns: Mapping[str, ColumnStats]


# -- binding ---------------------------------------------------------------------------------------

def bind(expr: Expr, schema: StructType, *, target_alias: str | None = None) -> Expr:
    """Resolve columns against ``schema`` and compare the way Spark does.

    Spark (ANSI on, as the provider pins it) converts both sides of a comparison to a common type
    first, and that type may be wider than the column's: a FLOAT column against ``0.1`` (a
    DECIMAL) compares as DOUBLE, where ``0.1F`` is above ``0.1``; a BIGINT against a DOUBLE as
    DOUBLE, where 9007199254740993 equals ``9007199254740992.0D``; an INT against ``1.5`` as a
    DECIMAL, which nothing equals. Converting the literal to the column's type instead would
    judge other rows than Spark (``k > 0.1`` would miss the partition ``k = 0.1F``), so each
    comparison becomes the condition on the column's own values that selects exactly the rows
    Spark's does (``_comparison_type``, ``_span``): ``k = 1.5`` on an INT is false on every row,
    ``l = 9007199254740992.0D`` on a BIGINT holds for ``l`` from 9007199254740992 to
    9007199254740993. What the engine cannot evaluate as Spark does (a STRING column Spark casts
    to a number or a date) becomes ``Unknown``, which may hold on any row.

    A column qualified by anything other than ``target_alias`` belongs to another relation (a MERGE
    source, say) and becomes ``Unknown``; so does a comparison the engine cannot order (struct,
    array, map or variant columns, two columns of types it does not compare exactly).

    Raises:
        UnknownColumnError: a column the table does not have.
        InvalidLiteralError: a literal that Spark refuses to compare with its column (a DATE
            column against a number) or cannot convert to the comparison's type (``'abc'``
            against a BIGINT), or a typed literal out of its type's range (``200Y``).
    """
    return _Binder(schema, target_alias).bind(expr)


@dataclass(frozen=True)
class _BoundColumn:
    column: Column
    field: StructField


class _Binder:
    def __init__(self, schema: StructType, target_alias: str | None) -> None:
        self.schema = schema
        self.alias = target_alias.lower() if target_alias else None

    def bind(self, expr: Expr) -> Expr:
        if isinstance(expr, Column):
            resolved = self.resolve(expr)
            if resolved is None:
                return Unknown(_column_text(expr))
            if resolved.field.type != PrimitiveType("boolean"):
                raise PredicateError(
                    f"column {resolved.column.name!r} of type {resolved.field.type.simple_string()} "
                    "is used as a condition; compare it with a value"
                )
            return resolved.column
        if isinstance(expr, Literal) and expr.value is not None and not isinstance(expr.value, bool):
            raise PredicateError(f"the literal {render_literal(expr.value)} is used as a condition; compare a "
                                 "column with it")
        if isinstance(expr, Literal | Unknown):
            return expr
        if isinstance(expr, Comparison):
            return self.bind_comparison(expr)
        if isinstance(expr, In):
            return self.bind_in(expr)
        if isinstance(expr, IsNull):
            value = self.operand(expr.value)
            return IsNull(value if not isinstance(value, _BoundColumn) else value.column, expr.negated)
        if isinstance(expr, And):
            return And(self.bind(expr.left), self.bind(expr.right))
        if isinstance(expr, Or):
            return Or(self.bind(expr.left), self.bind(expr.right))
        if isinstance(expr, Not):
            return Not(self.bind(expr.child))
        raise TypeError(f"not an expression: {expr!r}")

    def resolve(self, column: Column) -> _BoundColumn | None:
        """The schema field for a column, or ``None`` when it belongs to another relation."""
        parts = column.name.split(".")
        if column.qualifier is not None:
            if self.alias is not None and column.qualifier.lower() == self.alias:
                pass
            elif isinstance(self._top(column.qualifier), StructField):
                parts = [column.qualifier, *parts]
            else:
                return None
        field = self._top(parts[0])
        if field is None:
            raise UnknownColumnError(".".join(parts), self.schema.field_names)
        names = [field.name]
        for part in parts[1:]:
            if not isinstance(field.type, StructType):
                raise UnknownColumnError(".".join(parts), self.schema.field_names)
            nested = field.type.find(part)
            if nested is None:
                raise UnknownColumnError(".".join(parts), [f"{names[0]}.{n}" for n in field.type.field_names])
            field = nested
            names.append(field.name)
        return _BoundColumn(Column(".".join(names)), field)

    def _top(self, name: str) -> StructField | None:
        return self.schema.find(name)

    def operand(self, expr: Expr) -> Expr | _BoundColumn:
        if isinstance(expr, Literal):
            return expr
        if isinstance(expr, Column):
            resolved = self.resolve(expr)
            return resolved if resolved is not None else Unknown(_column_text(expr))
        return self.bind(expr)

    def bind_comparison(self, expr: Comparison) -> Expr:
        left, right = self.operand(expr.left), self.operand(expr.right)
        if isinstance(left, Unknown) or isinstance(right, Unknown):
            return Unknown(to_sql(expr), deterministic=_det(left) and _det(right))
        if isinstance(left, _BoundColumn) and isinstance(right, _BoundColumn):
            if not _same_order(left.field.type, right.field.type):
                return Unknown(to_sql(expr))
            return Comparison(expr.op, left.column, right.column)
        if isinstance(left, _BoundColumn) or isinstance(right, _BoundColumn):
            column, other = (left, right) if isinstance(left, _BoundColumn) else (right, left)
            assert isinstance(column, _BoundColumn)
            if not is_comparable(column.field.type) or not isinstance(other, Literal):
                return Unknown(to_sql(expr))
            op = expr.op if column is left else _FLIP[expr.op]
            bound = self.compare(op, column, other, expr)
            if column is not left and isinstance(bound, Comparison) and isinstance(bound.right, Literal):
                return Comparison(_FLIP[bound.op], bound.right, bound.left)  # as written: literal first
            return bound
        if isinstance(left, Literal) and isinstance(right, Literal):
            return _fold(expr.op, left, right, expr)
        return Comparison(expr.op, _expr(left), _expr(right))

    def compare(self, op: ComparisonOp, column: _BoundColumn, literal: Literal, original: Expr) -> Expr:
        """``column op literal`` as the condition on the column's values that Spark's comparison is."""
        if literal.value is None:
            return Comparison(op, column.column, Literal(None))
        target = self.comparison_type(column, [literal])
        span = _span(column.field.type, target, self.cast(literal, target, column))
        if span is None:
            return Unknown(to_sql(original))
        return _span_condition(op, column.column, column.field.type, span)

    def bind_in(self, expr: In) -> Expr:
        value = self.operand(expr.value)
        options = [self.operand(o) for o in expr.options]
        if isinstance(value, Unknown) or any(isinstance(o, Unknown | _BoundColumn) for o in options):
            return Unknown(to_sql(expr), deterministic=_det(value) and all(_det(o) for o in options))
        literals = [o for o in options if isinstance(o, Literal)]
        if len(literals) != len(options):
            return In(_expr(value), tuple(_expr(o) for o in options), expr.negated)
        if isinstance(value, Literal):
            return _fold_in(value, literals, expr)
        if not isinstance(value, _BoundColumn):
            return In(_expr(value), tuple(literals), expr.negated)
        if not is_comparable(value.field.type):
            return Unknown(to_sql(expr))
        # Spark converts the column and every option to one type, found left to right.
        target = self.comparison_type(value, literals)
        data_type, column = value.field.type, value.column
        spans: list[tuple[Any, Any]] = []
        for option in literals:
            if option.value is not None:
                span = _span(data_type, target, self.cast(option, target, value))
                if span is None:
                    return Unknown(to_sql(expr))
                spans.append(span)
        has_null = len(spans) < len(literals)
        if data_type.name != "float" and all(_is_point(s) or _is_empty(s) for s in spans):
            kept = tuple(Literal(s[0], data_type) for s in spans if _is_point(s))
            if kept or has_null:
                return In(column, kept + ((Literal(None),) if has_null else ()), expr.negated)
            return _all_values(column, data_type) if expr.negated else _no_value(column, data_type)
        disjuncts: list[Expr] = [_span_condition("=", column, data_type, s) for s in spans if not _is_empty(s)]
        if has_null:
            disjuncts.append(Literal(None))
        if not disjuncts:
            return _all_values(column, data_type) if expr.negated else _no_value(column, data_type)
        either = disjuncts[0]
        for d in disjuncts[1:]:
            either = Or(either, d)
        return Not(either) if expr.negated else either

    def comparison_type(self, column: _BoundColumn, literals: list[Literal]) -> DataType:
        """The type Spark compares ``column`` with these literals in (left to right, as ``IN`` does)."""
        target = column.field.type
        for literal in literals:
            if literal.value is None:
                continue
            wider = _comparison_type(target, _literal_type(literal, column))
            if wider is None:  # Spark refuses the comparison (DATATYPE_MISMATCH)
                raise InvalidLiteralError(literal.value, column.field.type.simple_string(), column.column.name)
            target = wider
        return target

    def cast(self, literal: Literal, target: DataType, column: _BoundColumn) -> Any:
        try:
            return _cast_literal(literal.value, _literal_type(literal, column), target)
        except InvalidLiteralError as exc:
            raise InvalidLiteralError(literal.value, column.field.type.simple_string(), column.column.name,
                                      exc.reason) from exc


def _expr(value: Expr | _BoundColumn) -> Expr:
    return value.column if isinstance(value, _BoundColumn) else value


def _det(value: Expr | _BoundColumn) -> bool:
    return not isinstance(value, Unknown) or value.deterministic


def _column_text(column: Column) -> str:
    parts = ([column.qualifier] if column.qualifier else []) + column.name.split(".")
    return ".".join(render_identifier(p) for p in parts)


def _fold(op: ComparisonOp, left: Literal, right: Literal, original: Expr) -> Expr:
    if left.value is None or right.value is None:
        if op == "<=>":
            return Literal(left.value is None and right.value is None)
        return Literal(None)
    try:
        left_type, right_type = _literal_type(left), _literal_type(right)
        target = _comparison_type(left_type, right_type)
        if target is None:
            return Unknown(to_sql(original))  # Spark refuses (TRUE = 1); the engine does not guess
        a, b = _cast_literal(left.value, left_type, target), _cast_literal(right.value, right_type, target)
    except InvalidLiteralError:
        return Unknown(to_sql(original))  # Spark's cast fails at run time ('x' = 1)
    return Literal(_compare(op, *_comparable(a, b)))


def _fold_in(value: Literal, options: list[Literal], original: In) -> Expr:
    """``literal IN (literals)``: Spark converts the value and every option to one type first."""
    if value.value is None:
        return Literal(None)
    try:
        types = [_literal_type(o) for o in (value, *options) if o.value is not None]
        target: DataType | None = types[0]
        for t in types[1:]:
            target = _comparison_type(target, t) if target is not None else None
        if target is None:
            return Unknown(to_sql(original))
        v = _cast_literal(value.value, types[0], target)
        result: bool | None = False
        for option in options:
            hit = None if option.value is None else _compare(
                "=", *_comparable(v, _cast_literal(option.value, _literal_type(option), target)))
            result = _or(result, hit)
    except InvalidLiteralError:
        return Unknown(to_sql(original))
    return Literal(result if result is None or not original.negated else not result)


def _comparable(a: Any, b: Any) -> tuple[Any, Any]:
    """An exact number and a ``Decimal`` as two ``Decimal``s: the order keys keep ints and Decimals apart."""
    if isinstance(a, Decimal) != isinstance(b, Decimal) and not isinstance(a, float) and not isinstance(b, float):
        return Decimal(a), Decimal(b)
    return a, b


# -- Spark's comparison types ----------------------------------------------------------------------
#
# Measured on Spark 4.2 with ANSI on (the analyzed plans of ``col = literal`` for every pair):
#
# - same type: no cast; two integral types: the wider; integral and DECIMAL: a DECIMAL holding both
#   (exact); FLOAT and anything else numeric, DOUBLE and anything numeric: DOUBLE;
# - STRING and an integral type: BIGINT; STRING and FLOAT, DOUBLE or DECIMAL: DOUBLE; STRING and
#   DATE, TIMESTAMP, TIMESTAMP_NTZ, BOOLEAN or BINARY: that type;
# - DATE and TIMESTAMP: TIMESTAMP (midnight in the session time zone, UTC for the provider); DATE and
#   TIMESTAMP_NTZ: TIMESTAMP_NTZ; TIMESTAMP and TIMESTAMP_NTZ: TIMESTAMP;
# - anything else (DATE and a number, BOOLEAN and a number): an analysis error;
# - ``IN`` converts the column and all options to one type, folded left to right.
#
# Literal types: an integer is INT, BIGINT beyond INT, DECIMAL(n,0) beyond BIGINT; ``1.5`` and
# ``1.5BD`` are DECIMAL(2,1); ``1e0`` and ``1D`` are DOUBLE; ``1F`` FLOAT, ``1L`` BIGINT, ``1S``
# SMALLINT, ``1Y`` TINYINT; quoted text is STRING.

_DOUBLE, _LONG = PrimitiveType("double"), PrimitiveType("long")
_INTEGRAL_RANK = {"byte": 0, "short": 1, "integer": 2, "long": 3}
_INTEGRAL_RANGES = {"byte": (-(2**7), 2**7 - 1), "short": (-(2**15), 2**15 - 1),
                    "integer": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
_INTEGRAL_DIGITS = {"byte": 3, "short": 5, "integer": 10, "long": 20}
_NUMERIC = frozenset({*_INTEGRAL_RANK, "decimal", "float", "double"})
_STRING_TARGETS = frozenset({"date", "timestamp", "timestamp_ntz", "boolean", "binary"})
_DATETIME_WIDER = {frozenset({"date", "timestamp"}): PrimitiveType("timestamp"),
                   frozenset({"date", "timestamp_ntz"}): PrimitiveType("timestamp_ntz"),
                   frozenset({"timestamp", "timestamp_ntz"}): PrimitiveType("timestamp")}
#: Room to scale any literal to a column's scale without rounding.
_EXACT = Context(prec=200, Emax=999_999, Emin=-999_999, traps=[InvalidOperation])


def _comparison_type(a: DataType, b: DataType) -> DataType | None:
    """The type Spark converts both sides of ``a op b`` to, or ``None`` where Spark refuses the comparison."""
    x, y = a.name, b.name
    if a == b:
        return a
    if x in _INTEGRAL_RANK and y in _INTEGRAL_RANK:
        return a if _INTEGRAL_RANK[x] >= _INTEGRAL_RANK[y] else b
    if x in _NUMERIC and y in _NUMERIC:
        if x in ("float", "double") or y in ("float", "double"):
            return _DOUBLE
        return _wider_decimal(_as_decimal(a), _as_decimal(b))
    if "string" in (x, y):
        other = b if x == "string" else a
        if other.name in _INTEGRAL_RANK:
            return _LONG
        if other.name in _NUMERIC:
            return _DOUBLE
        return other if other.name in _STRING_TARGETS else None
    return _DATETIME_WIDER.get(frozenset({x, y}))


def _as_decimal(data_type: DataType) -> DecimalType:
    if isinstance(data_type, DecimalType):
        return data_type
    return DecimalType(_INTEGRAL_DIGITS[data_type.name], 0)


def _wider_decimal(a: DecimalType, b: DecimalType) -> DecimalType:
    scale = max(a.scale, b.scale)
    return DecimalType(min(max(a.precision - a.scale, b.precision - b.scale) + scale, 38), min(scale, 38))


def _literal_type(literal: Literal, column: _BoundColumn | None = None) -> DataType:
    """Spark's type of a literal as the parser wrote it (or as an earlier binding typed it).

    Raises:
        InvalidLiteralError: a literal Spark's parser refuses (``200Y``, ``1e39F``, 39 digits).
    """
    value, data_type = literal.value, literal.type
    name = column.column.name if column is not None else None
    if data_type is not None:
        if data_type.name in _INTEGRAL_RANGES and isinstance(value, int) and not isinstance(value, bool):
            low, high = _INTEGRAL_RANGES[data_type.name]
            if not low <= value <= high:
                raise InvalidLiteralError(value, data_type.simple_string(), name)
        elif data_type.name == "float" and isinstance(value, float) and math.isfinite(value) \
                and math.isinf(_f32(value)):
            raise InvalidLiteralError(value, "float", name)
        return data_type
    if isinstance(value, bool):
        return PrimitiveType("boolean")
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return PrimitiveType("integer")
        if -(2**63) <= value < 2**63:
            return _LONG
        width = len(str(abs(value)))
        if width > 38:
            raise InvalidLiteralError(value, "decimal(38,0)", name)
        return DecimalType(width, 0)
    if isinstance(value, float):
        return _DOUBLE
    if isinstance(value, Decimal):
        shape = value.as_tuple()
        exponent, width = shape.exponent, len(shape.digits)
        assert isinstance(exponent, int)  # finite: the parser makes no NaN or infinite Decimal
        precision, scale = (width + exponent, 0) if exponent >= 0 else (max(width, -exponent), -exponent)
        if precision > 38:
            raise InvalidLiteralError(value, "decimal(38)", name)
        return DecimalType(precision, scale)
    if isinstance(value, str):
        return PrimitiveType("string")
    if isinstance(value, dt.datetime):
        return PrimitiveType("timestamp" if value.tzinfo is not None else "timestamp_ntz")
    if isinstance(value, dt.date):
        return PrimitiveType("date")
    if isinstance(value, bytes | bytearray):
        return PrimitiveType("binary")
    raise InvalidLiteralError(value, "a SQL type", name)


def _cast_literal(value: Any, source: DataType, target: DataType) -> Any:
    """Spark's cast of a literal of type ``source`` to the comparison type ``target``, as the engine's value.

    Exact numbers (integral and DECIMAL targets) stay exact (``int`` or ``Decimal``): the span
    below rounds them to the column's scale. A FLOAT is its 32-bit value, widened exactly to DOUBLE.

    Raises:
        InvalidLiteralError: Spark's cast would fail (``'abc'`` as BIGINT) or the engine refuses
            the text (see ``values``).
    """
    name = target.name
    if isinstance(value, bool | str) or name not in _NUMERIC:
        return coerce_literal(value, target)  # text to BIGINT or DOUBLE: Spark's casts (see ``values``)
    if not isinstance(value, int | float | Decimal):
        raise InvalidLiteralError(value, target.simple_string())
    if source.name == "float":
        value = _f32(float(value))
    if name in ("float", "double"):
        return _f32(float(value)) if name == "float" else float(value)
    if isinstance(value, float):
        raise InvalidLiteralError(value, target.simple_string())  # no exact target for a DOUBLE
    return value


def _same_order(a: DataType, b: DataType) -> bool:
    """Whether two columns of these types compare in Python as Spark compares them (no lossy cast)."""
    if a.name in _INTEGRAL_RANK and b.name in _INTEGRAL_RANK:
        return True
    return a.name == b.name and is_comparable(a)


# -- the column's values a comparison selects -------------------------------------------------------
#
# A comparison ``cast(k AS T) op v`` selects, among a column's values, an interval: the cast is
# monotone (Spark orders NaN above every number). ``_span`` gives its ends as two of the column's
# values: ``low``, the least value whose cast is >= v, and ``high``, the greatest whose cast is
# <= v (``None`` where there is none). Then ``cast(k) = v`` holds exactly for low <= k <= high,
# ``cast(k) < v`` for k < low, ``cast(k) > v`` for k > high, and so on, with nothing cast.


def _span(column: DataType, target: DataType, v: Any) -> tuple[Any, Any] | None:
    """``(low, high)`` for ``cast(k AS target)`` against ``v``, or ``None`` when the engine does not model the cast."""
    c, t = column.name, target.name
    if c == "float":
        return _float_span(v)
    if c in _INTEGRAL_RANK or c == "decimal":
        scale = column.scale if isinstance(column, DecimalType) else 0
        if isinstance(column, DecimalType):
            limit = 10**column.precision - 1
            low_index, high_index = -limit, limit
        else:
            low_index, high_index = _INTEGRAL_RANGES[c]
        if t in ("float", "double"):
            span = _search_span(low_index, high_index, lambda i: float(_scaled(i, scale)), v)
        else:
            span = _exact_span(v, scale, low_index, high_index)
        low, high = span
        return (None if low is None else _unscaled(low, column, scale),
                None if high is None else _unscaled(high, column, scale))
    if c == "date" and t in ("timestamp", "timestamp_ntz"):
        return _date_span(v)
    if c == "timestamp_ntz" and t == "timestamp":
        naive = v.astimezone(dt.UTC).replace(tzinfo=None)  # the session time zone is UTC
        return (naive, naive)
    if c == t:
        return (v, v)
    return None  # a STRING column Spark casts to a number, a date or a boolean


def _scaled(index: int, scale: int) -> Decimal:
    return Decimal(f"{index}E-{scale}") if scale else Decimal(index)


def _unscaled(index: int, column: DataType, scale: int) -> Any:
    return _scaled(index, scale) if isinstance(column, DecimalType) else index


def _exact_span(v: int | Decimal, scale: int, low_index: int, high_index: int) -> tuple[int | None, int | None]:
    with localcontext(_EXACT):
        scaled = Decimal(v).scaleb(scale)
    low, high = math.ceil(scaled), math.floor(scaled)
    return (None if low > high_index else max(low, low_index),
            None if high < low_index else min(high, high_index))


def _search_span(low_index: int, high_index: int, cast: Callable[[int], float], v: float,
                 ) -> tuple[int | None, int | None]:
    """The span for a lossy monotone cast (BIGINT or DECIMAL to DOUBLE), by bisection."""
    key = comparison_key(v)
    low = _least(low_index, high_index, lambda i: comparison_key(cast(i)) >= key)
    above = _least(low_index, high_index, lambda i: comparison_key(cast(i)) > key)
    high = high_index if above is None else above - 1
    return low, (high if high >= low_index else None)


def _least(low: int, high: int, holds: Callable[[int], bool]) -> int | None:
    """The least i in [low, high] where the monotone ``holds`` is true, or ``None``."""
    if not holds(high):
        return None
    while low < high:
        middle = (low + high) // 2
        if holds(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _date_span(v: dt.datetime) -> tuple[dt.date | None, dt.date | None]:
    """A DATE cast to TIMESTAMP (midnight UTC) or TIMESTAMP_NTZ (midnight) against ``v``."""
    day = (v.astimezone(dt.UTC) if v.tzinfo is not None else v).date()
    midnight = dt.datetime.combine(day, dt.time(0), tzinfo=dt.UTC if v.tzinfo is not None else None)
    if midnight == v:
        return (day, day)
    try:
        return (day + dt.timedelta(days=1), day)
    except OverflowError:
        return (None, day)


# FLOAT columns. The log writes a FLOAT as Java's ``Float.toString``, which on Java 17 is not always
# the shortest text (``5.2363342E10`` for the FLOAT ``5.236334E10F``); the engine reads that text as
# a double, so one FLOAT has many readings, all between the midpoints to its neighbours. A FLOAT span
# is therefore judged on those midpoints, as DOUBLE literals, which Spark reads the same way.

#: Where a DOUBLE stops rounding to the greatest FLOAT and becomes infinity.
_F32_EDGE = 2.0**128 - 2.0**103


def _f32(x: float) -> float:
    """The FLOAT nearest ``x`` (Java's ``(float) x``), beyond the range an infinity."""
    if math.isnan(x):
        return math.nan
    try:
        return float(struct.unpack("<f", struct.pack("<f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


def _f32_step(x: float, up: bool) -> float:
    """The FLOAT next above (``up``) or below the FLOAT ``x``; zero has no sign."""
    if x == 0:
        return 1.401298464324817e-45 if up else -1.401298464324817e-45
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits += 1 if (x > 0) == up else -1
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def _float_span(v: float) -> tuple[float, float]:
    if math.isnan(v):
        return (math.nan, math.nan)
    x = _f32(v)
    if x == v:
        return (x, x)
    return (_f32_step(x, True), x) if x < v else (x, _f32_step(x, False))


def _midpoint(low: float, high: float) -> float:
    """The DOUBLE between two adjacent FLOATs that no reading of either passes."""
    if math.isinf(high):
        return _F32_EDGE
    if math.isinf(low):
        return -_F32_EDGE
    return (low + high) / 2


def _is_point(span: tuple[Any, Any]) -> bool:
    return span[0] is not None and span[1] is not None and bool(comparison_key(span[0]) == comparison_key(span[1]))


def _is_empty(span: tuple[Any, Any]) -> bool:
    return span[0] is None or span[1] is None or bool(comparison_key(span[0]) > comparison_key(span[1]))


def _span_condition(op: ComparisonOp, column: Column, data_type: DataType, span: tuple[Any, Any]) -> Expr:
    """The condition on ``column`` that ``cast(column) op v`` is, for ``span = (low, high)`` of v."""
    low, high = span
    point, empty = _is_point(span), _is_empty(span)
    if op == "<=>":
        if empty:
            return Literal(False)
        inside = _span_condition("=", column, data_type, span)
        return Comparison("<=>", column, Literal(low, data_type)) if point and data_type.name != "float" \
            else And(IsNull(column, negated=True), inside)
    if op in ("=", "!="):
        if empty:
            return _no_value(column, data_type) if op == "=" else _all_values(column, data_type)
        if point and data_type.name != "float":
            return Comparison(op, column, Literal(low, data_type))
        inside = And(_bound(">=", column, data_type, low), _bound("<=", column, data_type, high))
        if (isinstance(low, float) and math.isinf(low) and low == high) or _is_nan(low):
            inside = Comparison("=", column, Literal(low, data_type))  # read exactly: Infinity, NaN
        if op == "=":
            return inside
        if _is_nan(low):
            return Comparison("!=", column, Literal(low, data_type))
        return Or(_bound("<", column, data_type, low), _bound(">", column, data_type, high))
    if op in ("<", ">="):
        if low is None:
            return _all_values(column, data_type) if op == "<" else _no_value(column, data_type)
        return _bound(op, column, data_type, low)
    if high is None:
        return _no_value(column, data_type) if op == "<=" else _all_values(column, data_type)
    return _bound(op, column, data_type, high)


def _bound(op: ComparisonOp, column: Column, data_type: DataType, value: Any) -> Expr:
    """``column op value`` for a value of the column; a finite FLOAT is bounded by its midpoints."""
    if data_type.name != "float" or not math.isfinite(value):
        if data_type.name == "float" and op == "<" and value == -math.inf:
            return _no_value(column, data_type)
        if data_type.name == "float" and op == ">" and _is_nan(value):
            return _no_value(column, data_type)
        return Comparison(op, column, Literal(value, data_type))
    if op in ("<", ">="):  # below value: at most the midpoint to its lower neighbour
        edge = _midpoint(_f32_step(value, False), value)
        return Comparison("<=" if op == "<" else ">=", column, Literal(edge, _DOUBLE))
    edge = _midpoint(value, _f32_step(value, True))
    return Comparison("<=" if op == "<=" else ">=", column, Literal(edge, _DOUBLE))


_LEAST: dict[str, Any] = {"float": -math.inf, "double": -math.inf, "date": dt.date.min, "string": "",
                          "timestamp": dt.datetime.min.replace(tzinfo=dt.UTC),
                          "timestamp_ntz": dt.datetime.min, "boolean": False, "binary": b""}


def _least_value(data_type: DataType) -> Any:
    if isinstance(data_type, DecimalType):
        return _scaled(-(10**data_type.precision - 1), data_type.scale)
    if data_type.name in _INTEGRAL_RANGES:
        return _INTEGRAL_RANGES[data_type.name][0]
    return _LEAST[data_type.name]


def _no_value(column: Column, data_type: DataType) -> Expr:
    """False on every value of the column, NULL on NULL: ``column < <its least value>``."""
    return Comparison("<", column, Literal(_least_value(data_type), data_type))


def _all_values(column: Column, data_type: DataType) -> Expr:
    """True on every value of the column (NaN too), NULL on NULL."""
    return Comparison(">=", column, Literal(_least_value(data_type), data_type))


# -- exact evaluation ------------------------------------------------------------------------------

def evaluate_row(expr: Expr, row: Mapping[str, Any]) -> bool | None:
    """SQL three-valued result of a bound expression on one row (``None`` is NULL).

    Raises:
        ValueError: the expression reads a column missing from ``row`` or holds an ``Unknown``.
    """
    if isinstance(expr, Literal):
        if expr.value is None or isinstance(expr.value, bool):
            return expr.value
        raise ValueError(f"literal {expr.value!r} is not a condition")
    if isinstance(expr, Column):
        value = _value(expr, row)
        return None if value is None else bool(value)
    if isinstance(expr, Comparison):
        return _compare_values(expr.op, _value(expr.left, row), _value(expr.right, row))
    if isinstance(expr, In):  # the OR of its equalities, folded in a loop (a long list is no deep tree)
        result: bool | None = False
        for option in expr.options:
            result = _or(result, evaluate_row(Comparison("=", expr.value, option), row))
        return (None if result is None else not result) if expr.negated else result
    if isinstance(expr, IsNull):
        is_null = _value(expr.value, row) is None
        return not is_null if expr.negated else is_null
    if isinstance(expr, And):
        return _and(evaluate_row(expr.left, row), evaluate_row(expr.right, row))
    if isinstance(expr, Or):
        return _or(evaluate_row(expr.left, row), evaluate_row(expr.right, row))
    if isinstance(expr, Not):
        result = evaluate_row(expr.child, row)
        return None if result is None else not result
    raise ValueError(f"cannot evaluate {to_sql(expr)} exactly")


def evaluate_partition(expr: Expr, values: Mapping[str, Any]) -> bool | None:
    """Exact result of a partition-only predicate on one partition's typed values."""
    return evaluate_row(expr, values)


def _value(expr: Expr, row: Mapping[str, Any]) -> Any:
    if isinstance(expr, Literal):
        return expr.value
    if isinstance(expr, Column):
        if expr.name not in row:
            raise ValueError(f"no value for column {expr.name!r}")
        return row[expr.name]
    raise ValueError(f"cannot evaluate {to_sql(expr)} as a value")


def _in_as_or(expr: In) -> Expr:
    disjunction = or_(*(Comparison("=", expr.value, o) for o in expr.options))
    return Not(disjunction) if expr.negated else disjunction


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


def comparison_key(value: Any) -> Any:
    """What a comparison compares of ``value``: two values are equal when their keys are (``evaluate_row``).

    Spark orders NaN above every other double and treats NaN = NaN as true; integers and doubles compare
    by value. Keys are hashable, so sets of them say which values a filter can meet.
    """
    if isinstance(value, float):
        return (1, 0.0) if math.isnan(value) else (0, value)
    if isinstance(value, int) and not isinstance(value, bool):
        return (0, value)
    return value


def _compare(op: ComparisonOp, a: Any, b: Any) -> bool:
    ka, kb = comparison_key(a), comparison_key(b)
    if op in ("=", "<=>"):
        return bool(ka == kb)
    if op == "!=":
        return bool(ka != kb)
    if op == "<":
        return bool(ka < kb)
    if op == "<=":
        return bool(ka <= kb)
    if op == ">":
        return bool(ka > kb)
    return bool(ka >= kb)


def _compare_values(op: ComparisonOp, a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        if op == "<=>":
            return a is None and b is None
        return None
    return _compare(op, a, b)


# -- conservative evaluation on file statistics ----------------------------------------------------

_T, _F, _N = True, False, None
_ALL: frozenset[bool | None] = frozenset({_T, _F, _N})


@dataclass(frozen=True)
class StatsRange:
    """What is known of a column's values over a file: bounds (``None`` = open) and null presence."""

    low: Any
    high: Any
    may_null: bool
    may_value: bool


def file_may_match(expr: Expr, partition_values: Mapping[str, Any], stats: FileStats | None) -> bool:
    """Whether a file with these partition values and statistics may hold a row matching ``expr``."""
    return _T in _possible(expr, partition_values, stats)


def every_row_matches(expr: Expr, partition_values: Mapping[str, Any], stats: FileStats | None) -> bool:
    """Whether every row of a file with these partition values and statistics surely meets ``expr`` (``True`` on
    each one, never ``NULL``). Says nothing of whether the file has a row: the caller checks that.

    The converse of ``file_may_match``, held to the same bounds: a comparison over statistics may be false
    unless every value between the file's minimum and maximum satisfies it (``file_may_match`` assumes it may
    always be false, which prunes exactly what Delta's data skipping prunes, so it stays as it is)."""
    return _possible(expr, partition_values, stats, tight=True) == frozenset({_T})


def _possible(expr: Expr, pv: Mapping[str, Any], stats: FileStats | None,
              tight: bool = False) -> frozenset[bool | None]:
    if isinstance(expr, Literal):
        if expr.value is None or isinstance(expr.value, bool):
            return frozenset({expr.value})
        return _ALL
    if isinstance(expr, Column):
        if expr.name in pv:
            value = pv[expr.name]
            return frozenset({None if value is None else bool(value)})
        return _ALL
    if isinstance(expr, Comparison):
        return _possible_comparison(expr, pv, stats, tight)
    if isinstance(expr, In):  # the OR of its equalities, folded in a loop (a long list is no deep tree)
        possible: frozenset[bool | None] | None = None
        for option in expr.options:
            equal = _possible(Comparison("=", expr.value, option), pv, stats, tight)
            possible = equal if possible is None else frozenset(_or(a, b) for a in possible for b in equal)
        if possible is None:
            possible = frozenset({False})
        return frozenset(None if v is None else not v for v in possible) if expr.negated else possible
    if isinstance(expr, IsNull):
        return _possible_is_null(expr, pv, stats)
    if isinstance(expr, And | Or):
        combine = _and if isinstance(expr, And) else _or
        left, right = _possible(expr.left, pv, stats, tight), _possible(expr.right, pv, stats, tight)
        return frozenset(combine(a, b) for a in left for b in right)
    if isinstance(expr, Not):
        return frozenset(None if v is None else not v for v in _possible(expr.child, pv, stats, tight))
    return _ALL


def _domain(expr: Expr, pv: Mapping[str, Any], stats: FileStats | None) -> tuple[bool, Any] | StatsRange | None:
    """``(True, value)`` for a value constant over the file, a ``StatsRange``, or ``None`` if unknown."""
    if isinstance(expr, Literal):
        return (True, expr.value)
    if isinstance(expr, Column):
        if expr.name in pv:
            return (True, pv[expr.name])
        return stats_range(stats, expr.name)
    return None


def stats_range(stats: FileStats | None, name: str) -> StatsRange | None:
    """What a file's statistics say about column ``name``, or ``None`` when they say nothing.

    The one place statistics become a range: the per-file test above and the vectorised one in
    ``stats_columns`` (which caches these per checkpoint row) both read columns through it.
    """
    if stats is None:
        return None
    col = stats.columns.get(name)
    if col is None:
        return None
    n = stats.num_records
    may_null = col.null_count is None or col.null_count > 0
    may_value = col.null_count is None or n is None or col.null_count < n
    if n == 0:
        may_null = may_value = False
    low, high = col.min, col.max
    if _is_nan(low) or _is_nan(high):
        low = high = None
    return StatsRange(low, high, may_null, may_value)


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _possible_is_null(expr: IsNull, pv: Mapping[str, Any], stats: FileStats | None) -> frozenset[bool | None]:
    domain = _domain(expr.value, pv, stats)
    if isinstance(domain, tuple):
        is_null = domain[1] is None
        return frozenset({(not is_null) if expr.negated else is_null})
    if domain is None:
        return frozenset({True, False})
    out: set[bool | None] = set()
    if domain.may_null:
        out.add(not expr.negated)
    if domain.may_value:
        out.add(expr.negated)
    return frozenset(out)


_FLIP: dict[ComparisonOp, ComparisonOp] = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<=",
                                           "<=>": "<=>"}


def _possible_comparison(expr: Comparison, pv: Mapping[str, Any], stats: FileStats | None,
                         tight: bool = False) -> frozenset[bool | None]:
    left, right = _domain(expr.left, pv, stats), _domain(expr.right, pv, stats)
    if isinstance(left, tuple) and isinstance(right, tuple):
        return frozenset({_compare_values(expr.op, left[1], right[1])})
    op = expr.op
    if isinstance(right, StatsRange) and isinstance(left, tuple):
        left, right, op = right, left, _FLIP[op]
    if not (isinstance(left, StatsRange) and isinstance(right, tuple)):
        return _ALL  # column against column (not both constant), or unknown statistics
    literal = right[1]
    out: set[bool | None] = set()
    if literal is None:
        if op == "<=>":
            if left.may_null:
                out.add(True)
            if left.may_value:
                out.add(False)
            return frozenset(out)
        return frozenset({None}) if (left.may_null or left.may_value) else frozenset()
    if left.may_null:
        out.add(False if op == "<=>" else None)
    if left.may_value:
        if not tight or _range_may_satisfy(_NEGATED[op], left.low, left.high, literal):
            out.add(False)
        if _range_may_satisfy(op, left.low, left.high, literal):
            out.add(True)
    return frozenset(out)


# ``v op literal`` is false, for a non-null ``v`` and literal, exactly where ``v _NEGATED[op] literal`` holds.
_NEGATED: dict[ComparisonOp, ComparisonOp] = {"=": "!=", "<=>": "!=", "!=": "=", "<": ">=", "<=": ">", ">": "<=",
                                              ">=": "<"}


def _range_may_satisfy(op: ComparisonOp, low: Any, high: Any, literal: Any) -> bool:
    """Whether some value v with low <= v <= high (``None`` = unbounded) satisfies ``v op literal``."""
    if _is_nan(literal):
        return True
    try:
        k = comparison_key(literal)
        lo = comparison_key(low) if low is not None else None
        hi = comparison_key(high) if high is not None else None
        if op in ("=", "<=>"):
            return (lo is None or lo <= k) and (hi is None or k <= hi)
        if op == "!=":
            return not (lo is not None and hi is not None and lo == hi == k)
        if op == "<":
            return lo is None or lo < k
        if op == "<=":
            return lo is None or lo <= k
        if op == ">":
            return hi is None or hi > k
        return hi is None or hi >= k
    except TypeError:
        return True  # values of different types: cannot reason, keep the file

