"""File statistics (``add.stats``) as typed, *safe* bounds for data skipping.

Writers store bounds that are not always exact, and a wrong bound would drop a file a job really
reads. So the parser widens or forgets bounds it cannot trust:

- strings: delta-spark truncates min/max to a prefix (32 characters by default). A truncated min is
  still a lower bound; a max of that length or longer may be a truncated prefix, so it is dropped.
- timestamps: bounds are written with millisecond precision, so the max is widened by 999 µs.
- unparseable, missing or NaN values, and stats that are not a JSON object (or nest too deeply to
  decode), become "unknown", which never prunes.
Statistics are keyed by *physical* column names (column mapping); the result uses logical names,
with nested struct leaves as dotted paths.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from .predicates import ColumnStats, FileStats
from .schema import StructField, StructType
from .values import is_comparable, parse_stat_value

STRING_PREFIX_LENGTH = 32
_MILLISECOND_SLACK = dt.timedelta(microseconds=999)


#: A statistics leaf: its logical dotted name, its physical path in the stats JSON and its field.
StatsLeaf = tuple[str, tuple[str, ...], StructField]


def stats_leaves(schema: StructType) -> dict[str, StatsLeaf]:
    """Every primitive column statistics can describe, by logical dotted name, in schema order.

    Shared by ``parse_file_stats`` and the vectorised skipping in ``stats_columns`` so that both read
    exactly the same JSON path for a column. A later field with the same dotted name as an earlier
    one (a top-level ``a.b`` next to struct ``a`` with field ``b``) replaces it, in both.
    """
    out: dict[str, StatsLeaf] = {}
    _collect_leaves(schema, "", (), out)
    return out


def _collect_leaves(struct: StructType, prefix: str, path: tuple[str, ...], out: dict[str, StatsLeaf]) -> None:
    for f in struct.fields:
        name = f"{prefix}{f.name}"
        physical = (*path, f.physical_name)
        if isinstance(f.type, StructType):
            _collect_leaves(f.type, name + ".", physical, out)
        else:
            out[name] = (name, physical, f)


def parse_file_stats(stats_json: str | None, schema: StructType) -> FileStats | None:
    """Typed stats of one file, or ``None`` when the file has none (or they are not valid JSON)."""
    return parse_stats_of(stats_json, stats_leaves(schema).values())


def parse_stats_of(stats_json: str | None, leaves: Iterable[StatsLeaf]) -> FileStats | None:
    """``parse_file_stats`` restricted to ``leaves``: callers that need a few columns of many files
    skip the work for the others; each column comes out exactly as the full parse gives it."""
    if not stats_json:
        return None
    try:
        raw = json.loads(stats_json, parse_float=Decimal)   # a DECIMAL bound is written exactly: keep every digit
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    num_records = raw.get("numRecords")
    mins, maxs, nulls = _dict(raw.get("minValues")), _dict(raw.get("maxValues")), _dict(raw.get("nullCount"))
    columns: dict[str, ColumnStats] = {}
    for name, path, f in leaves:
        physical = path[-1]
        leaf_mins, leaf_maxs, leaf_nulls = mins, maxs, nulls
        for parent in path[:-1]:
            leaf_mins = _dict(leaf_mins.get(parent))
            leaf_maxs = _dict(leaf_maxs.get(parent))
            leaf_nulls = _dict(leaf_nulls.get(parent))
        null_count = leaf_nulls.get(physical)
        columns[name] = ColumnStats(
            min=_bound(leaf_mins.get(physical), f, upper=False),
            max=_bound(leaf_maxs.get(physical), f, upper=True),
            null_count=null_count if _is_count(null_count) else None,
        )
    return FileStats(num_records=num_records if _is_count(num_records) else None, columns=columns)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _bound(raw: Any, f: StructField, *, upper: bool) -> Any:
    if raw is None or not is_comparable(f.type):
        return None
    value = parse_stat_value(raw, f.type)
    if value is None:
        return None
    if upper and isinstance(value, str) and len(value) >= STRING_PREFIX_LENGTH:
        return None
    if upper and isinstance(value, dt.datetime):
        try:
            return value + _MILLISECOND_SLACK
        except OverflowError:  # the largest datetime: no bound above it to widen to
            return None
    return value
