"""The vectorised ``files_matching`` against the per-file reference it replaces, and its caches.

``predicates.file_may_match`` with ``stats.parse_file_stats`` stays the semantic reference: these
properties draw statistics the way writers get them wrong (missing, unparseable, NaN, nulls,
truncated strings, out-of-range numbers, wrong JSON types) and predicates of every shape, and
require the arrays to give the same answer for every file. End to end, ``Snapshot.files_matching``
must select exactly the files, in the same order, that the reference selects from
``Snapshot.files()``, before and after ``update()``, with the caches warm.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import tempfile
from decimal import Decimal
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_delta_occ.engine import DeltaLog, LogCorruptError, stats_columns
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
    has_unknown,
    references,
    split_conjuncts,
)
from airflow_delta_occ.engine.predicates import bind, file_may_match, parse_predicate
from airflow_delta_occ.engine.schema import parse_schema
from airflow_delta_occ.engine.snapshot import Snapshot
from airflow_delta_occ.engine.stats import parse_file_stats, stats_leaves
from airflow_delta_occ.engine.stats_columns import CannotVectorize, StatsByText, StatsColumns, may_match_mask

from .logbuilder import LogBuilder, commit_info, metadata, protocol, remove

pytestmark = pytest.mark.unit

SCHEMA_JSON: dict[str, Any] = {"type": "struct", "fields": [
    {"name": "p", "type": "string", "nullable": True, "metadata": {}},
    {"name": "q", "type": "date", "nullable": True, "metadata": {}},
    # Statistics live under the physical name: the arrays must read the same key as the reference.
    {"name": "i", "type": "long", "nullable": True, "metadata": {"delta.columnMapping.physicalName": "col-i"}},
    {"name": "d", "type": "double", "nullable": True, "metadata": {}},
    {"name": "s", "type": "string", "nullable": True, "metadata": {}},
    {"name": "dt", "type": "date", "nullable": True, "metadata": {}},
    {"name": "ts", "type": "timestamp", "nullable": True, "metadata": {}},
    {"name": "ntz", "type": "timestamp_ntz", "nullable": True, "metadata": {}},
    {"name": "dec", "type": "decimal(5,2)", "nullable": True, "metadata": {}},
    {"name": "b", "type": "boolean", "nullable": True, "metadata": {}},
    {"name": "bin", "type": "binary", "nullable": True, "metadata": {}},
    {"name": "st", "type": {"type": "struct", "fields": [
        {"name": "x", "type": "integer", "nullable": True, "metadata": {}}]}, "nullable": True, "metadata": {}},
    {"name": "arr", "type": {"type": "array", "elementType": "string", "containsNull": True},
     "nullable": True, "metadata": {}},
]}
SCHEMA = parse_schema(json.dumps(SCHEMA_JSON))
LEAVES = stats_leaves(SCHEMA)

# -- statistics as writers produce them (and get them wrong), predicates of every shape -----------------

_LONG_STRINGS = ["a" * 31, "a" * 32, "a" * 33, "b" * 32]
_DATES = [dt.date(2024, 1, d) for d in (1, 2, 3)]
_TS = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
_NTZ = dt.datetime(2024, 1, 1)
_STEPS = [dt.timedelta(0), dt.timedelta(milliseconds=1), dt.timedelta(hours=1)]
#: Per column: statistics as JSON values (the usual ones, then broken or edge ones) and predicate
#: literals (the usual ones, drawn from the same values so that bounds meet literals, then edge ones).
COLUMNS: dict[str, tuple[list[Any], list[Any], list[Any], list[Any]]] = {
    "p": (["x", "y", "z"], [3], ["x", "y", "z"], [""]),
    "q": (["2024-01-01", "2024-01-02", "2024-01-03"], ["bad"], _DATES, []),
    "i": ([-2, -1, 0, 1, 2], [2**63 - 1, 2**70, 1.5, -0.5, "2", "x", True], [-2, -1, 0, 1, 2],
          [2**63 - 1, -(2**63)]),
    "d": ([-1.5, -0.0, 0.0, 1.0, 2.5], ["NaN", "Infinity", "-Infinity", "1.0", 3, 1e308, "x", False],
          [-1.5, -0.0, 0.0, 1.0, 2.5], [math.nan, math.inf, -math.inf]),
    "s": (["", "a", "ab", "b", "z"], ["é", "\ud800", 5, *_LONG_STRINGS], ["", "a", "ab", "b", "z"],
          ["é", "\ud800", *_LONG_STRINGS]),
    "dt": (["2024-01-01", "2024-01-02", "2024-01-03"], [" 2024-01-02", "bad", 20240101], _DATES, []),
    "ts": (["2024-01-01T00:00:00.000Z", "2024-01-01T00:00:00.001Z", "2024-01-01T01:00:00.000Z"],
           ["2024-01-01T01:00:00.000+01:00", "2024-01-01 00:00:00", "2024-01-01", "9999-12-31T23:59:59.999999Z",
            "bad", 0],
           [_TS + step for step in _STEPS],
           [_TS + dt.timedelta(microseconds=500), dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)]),
    "ntz": (["2024-01-01T00:00:00.000", "2024-01-01T00:00:00.001", "2024-01-01T01:00:00.000"],
            ["2024-01-01T00:00:00Z", "bad"], [_NTZ + step for step in _STEPS], [_NTZ + dt.timedelta(microseconds=999)]),
    "dec": ([-2, 0, "1.25", 1.5], [1.234, "x", 12345.67, "NaN", "999.99"],
            [Decimal("-2"), Decimal("0"), Decimal("1.25"), Decimal("1.5")], [Decimal("999.99")]),
    "b": ([True, False], ["true", "FALSE", 1, "x"], [True, False], []),
    "bin": (["", "a", "ab", "b"], [1], [b"", b"a", b"ab", b"b"], []),
    "st.x": ([-2, -1, 0, 1, 2], ["x", 2**40], [-2, -1, 0, 1, 2], []),
}
#: Where the statistics of a column are: ``i`` is mapped to a physical name, ``st.x`` is nested.
PHYSICAL = {name: (name,) for name in COLUMNS} | {"i": ("col-i",), "st.x": ("st", "x")}
_JUNK_TEXTS = ["", "not json", "[1, 2]", "null", "7", '{"numRecords": ']


def _put(target: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        child = target.setdefault(part, {})
        if not isinstance(child, dict):
            return
        target = child
    target[path[-1]] = value


@st.composite
def stat_values(draw: st.DrawFn, column: str) -> Any:
    usual, broken, _, _ = COLUMNS[column]
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return None
    if kind == 1 and broken:
        return draw(st.sampled_from(broken))
    return draw(st.sampled_from(usual))


@st.composite
def stats_texts(draw: st.DrawFn) -> str | None:
    kind = draw(st.integers(0, 30))
    if kind == 0:
        return None  # no statistics
    if kind == 1:
        return draw(st.sampled_from(_JUNK_TEXTS))
    body: dict[str, Any] = {}
    rows = draw(st.sampled_from([1, 2, 3, 4, 3, 0]))
    if draw(st.integers(0, 12)):
        body["numRecords"] = rows if draw(st.integers(0, 12)) else draw(st.sampled_from([-1, True, "2", 1.0, None]))
    for key in ("minValues", "maxValues"):
        if not draw(st.integers(0, 15)):
            body[key] = draw(st.sampled_from([None, [], "x", 1]))
            continue
        bounds: dict[str, Any] = {}
        if not draw(st.integers(0, 10)):
            bounds["st"] = draw(st.sampled_from([3, None, []]))  # a struct's bounds that are not an object
        for column in COLUMNS:
            if draw(st.integers(0, 4)):
                _put(bounds, PHYSICAL[column], draw(stat_values(column)))
        if not draw(st.integers(0, 10)):
            bounds["i"] = draw(stat_values("i"))  # under the logical name: not where they are read
        body[key] = bounds
    if draw(st.integers(0, 8)):
        counts: dict[str, Any] = {}
        for column in COLUMNS:
            if draw(st.integers(0, 4)):
                count = draw(st.integers(0, rows)) if draw(st.integers(0, 12)) else draw(
                    st.sampled_from([-1, True, "1", 1.0, None, 99]))
                _put(counts, PHYSICAL[column], count)
        body["nullCount"] = counts
    return json.dumps(body)


@st.composite
def literals(draw: st.DrawFn, column: str) -> Any:
    _, _, usual, edge = COLUMNS[column]
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return None
    if kind == 1 and edge:
        return draw(st.sampled_from(edge))
    return draw(st.sampled_from(usual))


_COMPARABLE_PAIRS = [("i", "st.x"), ("s", "p"), ("dt", "q"), ("d", "i"), ("ts", "ts")]
_OPS = ["=", "!=", "<", "<=", ">", ">=", "<=>"]


@st.composite
def predicates(draw: st.DrawFn, columns: tuple[str, ...] = tuple(COLUMNS), depth: int = 0) -> Expr:
    if depth < 3 and not draw(st.integers(0, 2)):
        kind = draw(st.sampled_from(["and", "or", "not"]))
        if kind == "not":
            return Not(draw(predicates(columns, depth + 1)))
        left, right = draw(predicates(columns, depth + 1)), draw(predicates(columns, depth + 1))
        return And(left, right) if kind == "and" else Or(left, right)
    kind = draw(st.sampled_from(["cmp"] * 6 + ["in"] * 2 + ["null"] * 2 + ["const", "column", "colcol", "unknown"]))
    if kind == "const":
        return Literal(draw(st.sampled_from([True, False, None])))
    if kind == "column":
        return Column("b") if "b" in columns else Literal(True)
    if kind == "unknown":
        return Unknown("f(x)")
    if kind == "colcol":
        left_name, right_name = draw(st.sampled_from(_COMPARABLE_PAIRS))
        return Comparison(draw(st.sampled_from(_OPS)), Column(left_name), Column(right_name))
    column = draw(st.sampled_from(columns))
    if kind == "cmp":
        op = draw(st.sampled_from(_OPS))
        literal = Literal(draw(literals(column)))
        if draw(st.booleans()):
            return Comparison(op, Column(column), literal)
        return Comparison(op, literal, Column(column))
    if kind == "in":
        options = tuple(Literal(v) for v in draw(st.lists(literals(column), min_size=1, max_size=4)))
        return In(Column(column), options, negated=draw(st.booleans()))
    target: Expr = Column(column) if draw(st.integers(0, 8)) else Literal(draw(st.sampled_from([None, 1])))
    return IsNull(target, negated=draw(st.booleans()))


def _reference(expr: Expr, texts: list[str | None]) -> list[bool] | type[Exception]:
    try:
        return [file_may_match(expr, {}, parse_file_stats(text, SCHEMA)) for text in texts]
    except TypeError:
        return TypeError


def _read(expr: Expr) -> list[Any]:
    return [LEAVES[name] for name in sorted(references(expr) & LEAVES.keys())]


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(predicates(), st.lists(stats_texts(), min_size=1, max_size=12), st.data())
def test_arrays_agree_with_file_may_match(expr: Expr, texts: list[str | None], data: st.DataObject) -> None:
    """Checkpoint arrays (filled in two random steps, as plans fill them) and the commit-add memo."""
    bound = bind(expr, SCHEMA)
    expected = _reference(bound, texts)
    n = len(texts)
    checkpoint = StatsColumns(pa.array(texts, type=pa.string()), n)
    first = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1)))), dtype=np.int64)
    checkpoint.bounds(_read(bound), first)
    rows = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1))), dtype=np.int64)
    by_text = StatsByText()
    by_text.bounds(_read(bound), [texts[i] for i in first])
    for columns in (checkpoint.bounds(_read(bound), rows), by_text.bounds(_read(bound), [texts[i] for i in rows])):
        try:
            got = may_match_mask(bound, columns, len(rows)).tolist()
        except CannotVectorize:
            continue  # judged per file by the reference itself (files_matching's fallback)
        assert expected is not TypeError, "the reference raises here; the arrays must defer to it"
        assert isinstance(expected, list)
        assert got == [expected[i] for i in rows], (bound, [texts[i] for i in rows])


@pytest.mark.parametrize("predicate", [
    "i = 2", "i >= 1 AND i < 3", "i IN (1, 3)", "i NOT IN (1, NULL)", "i IS NULL", "i IS NOT NULL",
    "s > 'ab'", "s <=> NULL", "d = 'NaN'", "d < 1.0 OR dt = DATE'2024-01-02'", "NOT (ts >= TIMESTAMP'2024-01-01')",
    "dec BETWEEN 1 AND 2", "st.x != 2", "bin = X'61'", "b", "ntz < TIMESTAMP_NTZ'2024-01-01 00:00:00'",
])
def test_common_shapes_never_fall_back(predicate: str) -> None:
    """The arrays answer the predicates jobs use without asking the reference file by file."""
    texts = [json.dumps({"numRecords": 3, "minValues": mins, "maxValues": maxs, "nullCount": nulls})
             for mins, maxs, nulls in [
                 ({"col-i": 0, "s": "a", "d": 0.5, "dt": "2024-01-01", "dec": 1.5, "st": {"x": 1}, "bin": "a",
                   "ts": "2024-01-01T00:00:00.000Z", "ntz": "2024-01-01T00:00:00.000", "b": False},
                  {"col-i": 4, "s": "z", "d": 2.5, "dt": "2024-01-03", "dec": 3, "st": {"x": 1}, "bin": "b",
                   "ts": "2024-01-02T00:00:00.000Z", "ntz": "2024-01-02T00:00:00.000", "b": True},
                  {"col-i": 1, "s": 0}),
                 ({}, {}, {}),
             ]] + [None, "x"]
    bound = bind(parse_predicate(predicate), SCHEMA)
    columns = StatsColumns(pa.array(texts, type=pa.string()), len(texts)).bounds(_read(bound), np.arange(len(texts)))
    got = may_match_mask(bound, columns, len(texts)).tolist()
    assert got == _reference(bound, texts)


# -- end to end: files_matching against the reference, checkpoint + commits, before and after update ----

def reference_files_matching(snapshot: Snapshot, expr: Expr) -> list[str]:
    """The files ``files_matching`` selected before it was vectorised, from public APIs only."""
    partition_names = {snapshot.schema.find(name).name for name in snapshot.partition_columns}  # type: ignore[union-attr]
    partition_filters, data_filters = [], []
    for conjunct in split_conjuncts(expr):
        if has_unknown(conjunct):
            continue
        (partition_filters if references(conjunct) <= partition_names else data_filters).append(conjunct)
    partition_filter = and_(*partition_filters)
    data_filter = and_(*data_filters) if data_filters else None
    return [
        add.path for add in snapshot.files()
        if file_may_match(partition_filter, snapshot.partition_values(add), None)
        and (data_filter is None or file_may_match(data_filter, {}, parse_file_stats(add.stats, snapshot.schema)))
    ]


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except LogCorruptError:
        return LogCorruptError
    except TypeError:
        return TypeError


PARTITION_VALUES = st.fixed_dictionaries({
    "p": st.sampled_from(["x", "y", "", None]),
    "q": st.sampled_from(["2024-01-01", "2024-01-02", None]),
})


@st.composite
def file_adds(draw: st.DrawFn, names: list[str]) -> dict[str, Any]:
    partition = draw(PARTITION_VALUES)
    if draw(st.integers(0, 40)) == 0:
        partition["q"] = "bad"  # not a date: an error when a live file holds it
    body: dict[str, Any] = {"path": draw(st.sampled_from(names)), "partitionValues": partition, "size": 1,
                            "modificationTime": 1, "dataChange": True}
    text = draw(stats_texts())
    if text is not None:
        body["stats"] = text
    return {"add": body}


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[list[dict[str, Any]]], bool, list[list[dict[str, Any]]]]:
    """A first commit, later commits (before the snapshot), and commits the update then reads."""
    names = [f"f{i}.parquet" for i in range(draw(st.integers(1, 14)))]
    first = draw(st.lists(file_adds(names), min_size=1, max_size=14))

    def commits() -> st.SearchStrategy[list[list[dict[str, Any]]]]:
        action = st.one_of(file_adds(names), st.sampled_from(names).map(remove))
        return st.lists(st.lists(action, min_size=1, max_size=4), max_size=3)

    return [first, *draw(commits())], draw(st.booleans()), draw(commits())


def _write(root: str, history: list[list[dict[str, Any]]], checkpoint: bool) -> LogBuilder:
    log = LogBuilder(root)
    log.commit(commit_info("CREATE TABLE"), protocol(), metadata(partition_columns=("p", "q"), schema=SCHEMA_JSON),
               *history[0])
    for actions in history[1:]:
        log.commit(commit_info(), *actions)
    if checkpoint:
        log.checkpoint(len(history) - 1)
    return log


def _some_conjuncts_per_file(conjunct: Expr, columns: Any, num_files: int) -> Any:
    """``may_match_mask`` giving up on about half the conjuncts, so the per-file fallback runs too."""
    if len(repr(conjunct)) % 2:
        raise CannotVectorize("forced by the test")
    return may_match_mask(conjunct, columns, num_files)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(histories(), st.lists(predicates(), min_size=1, max_size=4), st.booleans(), st.data())
def test_files_matching_selects_what_the_reference_selects(history: Any, exprs: list[Expr], fallback: bool,
                                                           data: st.DataObject) -> None:
    before, checkpoint, after = history
    exprs = exprs + [And(data.draw(predicates(("p", "q"))), e) for e in exprs]
    mask = _some_conjuncts_per_file if fallback else may_match_mask
    with tempfile.TemporaryDirectory() as root, mock.patch.object(stats_columns, "may_match_mask", mask):
        log = _write(root, before, checkpoint)
        snapshot = DeltaLog.for_table(root).snapshot()
        bound = [snapshot.bind(e) for e in exprs]
        for expr in bound:  # twice: the second time from warm caches
            for _ in range(2):
                assert _outcome(lambda e=expr: [f.path for f in snapshot.files_matching(e)]) == _outcome(
                    lambda e=expr: reference_files_matching(snapshot, e))
        for actions in after:
            log.commit(commit_info(), *actions)
        updated = snapshot.update()
        fresh = DeltaLog.for_table(root).snapshot()
        for expr in bound:
            expected = _outcome(lambda e=expr: reference_files_matching(fresh, e))
            assert _outcome(lambda e=expr: [f.path for f in updated.files_matching(e)]) == expected
            assert _outcome(lambda e=expr: [f.path for f in fresh.files_matching(e)]) == expected


# -- the caches -------------------------------------------------------------------------------------------

def _stats(low: int, high: int) -> str:
    return json.dumps({"numRecords": 10, "minValues": {"col-i": low}, "maxValues": {"col-i": high},
                       "nullCount": {"col-i": 0}})


def _add(path: str, p: str, low: int, high: int) -> dict[str, Any]:
    return {"add": {"path": path, "partitionValues": {"p": p, "q": None}, "size": 1, "modificationTime": 1,
                    "dataChange": True, "stats": _stats(low, high)}}


def test_update_reuses_the_checkpoint_caches_and_parses_only_new_stats(tmp_path: Any, monkeypatch: Any) -> None:
    log = LogBuilder(tmp_path / "t")
    log.commit(commit_info("CREATE TABLE"), protocol(), metadata(partition_columns=("p", "q"), schema=SCHEMA_JSON),
               *(_add(f"c{k}.parquet", "x" if k % 2 else "y", 10 * k, 10 * k + 9) for k in range(20)))
    log.checkpoint(0)
    log.commit(commit_info(), _add("j1.parquet", "x", 41, 45))
    snapshot = DeltaLog.for_table(log.root).snapshot()
    predicate = "p = 'x' AND i >= 40 AND i < 60"
    assert [f.path for f in snapshot.files_matching(predicate)] == ["c5.parquet", "j1.parquet"]

    # A file of the checkpoint is replaced (same path, new stats) and one is added.
    log.commit(commit_info(), remove("c3.parquet"), _add("c5.parquet", "x", 0, 1), _add("j2.parquet", "x", 50, 50))
    updated = snapshot.update()
    assert updated._files.base is snapshot._files.base  # the checkpoint, and everything cached on it
    assert updated._files.extra_stats is snapshot._files.extra_stats
    parsed: list[str | None] = []
    real = stats_columns.parse_stats_of

    def counting(text: str | None, leaves: Any) -> Any:
        parsed.append(text)
        return real(text, leaves)

    monkeypatch.setattr(stats_columns, "parse_stats_of", counting)
    assert [f.path for f in updated.files_matching(predicate)] == ["j1.parquet", "j2.parquet"]
    assert parsed == [_stats(0, 1), _stats(50, 50)]  # the new adds' stats only
    parsed.clear()
    assert [f.path for f in updated.files_matching(predicate)] == ["j1.parquet", "j2.parquet"]
    assert parsed == []
    assert [f.path for f in snapshot.files_matching(predicate)] == ["c5.parquet", "j1.parquet"]  # old view intact


def test_stats_cache_follows_the_physical_name_and_type(tmp_path: Any) -> None:
    """A metadata change that moves a column's statistics is read from the new place after update."""
    def schema(physical: str, data_type: str = "long") -> dict[str, Any]:
        return {"type": "struct", "fields": [
            {"name": "p", "type": "string", "nullable": True, "metadata": {}},
            {"name": "v", "type": data_type, "nullable": True,
             "metadata": {"delta.columnMapping.physicalName": physical}}]}

    stats = json.dumps({"numRecords": 1, "minValues": {"a": 1, "b": 7}, "maxValues": {"a": 1, "b": 7},
                        "nullCount": {"a": 0, "b": 0}})
    log = LogBuilder(tmp_path / "t")
    log.commit(commit_info("CREATE TABLE"), protocol(), metadata(partition_columns=("p",), schema=schema("a")),
               {"add": {"path": "f.parquet", "partitionValues": {"p": "x"}, "size": 1, "modificationTime": 1,
                        "dataChange": True, "stats": stats}})
    log.checkpoint(0)
    snapshot = DeltaLog.for_table(log.root).snapshot()
    assert [f.path for f in snapshot.files_matching("v = 1")] == ["f.parquet"]
    assert snapshot.files_matching("v = 7") == []
    log.commit(commit_info(), metadata(partition_columns=("p",), schema=schema("b")))
    moved = snapshot.update()
    assert moved.files_matching("v = 1") == []
    assert [f.path for f in moved.files_matching("v = 7")] == ["f.parquet"]
    log.commit(commit_info(), metadata(partition_columns=("p",), schema=schema("b", "string")))
    as_text = moved.update()
    # Typed as a string now, the numbers are no bounds at all (not the cached long bounds): kept.
    assert [f.path for f in as_text.files_matching("v = '1'")] == ["f.parquet"]
    assert [f.path for f in as_text.files_matching("v = '7'")] == ["f.parquet"]


def test_invalid_partition_value_is_an_error_only_while_a_live_file_holds_it(tmp_path: Any) -> None:
    log = LogBuilder(tmp_path / "t")
    log.commit(commit_info("CREATE TABLE"), protocol(), metadata(partition_columns=("p", "q"), schema=SCHEMA_JSON),
               {"add": {"path": "bad.parquet", "partitionValues": {"p": "x", "q": "not a date"}, "size": 1,
                        "modificationTime": 1, "dataChange": True}},
               _add("good.parquet", "x", 0, 1))
    log.checkpoint(0)
    snapshot = DeltaLog.for_table(log.root).snapshot()
    with pytest.raises(LogCorruptError, match="not a valid date"):
        snapshot.files_matching("p = 'x'")
    log.commit(commit_info(), remove("bad.parquet"))
    assert [f.path for f in snapshot.update().files_matching("p = 'x'")] == ["good.parquet"]


def test_truth_set_combinators_match_the_reference_exhaustively() -> None:
    """AND, OR, NOT over every pair of truth-value sets, the empty set included (a file of no rows)."""
    from itertools import combinations

    from airflow_delta_occ.engine import predicates
    from airflow_delta_occ.engine.stats_columns import _and, _not, _or, _Truth

    values: list[bool | None] = [True, False, None]
    sets = [frozenset(c) for k in range(4) for c in combinations(values, k)]
    pairs = [(a, b) for a in sets for b in sets]

    def arrays(chosen: list[frozenset[bool | None]]) -> _Truth:
        return _Truth(*(np.array([v in s for s in chosen]) for v in values))

    def as_sets(truth: _Truth) -> list[frozenset[bool | None]]:
        return [frozenset(v for v, arr in zip(values, (truth.t, truth.f, truth.n), strict=True) if arr[i])
                for i in range(len(pairs))]

    left, right = arrays([a for a, _ in pairs]), arrays([b for _, b in pairs])
    assert as_sets(_and(left, right)) == [frozenset(predicates._and(x, y) for x in a for y in b) for a, b in pairs]
    assert as_sets(_or(left, right)) == [frozenset(predicates._or(x, y) for x in a for y in b) for a, b in pairs]
    assert as_sets(_not(left)) == [frozenset(None if x is None else not x for x in a) for a, _ in pairs]


@pytest.mark.parametrize(("low", "high", "literal"), [
    (5, 9, "a"), (1, 2, True), (True, True, 2), (1, 2, Decimal("1")), (Decimal("1"), Decimal("2"), 2),
    (dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 2), dt.datetime(2024, 1, 1, tzinfo=dt.UTC)),
])
@pytest.mark.parametrize("op", ["=", "!=", "<", "<=", ">", ">="])
def test_bounds_the_reference_cannot_order_against_the_literal_are_left_to_it(
        low: Any, high: Any, literal: Any, op: Any) -> None:
    """Unbound literals of another type: the reference keeps files it cannot order (its order keys
    keep numbers apart from booleans and decimals), so the arrays give up or agree, never differ."""
    from airflow_delta_occ.engine.predicates import ColumnStats, FileStats, StatsRange
    from airflow_delta_occ.engine.stats_columns import bounds_of

    expr = Comparison(op, Column("i"), Literal(literal))
    expected = file_may_match(expr, {}, FileStats(1, {"i": ColumnStats(low, high, 0)}))
    try:
        got = may_match_mask(expr, {"i": bounds_of([StatsRange(low, high, False, True)])}, 1).tolist()
    except CannotVectorize:
        return
    assert got == [expected]
