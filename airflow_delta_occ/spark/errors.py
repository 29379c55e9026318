"""What Spark said, read the same way from every kind of exception pyspark can raise.

A failure reaches the runner as a classic pyspark exception (``delta.exceptions.captured`` or
``pyspark.errors``), as a raw ``Py4JJavaError`` (when pyspark cannot convert it: Delta's error
classes are not in Spark's message table, so converting a Delta analysis error fails inside
``SparkThrowableHelper.getMessage``), or as a Spark Connect exception (whose text starts with the
JVM class in parentheses). The runner reports one message whatever the path, so the same failure
reads the same in every mode.
"""

from __future__ import annotations

import re
from typing import Any

ANALYSIS_EXCEPTION = "org.apache.spark.sql.AnalysisException"
_JVM_CLASS_PREFIX = re.compile(r"^\((?:[a-z_][\w$]*\.)+[A-Z][\w$]*\)\s*")


def _java_exception(exc: BaseException) -> Any:
    return getattr(exc, "java_exception", None)


def _java_class_names(java: Any) -> list[str]:
    names = []
    try:
        cls = java.getClass()
        while cls is not None:
            names.append(str(cls.getName()))
            cls = cls.getSuperclass()
    except Exception:  # a dead gateway: nothing more can be learned from the JVM
        pass
    return names


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and what it was raised from or during (pyspark raises a second Py4J error while
    converting a Delta analysis error; the first one, with the real JVM exception, is its context)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen) and len(seen) < 20:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _analysis_java(exc: BaseException) -> Any:
    for link in _chain(exc):
        java = _java_exception(link)
        if java is not None and ANALYSIS_EXCEPTION in _java_class_names(java):
            return java
    return None


def is_analysis_error(exc: BaseException) -> bool:
    """Spark refused a statement when analysing it (classic, Connect, or a raw Py4J error)."""
    try:
        from pyspark.errors import AnalysisException
    except ImportError:  # pragma: no cover - the runner always has pyspark
        return False
    return any(isinstance(link, AnalysisException) for link in _chain(exc)) or _analysis_java(exc) is not None


def message(exc: BaseException) -> str:
    """The first line of Spark's own message, without pyspark's wrapping or the Connect class prefix."""
    text = ""
    java = _analysis_java(exc) or _java_exception(exc)
    if java is not None:  # the JVM's message, which pyspark may have failed to render
        try:
            text = str(java.getMessage() or "")
        except Exception:
            text = ""
    if not text:
        text = str(exc)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    first = _JVM_CLASS_PREFIX.sub("", lines[0]) if lines else type(exc).__name__
    return first[:2000]
