"""The Airflow boundary: a ``RetryPolicy`` (Airflow 3.3 ``retry_policy=``) that knows Delta's conflicts.

Inside the Spark job the runner already retried what its policies allow. What reaches Airflow is
either a conflict that the policy fails on, a conflict whose in-job retries ran out, or an ordinary
error. This policy fails at once what retrying cannot fix (bad job input, missing tables, fail-policy
conflicts) with the advice on what to change, retries exhausted retriable conflicts with the
conflict's own backoff, and leaves every other error to Airflow's normal ``retries``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from airflow.sdk import RetryDecision, RetryPolicy
from airflow.sdk.definitions.retry_policy import RetryAction

from .engine.errors import (
    InvalidCommitError,
    LogCorruptError,
    PredicateError,
    TableNotFoundError,
    UnsupportedProtocolError,
)
from .exceptions import JobSpecError, SourceNotFoundError
from .retry import ADVICE, DEFAULT_POLICIES, Action, ConflictFailure, ConflictKind, ConflictPolicy, classify_conflict

# Retrying cannot fix these: bad job input (every JobSpecError), a missing table or source, a table
# this engine cannot read, and a malformed log (Delta's commit files are written once, atomically).
_NOT_RETRIABLE = (JobSpecError, PredicateError, TableNotFoundError, SourceNotFoundError, UnsupportedProtocolError,
                  InvalidCommitError, LogCorruptError)


class DeltaConflictRetryPolicy(RetryPolicy):
    """Retry retriable Delta conflicts, fail the rest of what is known to be permanent, at once."""

    def __init__(self, policies: Mapping[ConflictKind, ConflictPolicy] | None = None) -> None:
        self.policies = dict(policies or DEFAULT_POLICIES)

    def evaluate(self, exception: BaseException, try_number: int, max_tries: int,
                 context: Any = None) -> RetryDecision:
        if isinstance(exception, _NOT_RETRIABLE):
            return RetryDecision(RetryAction.FAIL, reason=f"not retriable: {type(exception).__name__}: {exception}")
        kind = exception.kind if isinstance(exception, ConflictFailure) else classify_conflict(exception)
        if kind is None:
            return RetryDecision(RetryAction.DEFAULT)
        policy = self.policies.get(kind, ConflictPolicy(Action.FAIL))
        if policy.action is Action.RETRY:
            delay = dt.timedelta(seconds=policy.delay(try_number))
            return RetryDecision(RetryAction.RETRY, retry_delay=delay, reason=f"{kind.value}: retrying")
        return RetryDecision(RetryAction.FAIL, reason=f"{kind.value}: {ADVICE[kind]}")
