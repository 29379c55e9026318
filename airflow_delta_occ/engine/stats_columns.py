"""Data skipping over many files at once: statistics as cached per-column arrays, predicates as masks.

``predicates.file_may_match`` judges one file at a time and stays the semantic reference. Planning
on a 100,000-file checkpoint cannot afford that per plan (parsing the stats JSON of every candidate,
then walking the predicate tree per file), and conflict pools re-plan whenever the table moves. So:

- ``StatsColumns`` parses a checkpoint's stats lazily, only for the rows a plan asks about and only
  for the columns its predicate reads, through the very functions the reference uses
  (``stats.parse_stats_of``, ``predicates.stats_range``), and keeps the result per column as arrays
  over all checkpoint rows. The checkpoint never changes, so every later plan on any snapshot built
  on it (``Snapshot.update()`` keeps the checkpoint) reads the arrays instead of JSON.
- ``may_match_mask`` is ``predicates._possible`` with partition values left empty (how
  ``files_matching`` calls it), written over arrays: per file, whether the predicate may be TRUE,
  FALSE or NULL, combined by the same truth tables. Bounds are compared with the literal by
  Python's own comparison, element by element, so the answers are the same ones. Where the
  reference's order keys would make a difference (a number against a non-number, which its keys
  keep apart) or a comparison raises (which the reference catches, file by file), it gives up with
  ``CannotVectorize`` and the caller asks the reference per file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .expressions import And, Column, Comparison, ComparisonOp, Expr, In, IsNull, Literal, Not, Or, and_
from .predicates import _FLIP, StatsRange, _compare_values, _in_as_or, _is_nan, file_may_match, stats_range
from .schema import DataType
from .stats import StatsLeaf, parse_stats_of

#: What identifies a column's statistics: where they are in the JSON and how they are typed. Keyed
#: so, a cache survives metadata changes that leave a column alone and never outlives one that
#: changes it (a rename under column mapping keeps the physical name; type widening changes the type).
_LeafKey = tuple[tuple[str, ...], DataType]


class CannotVectorize(Exception):
    """The arrays cannot answer for this expression exactly; judge its files one by one instead."""


@dataclass(frozen=True)
class ColumnBounds:
    """One column's statistics over some files, as ``predicates.stats_range`` gives them per file.

    ``known`` is false where that range is ``None`` (no stats, unreadable stats, no entry for the
    column); there the other arrays are false/``None`` and never read. ``low``/``high`` hold the
    bounds as parsed (``None`` for an open bound), ``low_kind``/``high_kind`` their kind
    (``_kind``), so that comparing them needs no Python object beyond the values themselves.
    """

    known: np.ndarray
    may_null: np.ndarray
    may_value: np.ndarray
    low: np.ndarray
    high: np.ndarray
    low_kind: np.ndarray
    high_kind: np.ndarray

    def take(self, rows: np.ndarray) -> ColumnBounds:
        return ColumnBounds(*(getattr(self, name)[rows] for name in _BOUND_ARRAYS))


_BOUND_ARRAYS = ("known", "may_null", "may_value", "low", "high", "low_kind", "high_kind")
_OPEN, _NUMBER, _OTHER = 0, 1, 2


def _kind(value: Any) -> int:
    """``_OPEN`` for no bound; else whether ``predicates._order_key`` wraps it as a number (bool is not one)."""
    if value is None:
        return _OPEN
    return _NUMBER if isinstance(value, int | float) and not isinstance(value, bool) else _OTHER


class _CachedColumn:
    """``ColumnBounds`` over all rows of a checkpoint, valid where ``filled``."""

    def __init__(self, n: int) -> None:
        self.filled = np.zeros(n, dtype=bool)
        self.bounds = ColumnBounds(
            known=np.zeros(n, dtype=bool), may_null=np.zeros(n, dtype=bool), may_value=np.zeros(n, dtype=bool),
            low=np.full(n, None, dtype=object), high=np.full(n, None, dtype=object),
            low_kind=np.zeros(n, dtype=np.int8), high_kind=np.zeros(n, dtype=np.int8),
        )


class StatsColumns:
    """The statistics of a fixed list of files (a checkpoint's add rows), parsed lazily and kept.

    ``stats_json`` is the rows' ``add.stats`` column, the text ``AddFile.stats`` holds once a row is
    decoded. Rows are parsed the first time a plan asks for them, so a plan confined to one partition
    pays for that partition only.
    """

    def __init__(self, stats_json: pa.ChunkedArray | pa.Array | None, num_rows: int) -> None:
        self._json = stats_json
        self._num_rows = num_rows
        self._columns: dict[_LeafKey, _CachedColumn] = {}
        # Snapshots are shared between threads (a pool re-plans while a sensor reads); a fill writes
        # several arrays and must not be seen half done, nor done twice.
        self._lock = threading.Lock()

    def json_at(self, rows: np.ndarray) -> list[str | None]:
        """The raw stats text of ``rows`` (for judging them with the per-file reference)."""
        if self._json is None:
            return [None] * len(rows)
        values: list[str | None] = self._json.take(pa.array(rows, type=pa.int64())).to_pylist()
        return values

    def bounds(self, leaves: Sequence[StatsLeaf], rows: np.ndarray) -> dict[str, ColumnBounds]:
        """Per leaf (by logical name), its bounds at ``rows``, parsing the rows not seen before."""
        with self._lock:
            cached = []
            for _, path, f in leaves:
                column = self._columns.get((path, f.type))
                if column is None:
                    column = self._columns[(path, f.type)] = _CachedColumn(self._num_rows)
                cached.append(column)
            missing = np.zeros(len(rows), dtype=bool)
            for column in cached:
                missing |= ~column.filled[rows]
            if missing.any():
                self._fill(leaves, cached, rows[missing])
            return {leaf[0]: column.bounds.take(rows) for leaf, column in zip(leaves, cached, strict=True)}

    def _fill(self, leaves: Sequence[StatsLeaf], cached: list[_CachedColumn], rows: np.ndarray) -> None:
        parsed = [parse_stats_of(text, leaves) for text in self.json_at(rows)]
        for (name, _, _), column in zip(leaves, cached, strict=True):
            values = bounds_of([stats_range(stats, name) for stats in parsed])
            for array in _BOUND_ARRAYS:
                getattr(column.bounds, array)[rows] = getattr(values, array)
            column.filled[rows] = True  # last: a row counts as parsed once every array holds it


class StatsByText:
    """Column ranges of the files outside a checkpoint (adds from JSON commits), memoised by stats text.

    Those files change with every update, but a file's stats text never does, and its range for a
    column is a function of the text and the column alone: the memo needs no invalidation, so
    ``FileState.apply`` carries it from state to state. It is only bounded in size.
    """

    MAX_TEXTS_PER_COLUMN = 1 << 16

    def __init__(self) -> None:
        self._ranges: dict[_LeafKey, dict[str | None, StatsRange | None]] = {}
        self._lock = threading.Lock()

    def bounds(self, leaves: Sequence[StatsLeaf], texts: Sequence[str | None]) -> dict[str, ColumnBounds]:
        """Per leaf (by logical name), the bounds of the files with these stats texts, in order."""
        with self._lock:
            memos = []
            for _, path, f in leaves:
                memo = self._ranges.get((path, f.type))
                if memo is None or len(memo) > self.MAX_TEXTS_PER_COLUMN:
                    memo = self._ranges[(path, f.type)] = {}
                memos.append(memo)
            for text in dict.fromkeys(texts):
                if any(text not in memo for memo in memos):
                    stats = parse_stats_of(text, leaves)
                    for (name, _, _), memo in zip(leaves, memos, strict=True):
                        memo[text] = stats_range(stats, name)
            return {name: bounds_of([memo[text] for text in texts])
                    for (name, _, _), memo in zip(leaves, memos, strict=True)}


def bounds_of(ranges: Sequence[StatsRange | None]) -> ColumnBounds:
    """``ColumnBounds`` from per-file ``predicates.StatsRange`` values (``None`` = nothing known)."""
    n = len(ranges)
    lows = [None if r is None else r.low for r in ranges]
    highs = [None if r is None else r.high for r in ranges]
    return ColumnBounds(
        known=np.fromiter((r is not None for r in ranges), dtype=bool, count=n),
        may_null=np.fromiter((r is not None and r.may_null for r in ranges), dtype=bool, count=n),
        may_value=np.fromiter((r is not None and r.may_value for r in ranges), dtype=bool, count=n),
        low=np.fromiter(lows, dtype=object, count=n),
        high=np.fromiter(highs, dtype=object, count=n),
        low_kind=np.fromiter(map(_kind, lows), dtype=np.int8, count=n),
        high_kind=np.fromiter(map(_kind, highs), dtype=np.int8, count=n),
    )


# -- predicates over arrays ----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Truth:
    """Per file, whether the expression may be TRUE, FALSE or NULL on some row (the reference's sets)."""

    t: np.ndarray
    f: np.ndarray
    n: np.ndarray

    @property
    def some(self) -> np.ndarray:
        """Files where the set is not empty (an empty file's comparisons have no value at all)."""
        result: np.ndarray = self.t | self.f | self.n
        return result


def _and(a: _Truth, b: _Truth) -> _Truth:
    """``{predicates._and(x, y) for x in a for y in b}`` per file: FALSE wins, then NULL."""
    return _Truth(t=a.t & b.t, f=(a.f & b.some) | (a.some & b.f), n=(a.n & (b.t | b.n)) | ((a.t | a.n) & b.n))


def _or(a: _Truth, b: _Truth) -> _Truth:
    """``{predicates._or(x, y) for x in a for y in b}`` per file: TRUE wins, then NULL."""
    return _Truth(t=(a.t & b.some) | (a.some & b.t), f=a.f & b.f, n=(a.n & (b.f | b.n)) | ((a.f | a.n) & b.n))


def _not(a: _Truth) -> _Truth:
    return _Truth(t=a.f, f=a.t, n=a.n)


def may_match_mask(expr: Expr, columns: Mapping[str, ColumnBounds], num_files: int) -> np.ndarray:
    """Per file, ``file_may_match(expr, {}, stats)`` for files whose statistics ``columns`` hold.

    ``columns`` maps a column name to its bounds over the files; a column without an entry has no
    statistics in any of them.

    Raises:
        CannotVectorize: a bound and a literal did not compare (the reference keeps such a file,
            deciding file by file, which the caller must then do).
    """
    return _Evaluator(columns, num_files).truth(expr).t


def may_match_conjuncts(
    conjuncts: Sequence[Expr],
    columns: Mapping[str, ColumnBounds],
    num_files: int,
    stats_texts: Callable[[np.ndarray], Sequence[str | None]],
    leaves: Collection[StatsLeaf],
) -> np.ndarray:
    """Per file, ``file_may_match(and_(*conjuncts), {}, parse_stats_of(text, leaves))``.

    A file may match an AND exactly when it may match each part, so each conjunct is judged on
    its own, on the statistics arrays ``columns``; one the arrays cannot answer exactly is
    judged by the per-file reference, from ``stats_texts`` of the files still selected.
    """
    keep = np.ones(num_files, dtype=bool)
    per_file: list[Expr] = []
    for conjunct in conjuncts:
        try:
            keep &= may_match_mask(conjunct, columns, num_files)
        except CannotVectorize:
            per_file.append(conjunct)
    if per_file and keep.any():
        check = and_(*per_file)
        survivors = np.flatnonzero(keep)
        keep[survivors] = [file_may_match(check, {}, parse_stats_of(text, leaves))
                           for text in stats_texts(survivors)]
    return keep


class _Evaluator:
    def __init__(self, columns: Mapping[str, ColumnBounds], num_files: int) -> None:
        self.columns = columns
        self.size = num_files

    def const(self, values: frozenset[bool | None]) -> _Truth:
        return _Truth(*(np.full(self.size, v in values, dtype=bool) for v in (True, False, None)))

    def truth(self, expr: Expr) -> _Truth:
        """``predicates._possible(expr, {}, stats)`` for every file at once."""
        if isinstance(expr, Literal):
            if expr.value is None or isinstance(expr.value, bool):
                return self.const(frozenset({expr.value}))
            return self.const(frozenset({True, False, None}))
        if isinstance(expr, Comparison):
            return self.comparison(expr)
        if isinstance(expr, In):
            return self.truth(_in_as_or(expr))
        if isinstance(expr, IsNull):
            return self.is_null(expr)
        if isinstance(expr, And):
            return _and(self.truth(expr.left), self.truth(expr.right))
        if isinstance(expr, Or):
            return _or(self.truth(expr.left), self.truth(expr.right))
        if isinstance(expr, Not):
            return _not(self.truth(expr.child))
        # A column without partition values (``file_may_match`` gets none here), or an Unknown.
        return self.const(frozenset({True, False, None}))

    def is_null(self, expr: IsNull) -> _Truth:
        value = expr.value
        if isinstance(value, Literal):
            is_null = value.value is None
            return self.const(frozenset({(not is_null) if expr.negated else is_null}))
        if not isinstance(value, Column) or value.name not in self.columns:
            return self.const(frozenset({True, False}))
        bounds = self.columns[value.name]
        unknown = ~bounds.known
        yes, no = (bounds.may_value, bounds.may_null) if expr.negated else (bounds.may_null, bounds.may_value)
        return _Truth(t=unknown | yes, f=unknown | no, n=np.zeros(self.size, dtype=bool))

    def comparison(self, expr: Comparison) -> _Truth:
        left, right, op = expr.left, expr.right, expr.op
        if isinstance(left, Literal) and isinstance(right, Literal):
            try:
                return self.const(frozenset({_compare_values(op, left.value, right.value)}))
            except TypeError as exc:  # the reference raises it too, for every file it judges
                raise CannotVectorize(str(exc)) from exc
        if isinstance(right, Column) and isinstance(left, Literal):
            left, right, op = right, left, _FLIP[op]
        if not (isinstance(left, Column) and isinstance(right, Literal)):
            return self.const(frozenset({True, False, None}))  # column against column, or unknown
        bounds = self.columns.get(left.name)
        if bounds is None:
            return self.const(frozenset({True, False, None}))
        unknown = ~bounds.known
        literal = right.value
        none = np.zeros(self.size, dtype=bool)
        if literal is None:
            if op == "<=>":
                t, f, n = bounds.may_null, bounds.may_value, none
            else:
                t, f, n = none, none, bounds.may_null | bounds.may_value
        else:
            t = bounds.may_value & _range_may_satisfy(op, bounds, literal)
            if op == "<=>":
                f, n = bounds.may_value | bounds.may_null, none
            else:
                f, n = bounds.may_value, bounds.may_null
        return _Truth(t=unknown | t, f=unknown | f, n=unknown | n)


def _range_may_satisfy(op: ComparisonOp, bounds: ColumnBounds, literal: Any) -> np.ndarray:
    """``predicates._range_may_satisfy`` per file, for a literal that is not ``None``.

    The reference compares order keys: ``(0, v)`` for a number, the value itself otherwise (bounds
    are never NaN: ``stats_range`` drops them). Between two numbers or two non-numbers, comparing
    keys is comparing values; between a number and anything else the keys never order, so such a
    file is left to the reference.
    """
    size = len(bounds.known)
    if _is_nan(literal):
        return np.ones(size, dtype=bool)
    kind = _kind(literal)
    key = np.empty((), dtype=object)
    key[()] = literal  # assigned, not passed to np.array, which would turn bytes or str into its own types

    def where(kinds: tuple[np.ndarray, ...], compare: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """``compare`` on the files where all these bounds are present; elsewhere false."""
        out = np.zeros(size, dtype=bool)
        rows = np.flatnonzero(np.logical_and.reduce([k != _OPEN for k in kinds]))
        if len(rows):
            if any((k[rows] != kind).any() for k in kinds):
                raise CannotVectorize("bounds and the literal are not all numbers, or all non-numbers")
            try:
                out[rows] = compare(rows)
            except TypeError as exc:
                raise CannotVectorize(str(exc)) from exc
        return out

    low, high = bounds.low, bounds.high
    no_low, no_high = bounds.low_kind == _OPEN, bounds.high_kind == _OPEN
    lows, highs = (bounds.low_kind,), (bounds.high_kind,)
    result: np.ndarray
    if op in ("=", "<=>"):
        result = (no_low | where(lows, lambda r: np.less_equal(low[r], key))) & (
            no_high | where(highs, lambda r: np.less_equal(key, high[r])))
    elif op == "!=":
        result = ~where(lows + highs, lambda r: np.equal(low[r], high[r]) & np.equal(high[r], key))
    elif op == "<":
        result = no_low | where(lows, lambda r: np.less(low[r], key))
    elif op == "<=":
        result = no_low | where(lows, lambda r: np.less_equal(low[r], key))
    elif op == ">":
        result = no_high | where(highs, lambda r: np.greater(high[r], key))
    else:
        result = no_high | where(highs, lambda r: np.greater_equal(high[r], key))
    return result
