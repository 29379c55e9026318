"""Spark's message read the same way from a classic, a raw Py4J and a Spark Connect exception."""

from __future__ import annotations

import pytest

from airflow_delta_occ.retry.classify import ConflictKind, conflict_failure
from airflow_delta_occ.spark import errors

pytestmark = pytest.mark.unit
TEXT = "[DELTA_MERGE_UNRESOLVED_EXPRESSION] Cannot resolve s.x in search condition; line 1 pos 181"


class _JavaClass:
    def __init__(self, name: str, parent: _JavaClass | None = None) -> None:
        self.name, self.parent = name, parent

    def getName(self) -> str:
        return self.name

    def getSuperclass(self) -> _JavaClass | None:
        return self.parent


class _Java:
    def getClass(self) -> _JavaClass:
        return _JavaClass("org.apache.spark.sql.delta.DeltaAnalysisException",
                          _JavaClass(errors.ANALYSIS_EXCEPTION, _JavaClass("java.lang.Exception")))

    def getMessage(self) -> str:
        return TEXT + "\n== SQL ==\nMERGE INTO ..."


class Py4JJavaError(Exception):  # what pyspark raises when it cannot render the JVM's error
    java_exception = _Java()


def test_every_path_gives_the_same_first_line() -> None:
    assert errors.message(Py4JJavaError("An error occurred while calling o39.sql.")) == TEXT
    assert errors.message(RuntimeError(f"(org.apache.spark.sql.delta.DeltaAnalysisException) {TEXT}\nmore")) == TEXT
    assert errors.message(RuntimeError(TEXT)) == TEXT
    assert errors.is_analysis_error(Py4JJavaError("x"))
    assert not errors.is_analysis_error(RuntimeError(TEXT))


def test_conflict_messages_do_not_depend_on_how_spark_worded_them() -> None:
    classic = ("[DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT] Transaction conflict detected. a concurrent MERGE added "
               "data to table delta.`file:/a/sales`. ... in the partition [date=2024-01-01, country=FR] that ...")
    connect = "(io.delta.exceptions.ConcurrentAppendException) " + classic.replace("/a/sales", "/b/other")
    one, two = conflict_failure(ConflictKind.APPEND, 1, classic), conflict_failure(ConflictKind.APPEND, 1, connect)
    assert str(one) == str(two)
    assert str(one).startswith("ConcurrentAppendException after 1 attempt(s) in partition [date=2024-01-01, "
                               "country=FR]. To avoid it:")
