"""Which Delta conflict an error reports, and what the DAG author can do about it.

The kinds are the engine's ``ConflictKind`` (one member per delta-spark exception); the error-class
table and the text pattern below are derived from it, so adding a kind cannot leave one of them
behind. Classification works on every delta-spark 4.x path a conflict can take: ``delta.exceptions``
classes (classic and Connect), a raw ``Py4JJavaError`` (4.0-4.3 without
``delta.exceptions.captured``), a Spark error class or SQLSTATE, the engine's own exceptions, and
plain text (every line of a ``spark-submit`` driver log).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from airflow_delta_occ.engine.errors import ConflictKind
from airflow_delta_occ.exceptions import ConflictFailure, ConflictSkipped, JobStoppedEarly

__all__ = ["ADVICE", "ConflictKind", "classify_conflict", "conflict_failure", "conflict_kind_for",
           "conflict_skipped"]

_BY_NAME: Mapping[str, ConflictKind] = {k.value: k for k in ConflictKind}
_BY_ERROR_CLASS: Mapping[str, ConflictKind] = {k.error_class: k for k in ConflictKind}
# A class name as it appears in a JVM stack trace or a Python traceback line, or an error class tag.
_TEXT = re.compile(
    r"(?:io\.delta\.exceptions\.|org\.apache\.spark\.sql\.delta\.|delta\.exceptions\.(?:captured\.|connect\.)?|\b)"
    rf"({'|'.join(_BY_NAME)})\b"
    rf"|\[({'|'.join(_BY_ERROR_CLASS)})[\].]"
)

_PARTITION = re.compile(r"\bpartition \[([^\]\n]{1,500})\]")

ADVICE: Mapping[ConflictKind, str] = {
    ConflictKind.APPEND: (
        "a concurrent commit added files where this job reads: constrain the job to its partitions "
        "(partitions={...}), partition the table by the column concurrent jobs filter on, or put the "
        "competing tasks in one conflict pool"),
    ConflictKind.DELETE_READ: (
        "a concurrent commit rewrote or deleted files this job read: give concurrent jobs disjoint "
        "partitions or serialize them with a conflict pool"),
    ConflictKind.DELETE_DELETE: (
        "another job removed the same files (for example two compactions of one partition): run "
        "compactions of a partition in one conflict pool"),
    ConflictKind.METADATA: (
        "the table's schema or properties changed concurrently: run ALTER TABLE and schema-evolving "
        "writes outside the write window, or in the same conflict pool"),
    ConflictKind.PROTOCOL: (
        "the table's protocol changed (a feature upgrade or a concurrent create): create tables and "
        "upgrade features before concurrent writers start"),
    ConflictKind.TRANSACTION: (
        "another writer used the same application id (txnAppId) at the same time: a duplicate run of "
        "this task or two streams sharing a checkpoint"),
    ConflictKind.WRITE: "a concurrent commit landed during an operation that cannot resolve conflicts",
}
if set(ADVICE) != set(ConflictKind):
    raise ImportError(f"conflict kinds without advice: {set(ConflictKind) - set(ADVICE)}")


def conflict_kind_for(key: str) -> ConflictKind:
    """The conflict a policy key names: the exception name or Delta's error class.

    Raises:
        ValueError: the key names no conflict.
    """
    kind = _BY_NAME.get(key) or _BY_ERROR_CLASS.get(key)
    if kind is None:
        raise ValueError(f"unknown conflict {key!r}; expected one of {', '.join(_BY_NAME)}")
    return kind


def classify_conflict(error: BaseException | str | Iterable[str] | None) -> ConflictKind | None:
    """The conflict an exception (or log text) reports, or ``None`` when it is not a Delta conflict."""
    if error is None:
        return None
    if isinstance(error, str):
        return _from_text(error.splitlines())
    if not isinstance(error, BaseException):
        return _from_text(error)
    if isinstance(error, ConflictFailure | ConflictSkipped | JobStoppedEarly) and error.kind is not None:
        return error.kind
    seen: set[int] = set()
    exc: BaseException | None = error
    while exc is not None and id(exc) not in seen:  # the conflict may be the cause of a wrapper
        seen.add(id(exc))
        kind = _from_exception(exc)
        if kind is not None:
            return kind
        exc = exc.__cause__ or exc.__context__
    return None


def _from_exception(exc: BaseException) -> ConflictKind | None:
    for cls in type(exc).__mro__:
        if cls.__name__ in _BY_NAME:
            return _BY_NAME[cls.__name__]
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            name = str(java.getClass().getName()).rsplit(".", 1)[-1]
        except Exception:  # a dead gateway must not turn a conflict into a crash here
            name = ""
        if name in _BY_NAME:
            return _BY_NAME[name]
    for getter in ("getCondition", "getErrorClass"):
        fn = getattr(exc, getter, None)
        if callable(fn):
            try:
                condition = fn()
            except Exception:
                condition = None
            if condition and str(condition).split(".")[0] in _BY_ERROR_CLASS:
                return _BY_ERROR_CLASS[str(condition).split(".")[0]]
    return _from_text(str(exc).splitlines()[:50])


def _from_text(lines: Iterable[str]) -> ConflictKind | None:
    for line in lines:
        m = _TEXT.search(line)
        if m:
            return _BY_NAME[m.group(1)] if m.group(1) else _BY_ERROR_CLASS[m.group(2)]
    return None


def conflict_failure(kind: ConflictKind, attempts: int, cause: BaseException | str) -> ConflictFailure:
    """The job-level failure for a conflict that its policy fails on, or whose attempts ran out.

    The message is built once, here, where the conflict happened; every mode carries it unchanged.
    """
    # Built from the kind and the partition Delta names, not from Spark's text, which differs between
    # classic pyspark, raw Py4J errors and Spark Connect (and names the table's own path): the same
    # conflict reads the same in every mode. Spark's full text is in the job's result and log.
    partition = _PARTITION.search(str(cause))
    where = f" in partition [{partition.group(1)}]" if partition else ""
    return ConflictFailure(f"{kind.value} after {attempts} attempt(s){where}. To avoid it: {ADVICE[kind]}",
                           kind=kind, attempts=attempts)


def conflict_skipped(kind: ConflictKind) -> ConflictSkipped:
    """The job-level outcome for a conflict whose policy is ``skip``."""
    return ConflictSkipped(f"{kind.value}: skipped by policy ({ADVICE[kind]})", kind=kind)
