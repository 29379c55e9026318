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


def test_the_real_error_is_found_behind_a_failed_conversion() -> None:
    """pyspark fails to render Delta's error class and raises a second Py4J error while handling the
    first; the message comes from the first one's JVM exception."""

    class _Internal:
        def getClass(self) -> _JavaClass:
            return _JavaClass("org.apache.spark.SparkException")

        def getMessage(self) -> str:
            return "[INTERNAL_ERROR] Cannot find main error class 'DELTA_MERGE_UNRESOLVED_EXPRESSION'"

    class ConversionFailed(Exception):
        java_exception = _Internal()

    try:
        try:
            raise Py4JJavaError("An error occurred while calling o39.sql.")
        except Py4JJavaError:
            raise ConversionFailed("An error occurred while calling SparkThrowableHelper.getMessage") from None
    except ConversionFailed as exc:
        failed = exc
    assert failed.__context__ is not None  # `from None` hides it from tracebacks, not from __context__
    assert errors.is_analysis_error(failed) and errors.message(failed) == TEXT
