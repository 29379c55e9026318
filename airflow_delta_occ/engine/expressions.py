"""The predicate expression model: columns, typed literals, comparisons, IN, IS NULL, AND/OR/NOT.

``Unknown`` stands for anything outside the model (a function call, arithmetic, a subquery, a
column of another relation). It keeps its source text so that it can be rendered back, and whether
it is deterministic, so callers can tell "not understood" from "different on every run".
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any
from typing import Literal as TypingLiteral

from .schema import DataType

ComparisonOp = TypingLiteral["=", "!=", "<", "<=", ">", ">=", "<=>"]


@dataclass(frozen=True)
class Column:
    """A column reference; ``name`` is dotted for a nested struct field (``address.city``)."""

    name: str
    qualifier: str | None = None


@dataclass(frozen=True)
class Literal:
    """A constant. ``type`` is ``None`` for an untyped SQL literal until binding gives it one."""

    value: Any
    type: DataType | None = None


@dataclass(frozen=True)
class Comparison:
    op: ComparisonOp
    left: Expr
    right: Expr


@dataclass(frozen=True)
class In:
    value: Expr
    options: tuple[Expr, ...]
    negated: bool = False


@dataclass(frozen=True)
class IsNull:
    value: Expr
    negated: bool = False


@dataclass(frozen=True)
class And:
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Or:
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Not:
    child: Expr


@dataclass(frozen=True)
class Unknown:
    """An expression the engine does not evaluate; it may take any value on any row."""

    text: str
    deterministic: bool = True


Expr = Column | Literal | Comparison | In | IsNull | And | Or | Not | Unknown

TRUE = Literal(True)


def children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, Comparison):
        return (expr.left, expr.right)
    if isinstance(expr, In):
        return (expr.value, *expr.options)
    if isinstance(expr, IsNull):
        return (expr.value,)
    if isinstance(expr, And | Or):
        return (expr.left, expr.right)
    if isinstance(expr, Not):
        return (expr.child,)
    return ()


def walk(expr: Expr) -> Iterator[Expr]:
    yield expr
    for child in children(expr):
        yield from walk(child)


def references(expr: Expr) -> set[str]:
    """Names of the columns an expression reads (bound names after ``bind``)."""
    return {e.name for e in walk(expr) if isinstance(e, Column)}


def has_unknown(expr: Expr) -> bool:
    return any(isinstance(e, Unknown) for e in walk(expr))


def is_deterministic(expr: Expr) -> bool:
    return all(e.deterministic for e in walk(expr) if isinstance(e, Unknown))


def is_partition_only(expr: Expr, partition_columns: Collection[str]) -> bool:
    """True when the expression reads only partition columns and holds nothing unknown."""
    return not has_unknown(expr) and references(expr) <= set(partition_columns)


def split_conjuncts(expr: Expr) -> list[Expr]:
    if isinstance(expr, And):
        return split_conjuncts(expr.left) + split_conjuncts(expr.right)
    return [expr]


def partition_conjuncts(expr: Expr, partition_columns: Collection[str]) -> list[Expr]:
    """The top-level conjuncts over partition columns only: all Delta's conflict check looks at."""
    partitions = set(partition_columns)
    return [c for c in split_conjuncts(expr) if is_partition_only(c, partitions)]


def and_(*exprs: Expr) -> Expr:
    """Conjunction of the arguments (``TRUE`` when there are none)."""
    if not exprs:
        return TRUE
    result = exprs[0]
    for e in exprs[1:]:
        result = And(result, e)
    return result


def or_(*exprs: Expr) -> Expr:
    if not exprs:
        return Literal(False)
    result = exprs[0]
    for e in exprs[1:]:
        result = Or(result, e)
    return result
