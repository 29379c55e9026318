"""Every duration and count of a conflict policy has a documented range, checked where the policy is built
or loaded: a DAG's ``conflict_policies=`` (``JobSpecError``), ``[delta_occ] conflict_policies``
(``ProviderConfigError``), a ``DeltaConflictRetryPolicy`` (``JobSpecError``). Out of range, NaN and infinity
are refused naming the field and the range, instead of an ``OverflowError`` in the job's sleep or at the
Airflow boundary's ``timedelta``."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from airflow.sdk.definitions.retry_policy import RetryAction

from airflow_delta_occ.exceptions import JobSpecError, ProviderConfigError
from airflow_delta_occ.operators.delta import DeltaMergeOperator
from airflow_delta_occ.operators.retry_policy import DeltaConflictRetryPolicy
from airflow_delta_occ.retry.classify import ConflictKind, conflict_failure
from airflow_delta_occ.retry.policy import (
    MAX_ATTEMPTS,
    MAX_DELAY_SECONDS,
    MAX_MULTIPLIER,
    ConflictPolicy,
    layer_overrides,
    run_with_policies,
)

pytestmark = pytest.mark.unit

DAY = 86_400.0

# (field, value, the range its message must name)
OUT_OF_RANGE = [
    ("initial_delay", 1e300, "from 0 to 86400"),
    ("initial_delay", DAY + 1, "from 0 to 86400"),
    ("initial_delay", 10 ** 400, "from 0 to 86400"),
    ("initial_delay", -0.5, "from 0 to 86400"),
    ("initial_delay", float("nan"), "from 0 to 86400"),
    ("max_delay", float("inf"), "from 0 to 86400"),
    ("max_delay", 1e300, "from 0 to 86400"),
    ("jitter", 1e300, "from 0 to 86400"),
    ("jitter", float("-inf"), "from 0 to 86400"),
    ("multiplier", 1e300, "from 1 to 10"),
    ("multiplier", 0.5, "from 1 to 10"),
    ("multiplier", float("nan"), "from 1 to 10"),
    ("max_attempts", 101, "from 1 to 100"),
    ("max_attempts", 10 ** 400, "from 1 to 100"),
    ("max_attempts", 0, "from 1 to 100"),
]
IDS = [f"{field}={value!r:.12}" for field, value, _ in OUT_OF_RANGE]


def test_the_documented_ranges() -> None:
    assert (MAX_ATTEMPTS, MAX_DELAY_SECONDS, MAX_MULTIPLIER) == (100, DAY, 10.0)


@pytest.mark.parametrize(("field", "value", "range_"), OUT_OF_RANGE, ids=IDS)
def test_a_policy_out_of_range_is_refused_naming_the_field_and_the_range(field: str, value: Any, range_: str) -> None:
    with pytest.raises(ValueError, match=rf"{field} must be .*{range_}"):
        ConflictPolicy(**{field: value})


@pytest.mark.parametrize(("field", "value", "range_"), OUT_OF_RANGE, ids=IDS)
def test_a_task_policy_out_of_range_fails_when_the_dag_is_parsed(field: str, value: Any, range_: str) -> None:
    with pytest.raises(JobSpecError, match=rf"ConcurrentAppendException.*{field} must be .*{range_}"):
        DeltaMergeOperator(task_id="m", table="/lake/sales", source="/src", merge_condition="t.id = s.id",
                           conflict_policies={"ConcurrentAppendException": {field: value}})


@pytest.mark.parametrize("text", [
    '{"ConcurrentAppendException": {"initial_delay": 1e300}}',
    '{"ConcurrentAppendException": {"max_delay": 1e400}}',             # Python's json reads it as infinity
    '{"ConcurrentAppendException": {"jitter": NaN}}',
    '{"ConcurrentAppendException": {"initial_delay": 1' + "0" * 400 + "}}",   # an int too big for a float
    '{"ConcurrentAppendException": {"multiplier": 11}}',
])
def test_a_platform_policy_out_of_range_is_a_config_error(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    from airflow_delta_occ import config

    monkeypatch.setenv("AIRFLOW__DELTA_OCC__CONFLICT_POLICIES", text)
    with pytest.raises(ProviderConfigError, match=r"conflict_policies: .* must be .*from"):
        config.conflict_policies()


@pytest.mark.parametrize(("field", "value", "range_"), OUT_OF_RANGE, ids=IDS)
def test_a_retry_policy_out_of_range_is_refused_when_it_is_built(field: str, value: Any, range_: str) -> None:
    with pytest.raises(JobSpecError, match=rf"{field} must be .*{range_}"):
        DeltaConflictRetryPolicy("merge", {"ConcurrentAppendException": {field: value}})


def test_a_retry_policy_of_something_that_is_not_a_policy_is_refused() -> None:
    with pytest.raises(JobSpecError, match="ConflictPolicy"):
        DeltaConflictRetryPolicy(policies={ConflictKind.APPEND: {"initial_delay": 1e300}})  # type: ignore[dict-item]


def test_the_largest_policy_still_sleeps_and_retries_at_the_airflow_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW__DELTA_OCC__CONFLICT_POLICIES", raising=False)
    largest = {"max_attempts": MAX_ATTEMPTS, "initial_delay": DAY, "max_delay": DAY, "multiplier": 10,
               "jitter": DAY}
    assert json.loads(json.dumps(layer_overrides({"ConcurrentAppendException": largest})))
    policy = DeltaConflictRetryPolicy("merge", {"ConcurrentAppendException": largest})
    for try_number in (1, 2, 50, 10_000):
        decision = policy.evaluate(conflict_failure(ConflictKind.APPEND, 5, RuntimeError("x")), try_number, 3)
        assert decision.action is RetryAction.RETRY and decision.retry_delay is not None
        assert dt.timedelta(days=1) <= decision.retry_delay <= dt.timedelta(days=2)

    slept: list[float] = []
    calls = iter(range(3))

    def job(attempt: int) -> str:
        if next(calls) < 2:
            raise RuntimeError("io.delta.exceptions.ConcurrentAppendException: files were added")
        return "done"

    policies = {ConflictKind.APPEND: ConflictPolicy(**largest)}
    assert run_with_policies(job, policies, sleep=slept.append) == "done"
    assert len(slept) == 2 and all(DAY <= s <= 2 * DAY for s in slept)
