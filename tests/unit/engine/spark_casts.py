"""What Spark's ``CAST('text' AS type)`` accepts, measured on Spark 4.2 with ANSI on, and what the engine does.

``coerce_literal`` (a predicate literal, a ``partitions=`` value) and ``parse_partition_value`` (a
partition value in the log) turn text into a column's value. Every text the engine accepts, Spark's
cast accepts too, with the same value; every text Spark refuses (NULL from ``try_cast``, an error
with ANSI on), the engine refuses. Python's ``int()``, ``Decimal()``, ``float()`` and
``fromisoformat`` are more lenient (underscores, any Unicode digit or space, ISO basic and week
dates), which is why the engine parses with Spark's grammar instead.

The engine refuses a few texts that Spark's cast accepts (``SPARK_ONLY``), each for a stated reason:
mostly because Spark reads the same text as another number when it compares it with the column (a
string compared with a decimal or a float column is read as a DOUBLE, so ``'1.234'`` never equals the
1.23 the cast rounds to), or because the value is outside what Python's date types hold.

``tests/spark/test_literal_casts.py`` runs this table through Spark's cast to keep it true.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from decimal import Decimal
from typing import Any, NamedTuple

from airflow_delta_occ.engine.schema import DataType, DecimalType, PrimitiveType


class Refused:
    """Both refuse: Spark's cast gives NULL (an error with ANSI on), the engine ``InvalidLiteralError``."""

    def __repr__(self) -> str:
        return "REFUSED"


REFUSED: Any = Refused()


class SparkOnly(NamedTuple):
    """Spark's cast accepts the text, the engine refuses it on purpose."""

    why: str


class Case(NamedTuple):
    spark_type: str
    text: str
    expected: Any  # the engine's value, REFUSED, or SparkOnly


# Non-ASCII text is escaped: \u0661\u0662 is 12 in Arabic-Indic digits, \uff11\uff12 in full-width ones,
# \u0967\u0968.\u096b is 12.5 in Devanagari, \U0001d7cf\U0001d7d0 12 in mathematical bold (not a decimal digit).
UTC = dt.UTC
D = Decimal
ROUNDS = SparkOnly("the cast rounds; compared with the column, Spark reads the text as a DOUBLE and keeps every digit")
UNICODE_DIGITS = SparkOnly("the decimal cast reads any Unicode digit; compared with the column, Spark reads a "
                           "DOUBLE, which takes ASCII digits only")
FLOAT_RANGE = SparkOnly("beyond FLOAT's range the cast gives infinity or zero, another number than the one written")
OUT_OF_RANGE = SparkOnly("a year outside 1..9999, which Python's date types cannot hold")
ZONE_NAMES = SparkOnly("time-zone names and second-precision offsets are outside the engine's subset")
NO_DATE = SparkOnly("a time without a date is today's date in Spark: not a fixed value")
NTZ_ZONE = SparkOnly("Spark drops the offset of a TIMESTAMP_NTZ text; the engine refuses text that names one")


def _ts(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def _cases(spark_type: str, table: dict[str, Any]) -> list[Case]:
    return [Case(spark_type, text, expected) for text, expected in table.items()]


_INTEGRAL_COMMON: dict[str, Any] = {
    "12": 12, "+12": 12, "-12": -12, "0012": 12, "-0": 0, "+0": 0, "0" * 30 + "7": 7,
    # Spark trims code points up to U+0020 and DEL (UTF8String.trimAll), nothing else.
    " 12": 12, "12 ": 12, "\t12\n": 12, "\r\n12\x0b\x0c": 12, "\x0012": 12, "\x1f12": 12, "12\x7f": 12,
    "\x7f12": 12, "\xa012": REFUSED, "\u300012": REFUSED, "\u200212": REFUSED, "\u200b12": REFUSED,
    "\x8512": REFUSED, "\u202812": REFUSED,
    "1_000": REFUSED, "1_2": REFUSED, "\u0661\u0662": REFUSED, "\u0661": REFUSED, "\uff11\uff12": REFUSED,
    "1,000": REFUSED,
    # With ANSI on, an integral cast takes no decimal point, not even ".0" (ANSI off truncates to 12).
    "12.0": REFUSED, "12.5": REFUSED, "12.": REFUSED, ".5": REFUSED, "1e2": REFUSED, "1.5e1": REFUSED,
    "0x10": REFUSED, "": REFUSED, " ": REFUSED, "+": REFUSED, "-": REFUSED, "--1": REFUSED, "+-1": REFUSED,
    "1 2": REFUSED, "+ 1": REFUSED, "12L": REFUSED, "12l": REFUSED, "12d": REFUSED, "NaN": REFUSED,
    "Infinity": REFUSED,
}

_DOUBLE_COMMON: dict[str, Any] = {
    "1.5": 1.5, "+1.5": 1.5, "-12": -12.0, "-0": -0.0, ".5": 0.5, "5.": 5.0, "1.e1": 10.0, "00001.5": 1.5,
    "1e5": 1e5, "1E5": 1e5, "1e+5": 1e5, "1.5e-3": 0.0015, "+.5e1": 5.0, "1.5e0010": 1.5e10,
    # Java's Double.parseDouble: a type suffix, hexadecimal with a binary exponent.
    "1.5d": 1.5, "1.5f": 1.5, "1.5D": 1.5, "1.5F": 1.5, "1.5E+3D": 1500.0,
    "0x1p3": 8.0, "0X1P3": 8.0, "0x1.8p1": 3.0, "0x1.8P+1": 3.0, "0x.8p1": 1.0, "0X1.P1": 2.0, "-0x1p3": -8.0,
    "0x1p3d": 8.0, "0x1p3f": 8.0,
    # Java's String.trim: code points up to U+0020, not DEL.
    " 1.5 ": 1.5, "\t1.5\n": 1.5, "\x0012": 12.0, "\x1f12": 12.0, "1.5\x00": 1.5, "12\x7f": REFUSED,
    "\x7f1.5": REFUSED, "\xa012": REFUSED, "\u200212": REFUSED, "\x8512": REFUSED,
    "NaN": math.nan, "nan": math.nan, "NAN": math.nan, " NaN ": math.nan, "+NaN": math.nan, "-NaN": math.nan,
    "nan\x00": math.nan, "\x00nan": math.nan, "Infinity": math.inf, "+Infinity": math.inf, "infinity": math.inf,
    "INFINITY": math.inf, "inf": math.inf, "+inf": math.inf, "INF": math.inf, "Inf": math.inf,
    "\tinf\n": math.inf, "Infinity\x00": math.inf, "-inf": -math.inf, "-Infinity": -math.inf,
    "-INF": -math.inf,
    "1_0.5": REFUSED, "1_5": REFUSED, "\u0661\u0662": REFUSED, "\u0661.5": REFUSED, "\uff11\uff12": REFUSED,
    "1,5": REFUSED,
    "": REFUSED, ".": REFUSED, ".e1": REFUSED, "e5": REFUSED, "1.5e": REFUSED, "1.5e+": REFUSED,
    "--1.5": REFUSED, "+ 1": REFUSED, "1.5L": REFUSED, "0x10": REFUSED, "0x1p": REFUSED, "0x.p1": REFUSED,
    "1d5": REFUSED, "1.5 d": REFUSED, "Infinityx": REFUSED, "NaNd": REFUSED, "Infinityd": REFUSED,
    "infd": REFUSED, "in f": REFUSED, "- inf": REFUSED, "+-nan": REFUSED, " -nan": REFUSED, "-nan": REFUSED,
    "+nan": REFUSED, "inf\x7f": REFUSED,
}

CASES: list[Case] = [
    *_cases("INT", _INTEGRAL_COMMON | {
        "2147483647": 2147483647, "2147483648": REFUSED, "-2147483648": -2147483648, "-2147483649": REFUSED,
    }),
    *_cases("BIGINT", _INTEGRAL_COMMON | {
        "9223372036854775807": 2**63 - 1, "9223372036854775808": REFUSED, "-9223372036854775808": -(2**63),
        "-9223372036854775809": REFUSED, "1" + "0" * 30: REFUSED,
    }),
    *_cases("SMALLINT", {"12": 12, " -12 ": -12, "32767": 32767, "32768": REFUSED, "-32768": -32768,
                         "-32769": REFUSED, "1_0": REFUSED, "\u0661\u0662": REFUSED, "12.0": REFUSED}),
    *_cases("TINYINT", {"12": 12, "\t-12\n": -12, "127": 127, "128": REFUSED, "-128": -128, "-129": REFUSED,
                        "1_0": REFUSED, "\u0661\u0662": REFUSED, "12.0": REFUSED}),
    *_cases("DECIMAL(10,2)", {
        "10.50": D("10.50"), "12": D("12.00"), "+12": D("12.00"), "-12": D("-12.00"), "1.2300": D("1.23"),
        "00012.50": D("12.50"), "-0": D("0.00"), "-0.00": D("0.00"), "0.": D("0.00"), ".5": D("0.50"),
        "5.": D("5.00"), "+.5": D("0.50"), "-.5": D("-0.50"), "1e2": D("100.00"), "1E-2": D("0.01"),
        "1e+2": D("100.00"), "0e5": D("0.00"), "-0E+20": D("0.00"), "1.2e-1": D("0.12"),
        "12345678.99": D("12345678.99"),
        " 12 ": D("12.00"), "\t12\n": D("12.00"), "\x0012": D("12.00"), "12\x00": D("12.00"), "\x1f12": D("12.00"),
        "12\x7f": REFUSED, "\x7f12": REFUSED, "\xa012": REFUSED, "\u200212": REFUSED, "\x8512": REFUSED,
        "1_0.50": REFUSED, "1_000": REFUSED, "1,5": REFUSED, "1.2.3": REFUSED, "0x1": REFUSED, "1.5d": REFUSED,
        "1.5f": REFUSED, "1.5L": REFUSED, "NaN": REFUSED, "Infinity": REFUSED, "": REFUSED, ".": REFUSED,
        "-.": REFUSED, " . ": REFUSED, "e2": REFUSED, "1e": REFUSED, "1e2.5": REFUSED, "1E+-2": REFUSED,
        "+-1": REFUSED, "--1": REFUSED, "1 .5": REFUSED, "1. 5": REFUSED, "\U0001d7cf\U0001d7d0": REFUSED,
        "123456789.99": REFUSED, "99999999.995": REFUSED, "-99999999.995": REFUSED, "1e8": REFUSED,
        "1E+8": REFUSED, "1e400": REFUSED, "1e9999999999": REFUSED, "1e-9999999999": REFUSED,
        "0e-9999999999": REFUSED,
        "1.234": ROUNDS, "1.235": ROUNDS, "-1.235": ROUNDS, "1.005": ROUNDS, "99999999.994": ROUNDS,
        "1e-3": ROUNDS, "1e-400": ROUNDS,
        "\u0661\u0662.5": UNICODE_DIGITS, "\uff11\uff12.5": UNICODE_DIGITS, "\u0967\u0968.\u096b": UNICODE_DIGITS,
        "1.\u0665": UNICODE_DIGITS,
        "1e\u0662": UNICODE_DIGITS,
    }),
    *_cases("DECIMAL(4,0)", {"12": D("12"), "12.0": D("12"), "9999": D("9999"), "-9999": D("-9999"),
                             "1e3": D("1000"), "10000": REFUSED, "1_2": REFUSED,
                             "10.50": ROUNDS, ".5": ROUNDS, "-.5": ROUNDS}),
    *_cases("DECIMAL(38,0)", {"9" * 38: D("9" * 38), "-" + "9" * 38: D("-" + "9" * 38), "1e37": D(10**37),
                              "1" + "0" * 38: REFUSED, "1e38": REFUSED, "9" * 38 + ".5": REFUSED}),
    *_cases("DECIMAL(38,10)", {"1234567890123456789012345678.1234567890":
                               D("1234567890123456789012345678.1234567890")}),
    *_cases("DOUBLE", _DOUBLE_COMMON | {
        "1e308": 1e308, "1e309": math.inf, "-1e309": -math.inf, "1e-400": 0.0, "1e99999999999": math.inf,
        "1e-99999999999": 0.0, "0x1P-1074": 5e-324, "0x1p99999": math.inf, "3.5e38": 3.5e38,
        "12345678901234567890": 1.2345678901234567e19,
    }),
    # FLOAT: the engine keeps the double; Spark's float is that double rounded to 32 bits.
    *_cases("FLOAT", _DOUBLE_COMMON | {
        "0.1": 0.1, "3.4028235e38": 3.4028235e38, "1e-45": 1e-45, "7.1e-46": 7.1e-46, "1e309": math.inf,
        "3.5e38": FLOAT_RANGE, "3.4028236e38": FLOAT_RANGE, "1e39": FLOAT_RANGE, "-1e39": FLOAT_RANGE,
        "1e308": FLOAT_RANGE, "7e-46": FLOAT_RANGE, "-1e-46": FLOAT_RANGE,
    }),
    *_cases("DATE", {
        "2024-01-01": dt.date(2024, 1, 1), "2024-1-1": dt.date(2024, 1, 1), "2024-01": dt.date(2024, 1, 1),
        "2024": dt.date(2024, 1, 1), "2024-01-1": dt.date(2024, 1, 1), "+2024-01-01": dt.date(2024, 1, 1),
        "02024-01-01": dt.date(2024, 1, 1), "+02024-01-01": dt.date(2024, 1, 1), "2024-02-29": dt.date(2024, 2, 29),
        "0001-01-01": dt.date(1, 1, 1), "9999-12-31": dt.date(9999, 12, 31),
        " 2024-01-01 ": dt.date(2024, 1, 1), "\t2024-01-01\n": dt.date(2024, 1, 1), "2024 ": dt.date(2024, 1, 1),
        "2024-01-01\x7f": dt.date(2024, 1, 1), "2024-1-01 ": dt.date(2024, 1, 1),
        # After the day, a space or a T ends the date: Spark ignores what follows.
        "2024-01-01 10:00": dt.date(2024, 1, 1), "2024-01-01T10:00:00": dt.date(2024, 1, 1),
        "2024-01-01T10:00:00Z": dt.date(2024, 1, 1), "2024-01-01 garbage": dt.date(2024, 1, 1),
        "2024-01-01T": dt.date(2024, 1, 1), "2024-01-01Tx": dt.date(2024, 1, 1),
        "\xa02024-01-01": REFUSED, "20240101": REFUSED, "2024-W01-1": REFUSED, "2024-001": REFUSED,
        "2024-02-30": REFUSED, "2023-02-29": REFUSED, "2024-13-01": REFUSED, "2024-00-01": REFUSED,
        "2024-01-00": REFUSED, "\uff12\uff10\uff12\uff14-01-01": REFUSED, "\u0662\u0660\u0662\u0664-01-01": REFUSED,
        "2024/01/01": REFUSED,
        "01-01-2024": REFUSED, "2024-01-01Z": REFUSED, "2024-001-01": REFUSED, "24-01-01": REFUSED,
        "2024-01-011": REFUSED, "": REFUSED, "2024-01-01\t10": REFUSED, "2024- 1-01": REFUSED,
        "2024-01-01x": REFUSED, "2024-01-": REFUSED, "2024--01": REFUSED, "2024-01T": REFUSED,
        "2024-01 10:00": REFUSED,
        "-0001-01-01": OUT_OF_RANGE, "0000-01-01": OUT_OF_RANGE, "10000-01-01": OUT_OF_RANGE,
        "-2024-01-01": OUT_OF_RANGE,
    }),
    *_cases("TIMESTAMP", {
        "2024-01-01": _ts(2024, 1, 1), "2024": _ts(2024, 1, 1), "2024-01": _ts(2024, 1, 1),
        "2024-01-01 10:00:00": _ts(2024, 1, 1, 10), "2024-01-01T10:00:00": _ts(2024, 1, 1, 10),
        "2024-01-01T10:00:00Z": _ts(2024, 1, 1, 10), "2024-01-01T10:00:00.000Z": _ts(2024, 1, 1, 10),
        "2024-01-01 10:00:00Z": _ts(2024, 1, 1, 10), "2024-01-01T10:00:00 Z": _ts(2024, 1, 1, 10),
        "2024-01-01T10:00:00UTC": _ts(2024, 1, 1, 10), "2024-01-01 10:00:00 UTC": _ts(2024, 1, 1, 10),
        "2024-01-01T10:00:00+01:00": _ts(2024, 1, 1, 9), "2024-01-01T10:00:00+0100": _ts(2024, 1, 1, 9),
        "2024-01-01T10:00:00+01": _ts(2024, 1, 1, 9), "2024-01-01T10:00:00 +0100": _ts(2024, 1, 1, 9),
        "2024-01-01 10:00:00 +01:00": _ts(2024, 1, 1, 9), "2024-01-01T10:00:00+1:00": _ts(2024, 1, 1, 9),
        "2024-01-01T10:00:00-08:00": _ts(2024, 1, 1, 18), "2024-01-01T10:00:00-00:00": _ts(2024, 1, 1, 10),
        "2024-01-01T10:00:00+00:00": _ts(2024, 1, 1, 10), "2024-01-01 10:00:00-1": _ts(2024, 1, 1, 11),
        "2024-01-01T10:00:00+0130": _ts(2024, 1, 1, 8, 30), "2024-01-01T10:00:00+18:00": _ts(2023, 12, 31, 16),
        "2024-01-01T10:00:00-18:00": _ts(2024, 1, 2, 4),
        "2024-01-01T10:00:00.123+01:00": _ts(2024, 1, 1, 9, 0, 0, 123000),
        "2024-01-01 10:00:00.123456": _ts(2024, 1, 1, 10, 0, 0, 123456),
        "2024-01-01 10:00:00.1234567": _ts(2024, 1, 1, 10, 0, 0, 123456),  # truncated, not rounded
        "2024-01-01T10:00:00.9999999": _ts(2024, 1, 1, 10, 0, 0, 999999),
        "2024-01-01 10:00:00.5": _ts(2024, 1, 1, 10, 0, 0, 500000), "2024-01-01 10:00:00.": _ts(2024, 1, 1, 10),
        "2024-01-01T10:00:00.Z": _ts(2024, 1, 1, 10), "2024-01-01 10:00": _ts(2024, 1, 1, 10),
        "2024-01-01 10": _ts(2024, 1, 1, 10), "2024-01-01T10": _ts(2024, 1, 1, 10),
        "2024-01-01 1:2:3": _ts(2024, 1, 1, 1, 2, 3), "2024-1-1T1:2:3Z": _ts(2024, 1, 1, 1, 2, 3),
        "2024-01-01T10:00:0": _ts(2024, 1, 1, 10), "2024-01-01T10:0:00": _ts(2024, 1, 1, 10),
        " 2024-01-01 10:00:00 ": _ts(2024, 1, 1, 10), "\x002024-01-01 10:00:00": _ts(2024, 1, 1, 10),
        "2024-01-01 10:00:00\x7f": _ts(2024, 1, 1, 10), "2024-01-01T10:00:00Z ": _ts(2024, 1, 1, 10),
        "+2024-01-01 10:00:00": _ts(2024, 1, 1, 10), "0001-01-01 00:00:00": _ts(1, 1, 1),
        "9999-12-31 23:59:59.999999": _ts(9999, 12, 31, 23, 59, 59, 999999),
        "2024-01-01T10:00:00z": REFUSED, "20240101T100000": REFUSED, "2024-01-01 10:00:00,5": REFUSED,
        "2024-01-01 24:00:00": REFUSED, "2024-01-01 10:60:00": REFUSED, "2024-01-01 10:00:60": REFUSED,
        "2024-01-01T": REFUSED, "2024-01-01T10:00:00+19:00": REFUSED,
        "\u0662\u0660\u0662\u0664-01-01 10:00:00": REFUSED,
        "": REFUSED, "2024-01-01T10Z": REFUSED, "2024-01-01 10:00Z": REFUSED, "2024-01-01Z": REFUSED,
        "2024-01-01T10:00Z": REFUSED, "2024-01-01T10:00+01:00": REFUSED, "2024T10:00:00": REFUSED,
        "2024-01T10:00:00": REFUSED, "2024-01-01T10:00:00+01:00x": REFUSED, "2024-01-01T10:00:00ZZ": REFUSED,
        "2024-01-01T10:00:00 z": REFUSED, "2024-01-01T10:00:00+01:00.5": REFUSED,
        "T10:00:00": NO_DATE, "10:00:00": NO_DATE,
        "2024-01-01 10:00:00 Europe/Paris": ZONE_NAMES, "2024-01-01T10:00:00 PST": ZONE_NAMES,
        "2024-01-01 10:00:00GMT+01:00": ZONE_NAMES, "2024-01-01T10:00:00+01:00:30": ZONE_NAMES,
        "2024-01-01T10:00:00+01:0": ZONE_NAMES,
        "10000-01-01 00:00:00": OUT_OF_RANGE, "9999-12-31T23:59:59-01:00": OUT_OF_RANGE,
        "0001-01-01T00:00:00+01:00": OUT_OF_RANGE,
    }),
    *_cases("TIMESTAMP_NTZ", {
        "2024-01-01 10:00:00": dt.datetime(2024, 1, 1, 10), "2024-01-01T10:00:00": dt.datetime(2024, 1, 1, 10),
        "2024-01-01": dt.datetime(2024, 1, 1), "2024": dt.datetime(2024, 1, 1),
        "2024-01-01 10:00:00.1234567": dt.datetime(2024, 1, 1, 10, 0, 0, 123456),
        " 2024-01-01 10:00:00 ": dt.datetime(2024, 1, 1, 10), "2024-01-01 10": dt.datetime(2024, 1, 1, 10),
        "2024-01-01T10:00:00z": REFUSED, "20240101T100000": REFUSED, "10:00:00": REFUSED, "T10:00:00": REFUSED,
        "2024-01-01T10:00:00+19:00": REFUSED, "2024-01-01 24:00:00": REFUSED,
        "2024-01-01T10:00:00Z": NTZ_ZONE, "2024-01-01T10:00:00+01:00": NTZ_ZONE,
        "2024-01-01 10:00:00 UTC": NTZ_ZONE,
    }),
]


def same_value(a: Any, b: Any) -> bool:
    """Equal, and of the same kind: NaN equals NaN, ``-0.0`` differs from ``0.0``, ``Decimal`` scale counts."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, Decimal):
        return str(a) == str(b)
    if isinstance(a, dt.datetime):
        return a == b and a.tzinfo == b.tzinfo
    return bool(a == b)


_PRIMITIVE = {"INT": "integer", "BIGINT": "long", "SMALLINT": "short", "TINYINT": "byte", "DOUBLE": "double",
              "FLOAT": "float", "DATE": "date", "TIMESTAMP": "timestamp", "TIMESTAMP_NTZ": "timestamp_ntz"}


def engine_type(spark_type: str) -> DataType:
    """The engine's type for a Spark type name of the table (``DECIMAL(10,2)``, ``INT``...)."""
    if m := re.fullmatch(r"DECIMAL\((\d+),(\d+)\)", spark_type):
        return DecimalType(int(m.group(1)), int(m.group(2)))
    return PrimitiveType(_PRIMITIVE[spark_type])
