"""The task-level retry: a ``RetryPolicy`` (Airflow 3.3 ``retry_policy=``) that knows Delta's conflicts.

Inside the Spark job the runner already retried what its policies allow. What reaches Airflow is
either a conflict that the policy fails on, a conflict whose in-job retries ran out, or an ordinary
error. This policy fails at once what retrying cannot fix (bad job input, missing tables, fail-policy
conflicts) with the advice on what to change, retries exhausted retriable conflicts with the
conflict's own backoff, and leaves every other error to Airflow's normal ``retries``.

It decides from the same policies as the in-job loop: ``policies_for(operation, overrides)`` with
the platform's ``[delta_occ] conflict_policies`` under the task's ``conflict_policies=``. The
platform layer is read when the policy first decides, in the worker, as the runner reads it.

What Airflow's own ``RetryRule`` can say, it says: the permanent failures are one rule matched by
exception class. The conflicts are not an ``ExceptionRetryPolicy``: a conflict that crossed Py4J or
Spark Connect is recognised by Delta's error class in its message, not by a Python class, and its
delay grows with the try (a rule's delay is fixed).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from airflow.sdk import RetryDecision, RetryPolicy, RetryRule
from airflow.sdk.definitions.retry_policy import RetryAction

from airflow_delta_occ import config
from airflow_delta_occ.engine.errors import (
    InvalidCommitError,
    LogCorruptError,
    PredicateError,
    UnsupportedProtocolError,
    UnsupportedStorageError,
)
from airflow_delta_occ.exceptions import (
    CommitOutsidePartitionsError,
    ConflictFailure,
    JobKilledAfterCommitError,
    JobSpecError,
    ProviderConfigError,
    UnsafeLogStoreError,
)
from airflow_delta_occ.jobs.result import REFUSED_TYPES
from airflow_delta_occ.retry.classify import ADVICE, ConflictKind, classify_conflict
from airflow_delta_occ.retry.policy import Action, ConflictPolicy, layer_overrides, policies_for

# Retrying cannot fix these: what the runner refuses (bad job input, a missing table or source), a
# condition the engine cannot read, a table this engine cannot read, a malformed log (Delta's commit
# files are written once, atomically), bad provider configuration, an S3 table whose commits could be
# lost, and an object-store URI or credentials the engine cannot use (an unreachable store is a
# plain StorageError and is retried), and a commit that changed files outside its partitions (a retry
# would find the same commit and must not hide it).
NOT_RETRIABLE: tuple[type[BaseException], ...] = (
    *REFUSED_TYPES, PredicateError, UnsupportedProtocolError, InvalidCommitError, LogCorruptError, ProviderConfigError,
    UnsafeLogStoreError, UnsupportedStorageError, CommitOutsidePartitionsError)
PERMANENT = RetryRule(exception=list(NOT_RETRIABLE), action=RetryAction.FAIL)


class DeltaConflictRetryPolicy(RetryPolicy):
    """Retry retriable Delta conflicts, fail the rest of what is known to be permanent, at once.

    :param operation: the job's operation (``merge``, ``optimize``...), which picks the base policies.
    :param overrides: the task's ``conflict_policies=`` (layered over the platform's defaults).
    :param policies: resolved policies to use as they are (tests, custom operators).
    :raises JobSpecError: ``overrides`` or ``policies`` are not policies, or out of their documented
        ranges: refused when the DAG is parsed, not when Airflow asks the policy after a failure (where
        an error only makes Airflow fall back to its own retries).
    """

    def __init__(self, operation: str = "merge", overrides: Mapping[str, Any] | None = None, *,
                 policies: Mapping[ConflictKind, ConflictPolicy] | None = None) -> None:
        self.operation = operation
        try:
            self.overrides = layer_overrides(overrides)
        except (TypeError, ValueError) as exc:
            raise JobSpecError(f"conflict_policies: {exc}") from exc
        self._policies = _checked(policies) if policies is not None else None

    @property
    def policies(self) -> Mapping[ConflictKind, ConflictPolicy]:
        """The resolved policies: the same answer the runner's in-job loop gets for this task."""
        if self._policies is None:
            self._policies = policies_for(self.operation, layer_overrides(config.conflict_policies(), self.overrides))
        return self._policies

    def evaluate(self, exception: BaseException, try_number: int, max_tries: int,
                 context: Any = None) -> RetryDecision:
        if PERMANENT.matches(exception):
            return RetryDecision(RetryAction.FAIL, reason=f"not retriable: {type(exception).__name__}: {exception}")
        if isinstance(exception, JobKilledAfterCommitError) and not exception.idempotent:
            return RetryDecision(RetryAction.FAIL, reason=f"not retried, a retry would write again: {exception}")
        kind = exception.kind if isinstance(exception, ConflictFailure) else classify_conflict(exception)
        if kind is None:
            return RetryDecision(RetryAction.DEFAULT)
        policy = self.policies.get(kind, ConflictPolicy(Action.FAIL))
        if policy.action is Action.RETRY:
            delay = dt.timedelta(seconds=policy.delay(try_number))
            return RetryDecision(RetryAction.RETRY, retry_delay=delay, reason=f"{kind.value}: retrying")
        return RetryDecision(RetryAction.FAIL, reason=f"{kind.value}: {ADVICE[kind]}")


def _checked(policies: Mapping[ConflictKind, ConflictPolicy]) -> dict[ConflictKind, ConflictPolicy]:
    """``policies`` as given, once each is known to be a ``ConflictPolicy`` (whose fields it checked itself).

    Raises:
        JobSpecError: a key is not a conflict kind or a value is not a ``ConflictPolicy``.
    """
    if not isinstance(policies, Mapping):
        raise JobSpecError(f"policies must map conflict kinds to ConflictPolicy, got {type(policies).__name__}")
    for kind, policy in policies.items():
        if not isinstance(kind, ConflictKind) or not isinstance(policy, ConflictPolicy):
            raise JobSpecError(f"policies must map conflict kinds to ConflictPolicy, got {kind!r:.60}: "
                               f"{type(policy).__name__}")
    return dict(policies)
