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

Text is read with the grammar of Spark's ``CAST(text AS type)`` with ANSI on, not with Python's
``int()``, ``Decimal()``, ``float()`` or ``fromisoformat``, which accept underscores, any Unicode digit
or space, ISO basic and week dates: ``'1_0.50'`` or ``'١٢'`` must not become a partition that Spark
would never name. A text the engine accepts means the same value to Spark; a text Spark refuses, the
engine refuses. The engine also refuses a few texts Spark's cast accepts: where the cast gives another
number than the one written (a decimal with more places than the scale, which it rounds; a FLOAT
beyond its range, which becomes infinity or zero), where Spark reads the text otherwise when it
compares it with the column (a decimal in non-ASCII digits: a comparison reads a DOUBLE, which takes
ASCII digits only), where the value is not fixed (a time without a date is today), and time-zone names.
``tests/unit/engine/spark_casts.py`` holds the cases measured on Spark.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import struct
from decimal import Context, Decimal, InvalidOperation, Overflow, localcontext
from typing import Any

from .errors import InvalidLiteralError
from .schema import INTEGRAL_TYPES, DataType, DecimalType, PrimitiveType

_INTEGRAL_RANGES = {
    "byte": (-(2**7), 2**7 - 1),
    "short": (-(2**15), 2**15 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "long": (-(2**63), 2**63 - 1),
}
#: Spark's ``UTF8String.trimAll`` (integral, date and timestamp casts): code points up to U+0020 and DEL.
_TRIM_ALL = "".join(map(chr, range(0x21))) + "\x7f"
#: Java's ``String.trim`` (decimal and floating-point casts): code points up to U+0020, not DEL.
_JAVA_TRIM = "".join(map(chr, range(0x21)))
#: ASCII digits only: ``[0-9]``, never ``\d``, which matches every Unicode digit.
_INTEGRAL_TEXT = re.compile(r"[+-]?[0-9]+")
#: ``java.math.BigDecimal(String)``, restricted to ASCII digits (see the module docstring).
_DECIMAL_TEXT = re.compile(
    r"[+-]?(?:[0-9]+\.?(?P<frac>[0-9]*)|\.(?P<frac2>[0-9]+))(?:[eE](?P<exp>[+-]?[0-9]+))?"
)
#: ``Double.parseDouble``: decimal or hexadecimal (binary exponent required), an optional type suffix.
_FLOAT_TEXT = re.compile(
    r"[+-]?(?:NaN|Infinity"
    r"|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?"
    r"|(?P<hex>0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?)"
)
#: What Spark's cast takes, case-insensitively, when ``Double.parseDouble`` does not.
_FLOAT_WORDS = {"inf": math.inf, "+inf": math.inf, "infinity": math.inf, "+infinity": math.inf,
                "-inf": -math.inf, "-infinity": -math.inf, "nan": math.nan}
#: Spark's ``stringToDate``: year (4 to 7 digits), month, day; after the day a space or ``T`` ends it.
_DATE_TEXT = re.compile(r"\+?(?P<y>[0-9]{4,7})(?:-(?P<m>[0-9]{1,2})(?:-(?P<d>[0-9]{1,2})(?:[ T].*)?)?)?", re.DOTALL)
#: A subset of Spark's ``stringToTimestamp``: no time-zone names, no time without a date, and an
#: offset (``Z``, ``UTC``, ``+h``, ``+hh:mm``, ``+hhmm``) only after the seconds, as Spark requires.
_TIMESTAMP_TEXT = re.compile(
    r"\+?(?P<y>[0-9]{4,7})(?:-(?P<m>[0-9]{1,2})(?:-(?P<d>[0-9]{1,2})"
    r"(?:[ T](?P<H>[0-9]{1,2})(?::(?P<M>[0-9]{1,2})(?::(?P<S>[0-9]{1,2})(?:\.(?P<f>[0-9]*))?"
    r"(?: ?(?P<zone>Z|UTC|(?P<sign>[+-])"
    r"(?:(?P<oh>[0-9]{1,2})(?::(?P<om>[0-9]{2}))?|(?P<oh4>[0-9]{2})(?P<om4>[0-9]{2}))))?"
    r")?)?)?)?)?"
)
#: Room for any Delta decimal (precision up to 38) and its exponent, so no digit is lost on the way.
_DECIMAL_CONTEXT = Context(prec=80, Emax=999_999, Emin=-999_999, traps=[InvalidOperation, Overflow])
_INT32 = 2**31

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
        if isinstance(raw, int | float | Decimal):   # statistics parse JSON fractions as Decimal (exact)
            if name in INTEGRAL_TYPES:   # a bound outside the type (1e400) or with a fraction is no bound
                low, high = _INTEGRAL_RANGES[name]
                return int(raw) if raw == int(raw) and low <= int(raw) <= high else None
            if name in ("float", "double"):
                return float(raw)
            if isinstance(data_type, DecimalType):
                return _quantize(raw if isinstance(raw, Decimal) else Decimal(str(raw)), data_type)
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
            return _from_text(value, data_type)
        if isinstance(value, bool):
            if name == "boolean":
                return value
            raise ValueError(f"a boolean is not a {name}")
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
        raise InvalidLiteralError(value, data_type.simple_string(), column, _reason(exc)) from exc
    raise InvalidLiteralError(value, data_type.simple_string(), column)


def _reason(exc: BaseException) -> str | None:
    """What a failed conversion said, when it says more than that the text did not match a form
    (Python's own word on an impossible day: "day is out of range for month")."""
    text = str(exc).strip()
    return None if not text or text.startswith(("not a ", "not an ", "invalid literal", "could not convert")) else text


def _from_text(text: str, data_type: DataType) -> Any:
    name = data_type.name
    if name == "string":
        return text
    if name in INTEGRAL_TYPES:
        return _check_range(_parse_integral(text), name)
    if name in ("float", "double"):
        value = _parse_double(text)
        return _check_float32(value) if name == "float" else value
    if isinstance(data_type, DecimalType):
        return _quantize(_parse_decimal(text), data_type)
    if name == "boolean":
        lowered = text.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        raise ValueError(f"not a boolean: {text!r}")
    if name == "date":
        return _parse_date(text)
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


def _parse_integral(text: str) -> int:
    """Spark's ANSI cast to an integral type: ASCII digits and a sign; no point, exponent or underscore."""
    trimmed = text.strip(_TRIM_ALL)
    if not _INTEGRAL_TEXT.fullmatch(trimmed):
        raise ValueError(f"not an integer: {text!r}")
    sign = -1 if trimmed[0] == "-" else 1
    digits = trimmed.lstrip("+-").lstrip("0") or "0"
    if len(digits) > 19:  # beyond any long; int() of a huge digit string costs time for nothing
        raise ValueError(f"{text!r} is out of range")
    return sign * int(digits)


def _parse_decimal(text: str) -> Decimal:
    """Spark's cast to a decimal (``BigDecimal`` of the trimmed text), before rounding to the scale."""
    trimmed = text.strip(_JAVA_TRIM)
    m = _DECIMAL_TEXT.fullmatch(trimmed)
    if m is None:
        raise ValueError(f"not a decimal number: {text!r}")
    exponent = int(m.group("exp") or 0)
    scale = len(m.group("frac") or m.group("frac2") or "") - exponent
    if not -_INT32 <= exponent < _INT32 or not -_INT32 <= scale < _INT32:  # BigDecimal's int scale
        raise ValueError(f"the exponent of {text!r} is out of range")
    return Decimal(trimmed)


def _parse_double(text: str) -> float:
    """Spark's cast to DOUBLE: ``Double.parseDouble``, then the words Spark adds (``inf``, ``nan``...)."""
    trimmed = text.strip(_JAVA_TRIM)
    m = _FLOAT_TEXT.fullmatch(trimmed)
    if m is None:
        word = _FLOAT_WORDS.get(trimmed.lower())
        if word is None:
            raise ValueError(f"not a floating-point number: {text!r}")
        return word
    number = trimmed[:-1] if trimmed[-1] in "fFdD" else trimmed
    if m.group("hex") is None:
        value = float(number)
        # One NaN object: literals holding NaN compare equal only by identity (see expr_json's round trip).
        return math.nan if math.isnan(value) else value
    try:
        return float.fromhex(number)
    except OverflowError:  # Java reads a huge binary exponent as infinity
        return -math.inf if number.startswith("-") else math.inf


def _check_float32(value: float) -> float:
    """``value`` if Spark's FLOAT holds about that number; refused if the cast makes it infinite or zero."""
    if not math.isfinite(value) or value == 0:
        return value
    try:
        (single,) = struct.unpack("f", struct.pack("f", value))
    except OverflowError:  # older Pythons refuse to pack what 3.11 packs as infinity
        single = math.inf
    if math.isinf(single):
        raise ValueError(f"{value} is beyond the range of a float")
    if single == 0:
        raise ValueError(f"{value} is too small for a float: it would become 0")
    return value


def _parse_date(text: str) -> dt.date:
    """Spark's cast to DATE (``stringToDate``), for the years Python's dates hold (1 to 9999)."""
    m = _DATE_TEXT.fullmatch(text.strip(_TRIM_ALL))
    if m is None:
        raise ValueError(f"not a date: {text!r}")
    return dt.date(int(m.group("y")), int(m.group("m") or 1), int(m.group("d") or 1))


def _parse_datetime(text: str) -> dt.datetime:
    """A subset of Spark's cast to TIMESTAMP: the forms of ``_TIMESTAMP_TEXT``, fractions truncated to µs."""
    m = _TIMESTAMP_TEXT.fullmatch(text.strip(_TRIM_ALL))
    if m is None:
        raise ValueError(f"not a timestamp: {text!r}")
    micros = int((m.group("f") or "")[:6].ljust(6, "0"))
    tz: dt.tzinfo | None = None
    if m.group("zone") is not None:
        tz = dt.UTC
        if m.group("sign") is not None:
            hours, minutes = int(m.group("oh") or m.group("oh4")), int(m.group("om") or m.group("om4") or 0)
            if minutes > 59 or hours * 60 + minutes > 18 * 60:  # java.time.ZoneOffset's range
                raise ValueError(f"offset out of range: {text!r}")
            offset = dt.timedelta(hours=hours, minutes=minutes)
            tz = dt.timezone(-offset if m.group("sign") == "-" else offset)
    return dt.datetime(int(m.group("y")), int(m.group("m") or 1), int(m.group("d") or 1), int(m.group("H") or 0),
                       int(m.group("M") or 0), int(m.group("S") or 0), micros, tzinfo=tz)


def _check_range(value: int, name: str) -> int:
    low, high = _INTEGRAL_RANGES[name]
    if not low <= value <= high:
        raise ValueError(f"{value} out of range for {name}")
    return value


def _quantize(value: Decimal, data_type: DecimalType) -> Decimal:
    """``value`` at the column's scale; refused if that loses a digit (Spark's cast would round) or overflows.

    Zero is always positive: a Spark decimal has no negative zero, and ``-0.00`` would be stored as another
    partition value than ``0.00``.
    """
    if not value.is_finite():
        raise ValueError("decimal must be finite")
    if value != 0 and value.adjusted() >= data_type.precision - data_type.scale:
        raise ValueError(f"{value} exceeds precision {data_type.precision}")
    with localcontext(_DECIMAL_CONTEXT):
        quantized = value.quantize(Decimal(1).scaleb(-data_type.scale))
        if quantized != value:
            raise ValueError(f"{value} has more than {data_type.scale} decimal places")
        return quantized.copy_abs() if quantized == 0 else quantized


def primitive(name: str) -> PrimitiveType:
    """Shorthand used by tests and the predicate parser for typed literals."""
    return PrimitiveType(name)
