"""Typed values: partition value strings, statistics and predicate literals as comparable Python values.

The log stores partition values as strings and statistics as JSON scalars; predicates arrive as SQL
text. All three must meet as the same Python type per Delta type so that ``date = DATE'2024-01-01'``
compares a ``datetime.date`` with a ``datetime.date``:

==================  ===========================================
Delta type          Python value
==================  ===========================================
string              ``str``
byte/short/int/long ``int``
float/double        ``float``
decimal(p,s)        ``decimal.Decimal`` quantized to scale ``s``
boolean             ``bool``
date                ``datetime.date``
timestamp           aware ``datetime.datetime`` in UTC
timestamp_ntz       naive ``datetime.datetime``
binary              ``bytes``
==================  ===========================================

Timestamp partition values written without an offset are read as UTC (delta-spark writes them in
the session time zone; run writers with ``spark.sql.session.timeZone=UTC`` as the docs advise).
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal, InvalidOperation
from typing import Any

from .errors import InvalidLiteralError
from .schema import INTEGRAL_TYPES, DataType, DecimalType, PrimitiveType

_INTEGRAL_RANGES = {
    "byte": (-(2**7), 2**7 - 1),
    "short": (-(2**15), 2**15 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "long": (-(2**63), 2**63 - 1),
}
_FLOAT_WORDS = {"nan": math.nan, "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf,
                "inf": math.inf, "-inf": -math.inf}

#: Types whose values the engine can order and compare; other columns are never pruned on.
COMPARABLE_TYPES = frozenset(
    {"string", "long", "integer", "short", "byte", "float", "double", "decimal", "boolean", "date",
     "timestamp", "timestamp_ntz", "binary"}
)


def is_comparable(data_type: DataType) -> bool:
    return data_type.name in COMPARABLE_TYPES


def parse_partition_value(raw: str | None, data_type: DataType) -> Any:
    """Convert a serialized partition value; ``None`` and ``""`` both mean NULL (Delta protocol).

    Raises:
        ValueError: the string is not a valid value of ``data_type`` (the caller names the file).
    """
    if raw is None or raw == "":
        return None
    return _from_text(raw, data_type)


def format_partition_value(value: Any, data_type: DataType, column: str | None = None) -> str | None:
    """The string Delta stores for a partition value (the inverse of ``parse_partition_value``).

    Raises:
        InvalidLiteralError: ``value`` is not a valid value of ``data_type``.
    """
    typed = coerce_literal(value, data_type, column)
    if typed is None:
        return None
    if isinstance(typed, bool):
        return "true" if typed else "false"
    if isinstance(typed, dt.datetime):
        if typed.tzinfo is not None:
            typed = typed.astimezone(dt.UTC).replace(tzinfo=None)
        return typed.isoformat(sep=" ", timespec="microseconds" if typed.microsecond else "seconds")
    if isinstance(typed, dt.date):
        return typed.isoformat()
    if isinstance(typed, bytes):
        return typed.decode("latin-1")
    return str(typed)


def parse_stat_value(raw: Any, data_type: DataType) -> Any:
    """Convert a ``minValues``/``maxValues`` entry; returns ``None`` when the stat is unusable.

    NaN is unusable too: it compares false with everything, so as a bound it would prune wrongly.
    """
    value = _stat_value(raw, data_type)
    return None if isinstance(value, float) and math.isnan(value) else value


def _stat_value(raw: Any, data_type: DataType) -> Any:
    if raw is None:
        return None
    try:
        if isinstance(raw, str):
            return _from_text(raw, data_type)
        name = data_type.name
        if isinstance(raw, bool):
            return raw if name == "boolean" else None
        if isinstance(raw, int | float):
            if name in INTEGRAL_TYPES:
                return int(raw)
            if name in ("float", "double"):
                return float(raw)
            if isinstance(data_type, DecimalType):
                return _quantize(Decimal(str(raw)), data_type)
    except (ValueError, ArithmeticError):
        return None
    return None


def coerce_literal(value: Any, data_type: DataType, column: str | None = None) -> Any:
    """Convert a predicate literal to the column's type the way Spark's implicit cast would.

    Raises:
        InvalidLiteralError: the value cannot represent a value of ``data_type``.
    """
    if value is None:
        return None
    name = data_type.name
    try:
        if isinstance(value, str):
            return _from_text(value, data_type, strict_ints=True)
        if isinstance(value, bool):
            if name == "boolean":
                return value
            raise ValueError("boolean literal")
        if name in INTEGRAL_TYPES:
            if isinstance(value, float | Decimal) and value != int(value):
                raise ValueError("fractional value for an integral column")
            if isinstance(value, int | float | Decimal):
                return _check_range(int(value), name)
        elif name in ("float", "double") and isinstance(value, int | float | Decimal):
            return float(value)
        elif isinstance(data_type, DecimalType) and isinstance(value, int | float | Decimal):
            return _quantize(Decimal(str(value)), data_type)
        elif name == "date" and isinstance(value, dt.date) and not isinstance(value, dt.datetime):
            return value
        elif name == "date" and isinstance(value, dt.datetime):
            if value.time() != dt.time(0):
                raise ValueError("datetime with a time part for a date column")
            return value.date()
        elif name == "timestamp" and isinstance(value, dt.datetime):
            return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
        elif name == "timestamp" and isinstance(value, dt.date):
            return dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC)
        elif name == "timestamp_ntz" and isinstance(value, dt.datetime):
            if value.tzinfo is not None:
                raise ValueError("aware datetime for a timestamp_ntz column")
            return value
        elif name == "timestamp_ntz" and isinstance(value, dt.date):
            return dt.datetime(value.year, value.month, value.day)
        elif name == "binary" and isinstance(value, bytes | bytearray):
            return bytes(value)
    except (ValueError, ArithmeticError, InvalidOperation) as exc:
        raise InvalidLiteralError(value, data_type.simple_string(), column) from exc
    raise InvalidLiteralError(value, data_type.simple_string(), column)


def _from_text(text: str, data_type: DataType, *, strict_ints: bool = False) -> Any:
    name = data_type.name
    if name == "string":
        return text
    if name in INTEGRAL_TYPES:
        stripped = text.strip()
        if strict_ints and not stripped.lstrip("+-").isdigit():
            raise ValueError(f"not an integer: {text!r}")
        return _check_range(int(stripped), name)
    if name in ("float", "double"):
        word = _FLOAT_WORDS.get(text.strip().lower())
        return word if word is not None else float(text)
    if isinstance(data_type, DecimalType):
        return _quantize(Decimal(text.strip()), data_type)
    if name == "boolean":
        lowered = text.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        raise ValueError(f"not a boolean: {text!r}")
    if name == "date":
        return dt.date.fromisoformat(text.strip())
    if name == "timestamp":
        parsed = _parse_datetime(text)
        return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)
    if name == "timestamp_ntz":
        parsed = _parse_datetime(text)
        if parsed.tzinfo is not None:
            raise ValueError(f"timestamp_ntz value carries an offset: {text!r}")
        return parsed
    if name == "binary":
        return text.encode("utf-8")
    raise ValueError(f"values of type {data_type.simple_string()} are not supported here")


def _parse_datetime(text: str) -> dt.datetime:
    cleaned = text.strip()
    if cleaned.endswith(("Z", "z")):
        cleaned = cleaned[:-1] + "+00:00"
    if len(cleaned) == 10:  # a bare date is midnight
        return dt.datetime.combine(dt.date.fromisoformat(cleaned), dt.time(0))
    return dt.datetime.fromisoformat(cleaned)


def _check_range(value: int, name: str) -> int:
    low, high = _INTEGRAL_RANGES[name]
    if not low <= value <= high:
        raise ValueError(f"{value} out of range for {name}")
    return value


def _quantize(value: Decimal, data_type: DecimalType) -> Decimal:
    if not value.is_finite():
        raise ValueError("decimal must be finite")
    quantized = value.quantize(Decimal(1).scaleb(-data_type.scale))
    if quantized != value:
        raise ValueError(f"{value} has more than {data_type.scale} decimal places")
    if len(quantized.as_tuple().digits) > data_type.precision and quantized != 0:
        raise ValueError(f"{value} exceeds precision {data_type.precision}")
    return quantized


def primitive(name: str) -> PrimitiveType:
    """Shorthand used by tests and the predicate parser for typed literals."""
    return PrimitiveType(name)
