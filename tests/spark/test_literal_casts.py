"""Spark's own cast, with ANSI on, agrees with the engine on every text of ``tests/unit/engine/spark_casts.py``.

One query casts every text to its type; the table's claims (the engine's value is Spark's, a text the
engine refuses is refused by Spark too, or accepted by Spark only for the reason the table states)
are then checked against what Spark returned.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from typing import Any

from airflow_delta_occ.engine import InvalidLiteralError
from airflow_delta_occ.engine.values import coerce_literal

from ..unit.engine.spark_casts import CASES, Refused, SparkOnly, engine_type, same_value

_AS_TEXT = ("DATE", "TIMESTAMP", "TIMESTAMP_NTZ")  # compared as Spark prints them in UTC: no local-time conversion


def _as_spark_returns(value: Any, spark_type: str) -> Any:
    """The engine's value as Spark's cast returns it to Python for ``spark_type``."""
    if spark_type == "FLOAT" and math.isfinite(value):
        return struct.unpack("f", struct.pack("f", value))[0]  # Spark's FLOAT is 32 bits
    if isinstance(value, dt.datetime):
        text = value.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
        return text.rstrip("0").rstrip(".") if value.microsecond else text[:19]
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def test_sparks_cast_agrees_with_the_engine_on_every_text(spark: Any) -> None:
    types = sorted({case.spark_type for case in CASES})
    columns = [f"CAST(try_cast(text AS {t}) AS STRING)" if t in _AS_TEXT else f"try_cast(text AS {t})" for t in types]
    frame = spark.createDataFrame([(i, case.text) for i, case in enumerate(CASES)], "i INT, text STRING")
    previous = {key: spark.conf.get(key) for key in ("spark.sql.ansi.enabled", "spark.sql.session.timeZone")}
    spark.conf.set("spark.sql.ansi.enabled", "true")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        rows = frame.selectExpr("i", *(f"{c} AS c{k}" for k, c in enumerate(columns))).collect()
    finally:
        for key, value in previous.items():
            spark.conf.set(key, value)
    assert len(rows) == len(CASES)
    wrong = []
    for row in rows:
        case = CASES[row["i"]]
        got = row[f"c{types.index(case.spark_type)}"]
        try:
            engine: Any = coerce_literal(case.text, engine_type(case.spark_type))
        except InvalidLiteralError:
            engine = None
        if isinstance(case.expected, Refused):
            ok = got is None and engine is None
        elif isinstance(case.expected, SparkOnly):
            ok = got is not None and engine is None
        else:
            ok = engine is not None and all(same_value(got, _as_spark_returns(v, case.spark_type))
                                            for v in (engine, case.expected))
        if not ok:
            wrong.append(f"{case.spark_type} {case.text!r}: Spark {got!r}, engine {engine!r}, table {case.expected!r}")
    assert not wrong, "\n".join(wrong)
