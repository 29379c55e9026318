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

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar, cast

import tenacity
from tenacity.wait import wait_base

from airflow_delta_occ.exceptions import JobStoppedEarly

from .classify import ConflictKind, classify_conflict, conflict_failure, conflict_kind_for, conflict_skipped

T = TypeVar("T")

log = logging.getLogger(__name__)
"""Every conflict and every backoff, logged when it happens. In the task process (embedded, Connect)
these lines reach the task log; a spark-submit driver prints them (``runner.main``) and the hook
streams the driver's output into the task log."""


class Action(StrEnum):
    RETRY = "retry"
    SKIP = "skip"
    FAIL = "fail"


MAX_ATTEMPTS = 100
"""Most attempts one conflict policy may ask for inside a job."""
MAX_DELAY_SECONDS = 86_400.0
"""Longest ``initial_delay``, ``max_delay`` and ``jitter`` (one day): a backoff is then at most two days,
which ``time.sleep`` in the job and Airflow's ``timedelta`` both take (1e300 overflowed them)."""
MAX_MULTIPLIER = 10.0
"""Steepest backoff growth: a delay reaches ``max_delay`` within a few attempts long before this."""

# field -> (lowest, highest, unit), the documented ranges (docs/operators.md#retries)
RANGES: Mapping[str, tuple[float, float, str]] = {
    "initial_delay": (0.0, MAX_DELAY_SECONDS, " seconds"),
    "max_delay": (0.0, MAX_DELAY_SECONDS, " seconds"),
    "jitter": (0.0, MAX_DELAY_SECONDS, " seconds"),
    "multiplier": (1.0, MAX_MULTIPLIER, ""),
}


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
        # Values arrive from DAG files and JSON config: NaN, infinity, booleans, 2.5 attempts and a delay
        # of 1e300 s are refused here, when the policy is built, instead of overflowing in the job's sleep
        # or in the task-level policy's timedelta. The callers turn ValueError into their typed error.
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) \
                or not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            raise ValueError(f"max_attempts must be a whole number from 1 to {MAX_ATTEMPTS}, "
                             f"got {_shown(self.max_attempts)}")
        for name, (lowest, highest, unit) in RANGES.items():
            value = getattr(self, name)
            # Compared as they are (an int is never converted to a float, which overflows); NaN fails both.
            if isinstance(value, bool) or not isinstance(value, int | float) or not lowest <= value <= highest:
                raise ValueError(f"{name} must be a number from {lowest:g} to {highest:g}{unit}, got {_shown(value)}")

    @property
    def wait(self) -> wait_base:
        """Tenacity's wait for this policy: ``min(max_delay, initial_delay * multiplier ** (attempt - 1))``
        plus a uniform jitter in ``[0, jitter]``, so the backoff is bounded by ``max_delay + jitter``."""
        return (tenacity.wait_exponential(multiplier=self.initial_delay, max=self.max_delay, exp_base=self.multiplier)
                + tenacity.wait_random(0, self.jitter))

    def delay(self, attempt: int) -> float:
        """Backoff before attempt ``attempt + 1`` (``attempt`` starts at 1); the task-level policy uses it too."""
        state = tenacity.RetryCallState(cast(Any, None), None, (), {})
        state.attempt_number = attempt
        return float(self.wait(state))


def _shown(value: object) -> str:
    """``value`` for an error message, short: an int of 400 digits is not worth quoting (nor can repr
    print one above 4300)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 15:
        return "a number of more than 15 digits"
    if value is None or isinstance(value, str | int | float):
        return f"{value!r:.40}"
    return f"a {type(value).__name__}"   # a container's repr can be huge, or too deep to print


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
                known = [f.name for f in dataclasses.fields(ConflictPolicy)]
                unknown = [str(name) for name in fields if name not in known]
                if unknown:
                    raise ValueError(f"unknown field {unknown[0]!r}; a policy's fields are {', '.join(known)}")
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
    attempts ran out; ``delay`` is the backoff before the next attempt (seconds);
    ``winning_version`` is the concurrent commit that won, when Delta's message names it;
    ``seconds`` is how long the attempt that met the conflict ran: Spark work thrown away. ``early``
    marks an attempt the runner stopped while it ran (early abort: the winner, ``winning_operation``, made
    its commit certain to fail), rather than one Delta failed at its commit.
    """

    attempt: int
    kind: ConflictKind
    message: str
    action: str
    delay: float = 0.0
    winning_version: int | None = None
    seconds: float = 0.0
    early: bool = False
    winning_operation: str | None = None

    def describe(self, what: str, max_attempts: int) -> str:
        """The log line for this conflict, e.g. ``ConcurrentAppendException on /lake/sales (attempt 1 of 5,
        winning version 7): retrying in 1.25 s``."""
        winner = f", winning version {self.winning_version}" if self.winning_version is not None else ""
        if self.early:
            by = f" ({self.winning_operation})" if self.winning_operation else ""
            winner += f"{by}, foreseen and stopped early after {self.seconds:.1f} s"
        head = f"{self.kind.value} on {what} (attempt {self.attempt} of {max_attempts}{winner})"
        if self.action == Action.RETRY:
            return f"{head}: retrying in {self.delay:.2f} s"
        if self.action == Action.SKIP:
            return f"{head}: skipped, as its policy says (the work is already done)"
        if self.action == Action.FAIL:
            return f"{head}: not retried, its policy is fail"
        return f"{head}: giving up, no attempts left"


# Delta names the winner "committed at version N" (append, delete-read, delete-delete) or in the
# "Conflicting commit: {...}" JSON it appends (metadata, protocol, transaction, write); the engine's
# own conflicts say "winning version N".
_WINNER = re.compile(r"committed at version (\d+)|winning version (\d+)|Conflicting commit: \{.*?\"version\":(\d+)")


def winning_version(message: str) -> int | None:
    """The version of the concurrent commit a conflict message names, if it names one."""
    match = _WINNER.search(message)
    return int(next(g for g in match.groups() if g is not None)) if match else None


@dataclass
class RetryOutcome:
    attempts: int = 0
    conflicts: list[ConflictRecord] = field(default_factory=list)

    @property
    def lost_seconds(self) -> float:
        """Seconds of work in attempts a conflict ended (backoff not counted)."""
        return sum(c.seconds for c in self.conflicts)


def run_with_policies(fn: Callable[[int], T], policies: Mapping[ConflictKind, ConflictPolicy], *,
                      outcome: RetryOutcome | None = None, sleep: Callable[[float], None] = time.sleep,
                      what: str = "the table", clock: Callable[[], float] = time.monotonic) -> T:
    """Call ``fn(attempt)`` until it succeeds, retrying only conflicts whose policy says retry.

    Each conflict is recorded in ``outcome`` and logged when it happens (``what`` names the table in
    the line): a retried one with its backoff before the sleep starts, the last one before its
    exception is raised.

    Raises:
        ConflictSkipped: a conflict whose policy is skip.
        ConflictFailure: a conflict whose policy is fail, or whose attempts ran out.
        BaseException: anything that is not a conflict, unchanged and at once.
    """
    record = outcome if outcome is not None else RetryOutcome()
    elapsed = 0.0  # how long the last attempt ran

    def conflict(state: tenacity.RetryCallState) -> tuple[BaseException, ConflictKind, ConflictPolicy] | None:
        exc = state.outcome.exception() if state.outcome is not None else None
        kind = classify_conflict(exc)
        if exc is None or kind is None:
            return None
        return exc, kind, policies.get(kind, ConflictPolicy(Action.FAIL))

    def should_retry(state: tenacity.RetryCallState) -> bool:
        seen = conflict(state)
        return seen is not None and seen[2].action is Action.RETRY and state.attempt_number < seen[2].max_attempts

    def wait(state: tenacity.RetryCallState) -> float:  # only called for a conflict being retried
        seen = conflict(state)
        return float(seen[2].wait(state)) if seen is not None else 0.0

    def before_sleep(state: tenacity.RetryCallState) -> None:
        seen = conflict(state)
        if seen is not None and state.next_action is not None:
            note(seen, state.attempt_number, Action.RETRY.value, state.next_action.sleep)

    def note(seen: tuple[BaseException, ConflictKind, ConflictPolicy], attempt: int, action: str,
             delay: float = 0.0) -> None:
        exc, kind, policy = seen
        message = str(exc).strip()
        stopped = exc if isinstance(exc, JobStoppedEarly) else None
        entry = ConflictRecord(attempt, kind, message[:1000], action, delay,
                               stopped.version if stopped else winning_version(message), round(elapsed, 3),
                               early=stopped is not None, winning_operation=stopped.operation if stopped else None)
        record.conflicts.append(entry)
        log.log(logging.INFO if action == Action.SKIP else logging.WARNING, "%s",
                entry.describe(what, policy.max_attempts if policy.action is Action.RETRY else attempt),
                extra={"delta_occ_conflict": entry})

    def attempt() -> T:
        nonlocal elapsed
        record.attempts += 1
        started = clock()
        try:
            return fn(record.attempts)
        finally:
            elapsed = clock() - started

    retrying = tenacity.Retrying(retry=should_retry, wait=wait, sleep=sleep, before_sleep=before_sleep,
                                 reraise=True, stop=tenacity.stop_never)
    try:
        return retrying(attempt)
    except BaseException as exc:
        kind = classify_conflict(exc)
        if kind is None:
            raise
        policy = policies.get(kind, ConflictPolicy(Action.FAIL))
        action = "gave up" if policy.action is Action.RETRY else policy.action.value
        note((exc, kind, policy), record.attempts, action)
        if policy.action is Action.SKIP:
            raise conflict_skipped(kind) from exc
        raise conflict_failure(kind, record.attempts, exc) from exc
