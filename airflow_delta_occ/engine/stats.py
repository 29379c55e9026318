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
from collections.abc import Mapping
from typing import Any

from .predicates import ColumnStats, FileStats
from .schema import StructField, StructType
from .values import is_comparable, parse_stat_value

STRING_PREFIX_LENGTH = 32
_MILLISECOND_SLACK = dt.timedelta(microseconds=999)


def parse_file_stats(stats_json: str | None, schema: StructType) -> FileStats | None:
    """Typed stats of one file, or ``None`` when the file has none (or they are not valid JSON)."""
    if not stats_json:
        return None
    try:
        raw = json.loads(stats_json)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    num_records = raw.get("numRecords")
    columns: dict[str, ColumnStats] = {}
    _collect(
        schema,
        _dict(raw.get("minValues")),
        _dict(raw.get("maxValues")),
        _dict(raw.get("nullCount")),
        "",
        columns,
    )
    return FileStats(num_records=num_records if _is_count(num_records) else None, columns=columns)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _collect(
    struct: StructType,
    mins: Mapping[str, Any],
    maxs: Mapping[str, Any],
    nulls: Mapping[str, Any],
    prefix: str,
    out: dict[str, ColumnStats],
) -> None:
    for f in struct.fields:
        physical = f.physical_name
        name = f"{prefix}{f.name}"
        if isinstance(f.type, StructType):
            _collect(f.type, _dict(mins.get(physical)), _dict(maxs.get(physical)),
                     _dict(nulls.get(physical)), name + ".", out)
            continue
        null_count = nulls.get(physical)
        out[name] = ColumnStats(
            min=_bound(mins.get(physical), f, upper=False),
            max=_bound(maxs.get(physical), f, upper=True),
            null_count=null_count if _is_count(null_count) else None,
        )


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
