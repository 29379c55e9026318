"""Typed retry policies for Delta's conflict exceptions, built on tenacity.

Each conflict has its own policy: retry with exponential backoff and jitter, skip (the work is
already done, e.g. a compaction whose files another compaction rewrote), or fail at once with advice
on what to change. Anything that is not a recognised conflict is never retried here, so a retry
cannot hide a real error.

``policies_for`` is the one place a job's policies are resolved (the operation's base, the
platform's ``[delta_occ] conflict_policies``, the task's ``conflict_policies=``): the runner's
in-job loop and the task-level ``DeltaConflictRetryPolicy`` both decide from its answer.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar

import tenacity

from .classify import ConflictKind, classify_conflict, conflict_failure, conflict_kind_for, conflict_skipped

T = TypeVar("T")


class Action(StrEnum):
    RETRY = "retry"
    SKIP = "skip"
    FAIL = "fail"


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


def policies_for(operation: str, overrides: Mapping[str, PolicyOverride] | None = None,
                 ) -> dict[ConflictKind, ConflictPolicy]:
    """The policies a job runs with: the operation's base, then ``overrides`` (already layered:
    platform defaults under the task's own, see ``layer_overrides``).

    Raises:
        ValueError: an unknown exception name, action or field.
    """
    base = OPTIMIZE_POLICIES if operation == "optimize" else DEFAULT_POLICIES
    return resolve_policies(base, overrides)


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


@dataclass(frozen=True)
class ConflictRecord:
    """One conflict seen while running a job (reported in the job's result).

    ``action`` is what the policy did: ``retry``, ``skip``, ``fail``, or ``gave up`` when the
    attempts ran out; ``delay`` is the backoff before the next attempt (seconds).
    """

    attempt: int
    kind: ConflictKind
    message: str
    action: str
    delay: float = 0.0


@dataclass
class RetryOutcome:
    attempts: int = 0
    conflicts: list[ConflictRecord] = field(default_factory=list)


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
        record.conflicts.append(ConflictRecord(state.attempt_number, kind, str(exc).strip()[:1000],
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
            raise conflict_skipped(kind) from exc
        raise conflict_failure(kind, record.attempts, exc) from exc
