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

import math
from collections.abc import Mapping
from dataclasses import dataclass
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
from .schema import PrimitiveType, StructField, StructType
from .sql_parser import parse_predicate, render_identifier, render_literal, to_sql
from .values import coerce_literal, is_comparable

__all__ = [
    "And", "Column", "ColumnStats", "Comparison", "Expr", "FileStats", "In", "IsNull", "Literal", "Not", "Or",
    "StatsRange", "Unknown", "and_", "bind", "evaluate_partition", "evaluate_row", "file_may_match", "has_unknown",
    "is_deterministic", "is_partition_only", "or_", "parse_predicate", "references", "split_conjuncts",
    "stats_range", "to_sql", "walk",
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
    """Resolve columns against ``schema`` and convert literals to the types of their columns.

    A column qualified by anything other than ``target_alias`` belongs to another relation (a MERGE
    source, say) and becomes ``Unknown``; so does a comparison the engine cannot order (struct,
    array, map or variant columns, two differently typed literals).

    Raises:
        UnknownColumnError: a column the table does not have.
        InvalidLiteralError: a literal that is not a valid value of its column's type.
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
            if not (is_comparable(left.field.type) and is_comparable(right.field.type)):
                return Unknown(to_sql(expr))
            return Comparison(expr.op, left.column, right.column)
        if isinstance(left, _BoundColumn) or isinstance(right, _BoundColumn):
            column, other = (left, right) if isinstance(left, _BoundColumn) else (right, left)
            assert isinstance(column, _BoundColumn)
            if not is_comparable(column.field.type) or not isinstance(other, Literal):
                return Unknown(to_sql(expr))
            literal = self.coerce(other, column)
            if isinstance(left, _BoundColumn):
                return Comparison(expr.op, column.column, literal)
            return Comparison(expr.op, literal, column.column)
        if isinstance(left, Literal) and isinstance(right, Literal):
            return _fold(expr.op, left, right, expr)
        return Comparison(expr.op, _expr(left), _expr(right))

    def bind_in(self, expr: In) -> Expr:
        value = self.operand(expr.value)
        options = [self.operand(o) for o in expr.options]
        if isinstance(value, Unknown) or any(isinstance(o, Unknown | _BoundColumn) for o in options):
            return Unknown(to_sql(expr), deterministic=_det(value) and all(_det(o) for o in options))
        if isinstance(value, _BoundColumn):
            if not is_comparable(value.field.type):
                return Unknown(to_sql(expr))
            bound = tuple(self.coerce(o, value) if isinstance(o, Literal) else _expr(o) for o in options)
            return In(value.column, bound, expr.negated)
        return In(_expr(value), tuple(_expr(o) for o in options), expr.negated)

    def coerce(self, literal: Literal, column: _BoundColumn) -> Literal:
        try:
            value = coerce_literal(literal.value, column.field.type, column.column.name)
        except InvalidLiteralError as exc:
            raise InvalidLiteralError(literal.value, column.field.type.simple_string(), column.column.name) from exc
        return Literal(value, column.field.type if value is not None else None)


def _expr(value: Expr | _BoundColumn) -> Expr:
    return value.column if isinstance(value, _BoundColumn) else value


def _det(value: Expr | _BoundColumn) -> bool:
    return not isinstance(value, Unknown) or value.deterministic


def _column_text(column: Column) -> str:
    parts = ([column.qualifier] if column.qualifier else []) + column.name.split(".")
    return ".".join(render_identifier(p) for p in parts)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fold(op: ComparisonOp, left: Literal, right: Literal, original: Comparison) -> Expr:
    if left.value is None or right.value is None:
        if op == "<=>":
            return Literal(left.value is None and right.value is None)
        return Literal(None)
    if type(left.value) is not type(right.value) and not (_numeric(left.value) and _numeric(right.value)):
        return Unknown(to_sql(original))  # Spark casts (TRUE = 1 is true); the engine does not guess
    return Literal(_compare(op, left.value, right.value))


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
    if isinstance(expr, In):
        return evaluate_row(_in_as_or(expr), row)
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


def _order_key(value: Any) -> Any:
    # Spark orders NaN above every other double and treats NaN = NaN as true.
    if isinstance(value, float):
        return (1, 0.0) if math.isnan(value) else (0, value)
    if isinstance(value, int) and not isinstance(value, bool):
        return (0, value)
    return value


def _compare(op: ComparisonOp, a: Any, b: Any) -> bool:
    ka, kb = _order_key(a), _order_key(b)
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


def _possible(expr: Expr, pv: Mapping[str, Any], stats: FileStats | None) -> frozenset[bool | None]:
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
        return _possible_comparison(expr, pv, stats)
    if isinstance(expr, In):
        return _possible(_in_as_or(expr), pv, stats)
    if isinstance(expr, IsNull):
        return _possible_is_null(expr, pv, stats)
    if isinstance(expr, And | Or):
        combine = _and if isinstance(expr, And) else _or
        left, right = _possible(expr.left, pv, stats), _possible(expr.right, pv, stats)
        return frozenset(combine(a, b) for a in left for b in right)
    if isinstance(expr, Not):
        return frozenset(None if v is None else not v for v in _possible(expr.child, pv, stats))
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


def _possible_comparison(expr: Comparison, pv: Mapping[str, Any], stats: FileStats | None) -> frozenset[bool | None]:
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
        out.add(False)
        if _range_may_satisfy(op, left.low, left.high, literal):
            out.add(True)
    return frozenset(out)


def _range_may_satisfy(op: ComparisonOp, low: Any, high: Any, literal: Any) -> bool:
    """Whether some value v with low <= v <= high (``None`` = unbounded) satisfies ``v op literal``."""
    if _is_nan(literal):
        return True
    try:
        k = _order_key(literal)
        lo = _order_key(low) if low is not None else None
        hi = _order_key(high) if high is not None else None
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

