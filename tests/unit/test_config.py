"""``[delta_occ]`` options and the task-level conflict policy built from them."""

from __future__ import annotations

import json
import re

import pytest
from airflow.sdk.definitions.retry_policy import RetryAction

from airflow_delta_occ.engine import ConcurrentAppendException, TableNotFoundError
from airflow_delta_occ.exceptions import JobSpecError, PartitionSpecError
from airflow_delta_occ.operators.retry_policy import DeltaConflictRetryPolicy
from airflow_delta_occ.retry.classify import ConflictKind, conflict_failure

pytestmark = pytest.mark.unit


def test_airflow_retry_policy():
    policy = DeltaConflictRetryPolicy()
    decision = policy.evaluate(ConcurrentAppendException(version=4, operation="MERGE"), 1, 3)
    assert decision.action is RetryAction.RETRY and decision.retry_delay is not None
    protocol = conflict_failure(ConflictKind.PROTOCOL, 1, RuntimeError("protocol changed"))
    assert policy.evaluate(protocol, 1, 3).action is RetryAction.FAIL
    assert policy.evaluate(TableNotFoundError("/t"), 1, 3).action is RetryAction.FAIL
    assert policy.evaluate(PartitionSpecError("bad"), 1, 3).action is RetryAction.FAIL
    assert policy.evaluate(ConnectionError("network"), 1, 3).action is RetryAction.DEFAULT


def test_platform_policies_come_from_config_and_tasks_override_them(monkeypatch):
    from airflow_delta_occ.config import conflict_policies as configured_policies
    from airflow_delta_occ.operators.delta import DeltaDeleteOperator

    monkeypatch.setenv("AIRFLOW__DELTA_OCC__CONFLICT_POLICIES", json.dumps(
        {"ConcurrentAppendException": {"max_attempts": 9, "initial_delay": 2}, "MetadataChangedException": "fail"}))
    assert configured_policies()["MetadataChangedException"] == {"action": "fail"}
    op = DeltaDeleteOperator(task_id="d", table="/lake/t", where="id = 1",
                             conflict_policies={"ConcurrentAppendException": {"initial_delay": 0.5}})
    spec_policies = op.target_arguments().retry_policies
    assert spec_policies["ConcurrentAppendException"] == {"max_attempts": 9, "initial_delay": 0.5}
    assert spec_policies["MetadataChangedException"] == {"action": "fail"}


@pytest.mark.parametrize(("value", "problem"), [
    ("{not json", "Expecting property name"),
    ('["ConcurrentAppendException"]', "JSON object"),
    ('{"ConcurrentAppend": "retry"}', "unknown conflict 'ConcurrentAppend'"),
    ('{"ConcurrentAppendException": {"max_attempts": -1}}', "max_attempts must be a whole number"),
])
def test_bad_platform_policies_are_a_typed_error_naming_the_option(monkeypatch, value, problem):
    from airflow_delta_occ.config import conflict_policies as configured_policies
    from airflow_delta_occ.exceptions import ProviderConfigError

    monkeypatch.setenv("AIRFLOW__DELTA_OCC__CONFLICT_POLICIES", value)
    with pytest.raises(ProviderConfigError, match=r"\[delta_occ\] conflict_policies: .*" + re.escape(problem)):
        configured_policies()


def test_bad_task_policies_fail_when_the_dag_is_parsed():
    from airflow_delta_occ.operators.delta import DeltaDeleteOperator

    with pytest.raises(JobSpecError, match="conflict_policies: unknown conflict 'ConcurrentAppend'"):
        DeltaDeleteOperator(task_id="d", table="/lake/t", conflict_policies={"ConcurrentAppend": "skip"})


def test_worker_wait_is_seconds_from_zero_to_a_day(monkeypatch):
    from airflow_delta_occ import config
    from airflow_delta_occ.exceptions import ProviderConfigError

    monkeypatch.delenv("AIRFLOW__DELTA_OCC__WORKER_WAIT", raising=False)
    assert config.worker_wait() == 30.0
    for text, value in (("0", 0.0), ("12.5", 12.5), (" 60 ", 60.0)):
        monkeypatch.setenv("AIRFLOW__DELTA_OCC__WORKER_WAIT", text)
        assert config.worker_wait() == value
    for bad in ("-1", "90000", "nan", "inf", "soon", ""):
        monkeypatch.setenv("AIRFLOW__DELTA_OCC__WORKER_WAIT", bad)
        with pytest.raises(ProviderConfigError, match=r"\[delta_occ\] worker_wait is"):
            config.worker_wait()


def test_airflows_default_deferrable_forces_deferral_only_when_true(monkeypatch):
    """Airflow 3 writes ``default_deferrable = false`` into every new airflow.cfg: False (or unset) cannot
    be told from its default, so it leaves waits adaptive; True makes every wait defer."""
    from airflow_delta_occ import config

    monkeypatch.delenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", raising=False)
    assert config.default_deferrable() is None
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "true")
    assert config.default_deferrable() is True
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "False")
    assert config.default_deferrable() is None
