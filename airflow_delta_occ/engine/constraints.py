"""Does a condition really confine a job to some partitions?

``strict_partitions=True`` promises that a job states which partitions it touches. A top-level
conjunct over partition columns is the form Delta's conflict check reads, but the form alone proves
nothing: ``country = 'DE' OR 1 = 1`` is such a conjunct and admits every partition. The test here is
semantic: a conjunct confines the job when some partition of non-NULL values makes it not TRUE.
Excluding only the NULL partition (``country IS NOT NULL``, ``country = 'DE' OR country <> 'DE'``)
confines nothing a user would call a partition.

It is decided by evaluating the conjunct on witness values. Every atom the engine models compares
one partition column with literals, so its truth value is constant on each literal and on each
open interval between consecutive literals (and below the smallest, above the largest). One
witness per such region covers every case, so the answer is exact for conjuncts the
engine models; anything it does not model (an ``Unknown``) is not counted as a constraint.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Collection, Mapping
from decimal import Decimal
from typing import Any

from .errors import InvalidLiteralError
from .expressions import Column, Comparison, Expr, In, Literal, walk
from .predicates import evaluate_partition
from .schema import DataType
from .values import coerce_literal

_MAX_ASSIGNMENTS = 20_000
# A value of each type for a column the conjunct compares with no literal at all.
_ANY_VALUE: dict[str, Any] = {
    "string": "", "boolean": True, "byte": 0, "short": 0, "integer": 0, "long": 0, "float": 0.0, "double": 0.0,
    "date": dt.date(2000, 1, 1), "timestamp": dt.datetime(2000, 1, 1, tzinfo=dt.UTC),
    "timestamp_ntz": dt.datetime(2000, 1, 1), "binary": b"",
}


def confining_conjuncts(expr: Expr, partition_types: Mapping[str, DataType]) -> list[Expr]:
    """The top-level partition-only conjuncts of a bound ``expr`` that exclude some partition."""
    from .expressions import partition_conjuncts

    return [c for c in partition_conjuncts(expr, partition_types) if excludes_some_partition(c, partition_types)]


def excludes_some_partition(conjunct: Expr, partition_types: Mapping[str, DataType]) -> bool:
    """Whether a bound, partition-only ``conjunct`` is not TRUE for some partition of non-NULL values.

    When the witnesses are too many to try (a conjunct over many columns with many literals), the
    answer is ``False``: a strict check would rather refuse than wave through.
    """
    columns = sorted({e.name for e in walk(conjunct) if isinstance(e, Column)})
    if not columns:  # a constant: TRUE confines nothing, FALSE/NULL excludes everything
        try:
            return evaluate_partition(conjunct, {}) is not True
        except ValueError:
            return False
    candidates = [_witnesses(_literals(conjunct, name), partition_types.get(name)) for name in columns]
    try:
        for combo in itertools.islice(itertools.product(*candidates), _MAX_ASSIGNMENTS):
            if evaluate_partition(conjunct, dict(zip(columns, combo, strict=True))) is not True:
                return True
    except (ValueError, TypeError):  # a value the evaluator cannot compare: not proven to confine
        return False
    return False


def _literals(expr: Expr, column: str) -> list[Any]:
    found: list[Any] = []
    for e in walk(expr):
        if isinstance(e, Comparison):
            for a, b in ((e.left, e.right), (e.right, e.left)):
                if isinstance(a, Column) and a.name == column and isinstance(b, Literal):
                    found.append(b.value)
        elif isinstance(e, In) and isinstance(e.value, Column) and e.value.name == column:
            found.extend(o.value for o in e.options if isinstance(o, Literal))
    return [v for v in found if v is not None]


def _witnesses(literals: Collection[Any], data_type: DataType | None) -> list[Any]:
    """Each literal and values just below and above each one (never NULL: see the module doc).

    A value just above a literal lies inside the open interval up to the next literal (when that
    interval is not empty), and one below the smallest lies under all of them, so every region of
    the line gets a witness without ordering the literals.
    """
    values: list[Any] = []
    if not literals:
        values.append(_ANY_VALUE.get(data_type.name if data_type else "", ""))
        return values
    for value in dict.fromkeys(literals):
        values.append(value)
        values.extend(v for v in (_below(value), _above(value)) if v is not None and _fits(v, data_type))
    return values


def _fits(value: Any, data_type: DataType | None) -> bool:
    """Whether a witness is a value the column can hold (2**31 is no INT partition value)."""
    if data_type is None:
        return True
    try:
        coerce_literal(value, data_type)
    except InvalidLiteralError:
        return False
    return True


def _above(value: Any) -> Any:
    try:
        if isinstance(value, bool):
            return not value
        if isinstance(value, int):
            return value + 1
        if isinstance(value, float):
            return value + max(abs(value) * 1e-9, 1e-9)
        if isinstance(value, Decimal):
            return value + Decimal(1).scaleb(int(value.as_tuple().exponent)) / 2
        if isinstance(value, str):
            return value + "\x00"
        if isinstance(value, bytes):
            return value + b"\x00"
        if isinstance(value, dt.datetime):
            return value + dt.timedelta(microseconds=1)
        if isinstance(value, dt.date):
            return value + dt.timedelta(days=1)
    except (OverflowError, ArithmeticError, ValueError):
        return None
    return None


def _below(value: Any) -> Any:
    try:
        if isinstance(value, bool):
            return not value
        if isinstance(value, int | float | Decimal):
            return value - 1
        if isinstance(value, str | bytes):
            return value[:0] if value else None
        if isinstance(value, dt.datetime):
            return value - dt.timedelta(microseconds=1)
        if isinstance(value, dt.date):
            return value - dt.timedelta(days=1)
    except (OverflowError, ArithmeticError, ValueError):
        return None
    return None
