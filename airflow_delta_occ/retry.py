"""Typed retry policies for Delta's conflict exceptions, built on tenacity.

Each conflict has its own policy: retry with exponential backoff and jitter, skip (the work is
already done, e.g. a compaction whose files another compaction rewrote), or fail at once with advice
on what to change. Anything that is not a recognised conflict is never retried here, so a retry
cannot hide a real error.

Classification works on every delta-spark 4.x path a conflict can take: ``delta.exceptions`` classes
(classic and Connect), a raw ``Py4JJavaError`` (4.0-4.3 without ``delta.exceptions.captured``), a
Spark error class or SQLSTATE, the engine's own exceptions, and plain text (every line of a
``spark-submit`` driver log).
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar

import tenacity

from .exceptions import ConflictSkipped

T = TypeVar("T")


class ConflictKind(StrEnum):
    """Delta's conflict exceptions, by their delta-spark class name."""

    APPEND = "ConcurrentAppendException"
    DELETE_READ = "ConcurrentDeleteReadException"
    DELETE_DELETE = "ConcurrentDeleteDeleteException"
    METADATA = "MetadataChangedException"
    PROTOCOL = "ProtocolChangedException"
    TRANSACTION = "ConcurrentTransactionException"
    WRITE = "ConcurrentWriteException"


_ERROR_CLASS = {
    "DELTA_CONCURRENT_APPEND": ConflictKind.APPEND,
    "DELTA_CONCURRENT_DELETE_READ": ConflictKind.DELETE_READ,
    "DELTA_CONCURRENT_DELETE_DELETE": ConflictKind.DELETE_DELETE,
    "DELTA_METADATA_CHANGED": ConflictKind.METADATA,
    "DELTA_PROTOCOL_CHANGED": ConflictKind.PROTOCOL,
    "DELTA_CONCURRENT_TRANSACTION": ConflictKind.TRANSACTION,
    "DELTA_CONCURRENT_WRITE": ConflictKind.WRITE,
}
_BY_NAME = {k.value: k for k in ConflictKind}
# A class name as it appears in a JVM stack trace or a Python traceback line, or an error class tag.
_TEXT = re.compile(
    r"(?:io\.delta\.exceptions\.|org\.apache\.spark\.sql\.delta\.|delta\.exceptions\.(?:captured\.|connect\.)?|\b)"
    r"(ConcurrentAppendException|ConcurrentDeleteReadException|ConcurrentDeleteDeleteException|"
    r"MetadataChangedException|ProtocolChangedException|ConcurrentTransactionException|ConcurrentWriteException)\b"
    r"|\[(DELTA_CONCURRENT_APPEND|DELTA_CONCURRENT_DELETE_READ|DELTA_CONCURRENT_DELETE_DELETE|DELTA_METADATA_CHANGED|"
    r"DELTA_PROTOCOL_CHANGED|DELTA_CONCURRENT_TRANSACTION|DELTA_CONCURRENT_WRITE)[\].]"
)


def classify_conflict(error: BaseException | str | Iterable[str] | None) -> ConflictKind | None:
    """The conflict an exception (or log text) reports, or ``None`` when it is not a Delta conflict."""
    if error is None:
        return None
    if isinstance(error, str):
        return _from_text(error.splitlines())
    if not isinstance(error, BaseException):
        return _from_text(error)
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
            if condition and str(condition).split(".")[0] in _ERROR_CLASS:
                return _ERROR_CLASS[str(condition).split(".")[0]]
    return _from_text(str(exc).splitlines()[:50])


def _from_text(lines: Iterable[str]) -> ConflictKind | None:
    for line in lines:
        m = _TEXT.search(line)
        if m:
            return _BY_NAME[m.group(1)] if m.group(1) else _ERROR_CLASS[m.group(2)]
    return None


class Action(StrEnum):
    RETRY = "retry"
    SKIP = "skip"
    FAIL = "fail"


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


MAX_ATTEMPTS = 100
"""Most attempts one conflict policy may ask for inside a job."""


@dataclass(frozen=True)
class ConflictPolicy:
    """What to do about one conflict kind. Delays are in seconds; jitter is added uniformly."""

    action: Action = Action.RETRY
    max_attempts: int = 5
    initial_delay: float = 1.0
    max_delay: float = 60.0
    multiplier: float = 2.0
    jitter: float = 1.0

    def __post_init__(self) -> None:
        # Values arrive from DAG files and JSON config: NaN, infinity, booleans and 2.5 attempts are
        # refused here, at parse time, instead of misbehaving inside the job.
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) \
                or not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            raise ValueError(f"max_attempts must be a whole number from 1 to {MAX_ATTEMPTS}, got {self.max_attempts!r}")
        for name in ("initial_delay", "max_delay", "multiplier", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be at least 1, got {self.multiplier!r}")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Backoff before attempt ``attempt + 1`` (``attempt`` starts at 1)."""
        base = min(self.max_delay, self.initial_delay * self.multiplier ** (attempt - 1))
        return base + (rng or random).uniform(0, self.jitter)


DEFAULT_POLICIES: Mapping[ConflictKind, ConflictPolicy] = {
    ConflictKind.APPEND: ConflictPolicy(Action.RETRY, max_attempts=5),
    ConflictKind.DELETE_READ: ConflictPolicy(Action.RETRY, max_attempts=5),
    ConflictKind.DELETE_DELETE: ConflictPolicy(Action.RETRY, max_attempts=3),
    ConflictKind.METADATA: ConflictPolicy(Action.RETRY, max_attempts=2),
    ConflictKind.PROTOCOL: ConflictPolicy(Action.FAIL),
    ConflictKind.TRANSACTION: ConflictPolicy(Action.FAIL),
    ConflictKind.WRITE: ConflictPolicy(Action.RETRY, max_attempts=3),
}
# A compaction that lost its input files to another compaction has nothing left to do.
OPTIMIZE_POLICIES: Mapping[ConflictKind, ConflictPolicy] = {
    **DEFAULT_POLICIES,
    ConflictKind.DELETE_DELETE: ConflictPolicy(Action.SKIP),
    ConflictKind.DELETE_READ: ConflictPolicy(Action.SKIP),
}


def conflict_kind_for(key: str) -> ConflictKind:
    """The conflict an override key names: the exception name or Delta's error class.

    Raises:
        ValueError: the key names no conflict.
    """
    kind = _BY_NAME.get(key) or _ERROR_CLASS.get(key)
    if kind is None:
        raise ValueError(f"unknown conflict {key!r}; expected one of {', '.join(_BY_NAME)}")
    return kind


PolicyOverride = Mapping[str, Any] | ConflictPolicy | str


def layer_overrides(*layers: Mapping[str, PolicyOverride] | None) -> dict[str, dict[str, Any]]:
    """Per-exception overrides combined field by field, later layers winning, as plain JSON data.

    Platform defaults (``[delta_occ] conflict_policies``) sit under a task's ``conflict_policies=``,
    so a task that only shortens the delay keeps the platform's attempt count. Keys become exception
    names, so ``DELTA_CONCURRENT_APPEND`` and ``ConcurrentAppendException`` address one policy.

    Raises:
        ValueError: an unknown exception name, action or field.
    """
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        if layer is not None and not isinstance(layer, Mapping):
            raise ValueError(f"expected a mapping of exception name to policy, got {type(layer).__name__}")
        for key, value in (layer or {}).items():
            if isinstance(value, ConflictPolicy):
                fields: dict[str, Any] = {**vars(value), "action": value.action.value}
            elif isinstance(value, str):
                fields = {"action": value}
            elif isinstance(value, Mapping):
                fields = dict(value)
            else:
                raise ValueError(f"bad policy for {key}: expected an action name or a mapping, got {value!r}")
            merged.setdefault(conflict_kind_for(key).value, {}).update(fields)
    resolve_policies({}, merged)  # every field and action is checked here, before any job runs
    return merged


def resolve_policies(base: Mapping[ConflictKind, ConflictPolicy],
                     overrides: Mapping[str, PolicyOverride] | None = None,
                     ) -> dict[ConflictKind, ConflictPolicy]:
    """Merge overrides keyed by exception name (``"ConcurrentAppendException"``) or error class.

    A value may be a ``ConflictPolicy``, an action name (``"skip"``) or a dict of policy fields.

    Raises:
        ValueError: an unknown exception name, action or field.
    """
    policies = dict(base)
    for key, value in (overrides or {}).items():
        kind = conflict_kind_for(key)
        current = policies.get(kind, ConflictPolicy())
        try:
            if isinstance(value, ConflictPolicy):
                policies[kind] = value
            elif isinstance(value, str):
                policies[kind] = replace(current, action=Action(value))
            else:
                fields = dict(value)
                if "action" in fields:
                    fields["action"] = Action(fields["action"])
                policies[kind] = replace(current, **fields)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad policy for {key}: {exc}") from exc
    return policies


@dataclass
class ConflictRecord:
    """One conflict seen while running a job (reported in the job's result)."""

    attempt: int
    kind: str
    message: str
    action: str
    delay: float = 0.0


@dataclass
class RetryOutcome:
    attempts: int = 0
    conflicts: list[ConflictRecord] = field(default_factory=list)


class ConflictFailure(Exception):
    """A conflict whose policy says fail (or whose retries ran out), with advice for the DAG author."""

    def __init__(self, kind: ConflictKind, attempts: int, cause: BaseException) -> None:
        self.kind = kind
        self.attempts = attempts
        first_line = str(cause).strip().splitlines()[0][:500] if str(cause).strip() else type(cause).__name__
        super().__init__(f"{kind.value} after {attempts} attempt(s): {first_line}. To avoid it: {ADVICE[kind]}")


def run_with_policies(fn: Callable[[int], T], policies: Mapping[ConflictKind, ConflictPolicy], *,
                      outcome: RetryOutcome | None = None, sleep: Callable[[float], None] = time.sleep,
                      rng: random.Random | None = None) -> T:
    """Call ``fn(attempt)`` until it succeeds, retrying only conflicts whose policy says retry.

    Raises:
        ConflictSkipped: a conflict whose policy is skip.
        ConflictFailure: a conflict whose policy is fail, or whose attempts ran out.
        BaseException: anything that is not a conflict, unchanged and at once.
    """
    record = outcome if outcome is not None else RetryOutcome()

    def should_retry(state: tenacity.RetryCallState) -> bool:
        exc = state.outcome.exception() if state.outcome is not None else None
        kind = classify_conflict(exc)
        if exc is None or kind is None:
            return False
        policy = policies.get(kind, ConflictPolicy(Action.FAIL))
        retry = policy.action is Action.RETRY and state.attempt_number < policy.max_attempts
        delay = policy.delay(state.attempt_number, rng) if retry else 0.0
        record.conflicts.append(ConflictRecord(state.attempt_number, kind.value, str(exc).strip()[:1000],
                                               policy.action.value if retry or policy.action is not Action.RETRY
                                               else "gave up", delay))
        return retry

    def wait(state: tenacity.RetryCallState) -> float:
        return record.conflicts[-1].delay if record.conflicts else 0.0

    def attempt() -> T:
        record.attempts += 1
        return fn(record.attempts)

    retrying = tenacity.Retrying(retry=should_retry, wait=wait, sleep=sleep, reraise=True,
                                 stop=tenacity.stop_never)
    try:
        return retrying(attempt)
    except BaseException as exc:
        kind = classify_conflict(exc)
        if kind is None:
            raise
        policy = policies.get(kind, ConflictPolicy(Action.FAIL))
        if policy.action is Action.SKIP:
            raise ConflictSkipped(f"{kind.value}: skipped by policy ({ADVICE[kind]})") from exc
        raise ConflictFailure(kind, record.attempts, exc) from exc
