"""The task-level retry policy decides from the same resolved policies as the in-job loop."""

from __future__ import annotations

import json

import pytest
from airflow.sdk.definitions.retry_policy import RetryAction

from airflow_delta_occ.engine import MetadataChangedException
from airflow_delta_occ.exceptions import ProviderConfigError
from airflow_delta_occ.operators.delta import DeltaMergeOperator, DeltaOptimizeOperator
from airflow_delta_occ.retry.classify import ConflictKind, conflict_failure
from airflow_delta_occ.retry.policy import policies_for

pytestmark = pytest.mark.unit


def merge(**kw: object) -> DeltaMergeOperator:
    return DeltaMergeOperator(task_id="m", table="/lake/sales", source="/src", merge_condition="t.id = s.id",
                              **kw)  # type: ignore[arg-type]


def test_a_task_fail_policy_is_not_retried_by_airflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW__DELTA_OCC__CONFLICT_POLICIES", raising=False)
    op = merge(conflict_policies={"MetadataChangedException": "fail"})
    decision = op.retry_policy.evaluate(MetadataChangedException(version=3, operation="ADD COLUMNS"), 1, 3)
    assert decision.action is RetryAction.FAIL
    assert merge().retry_policy.evaluate(MetadataChangedException(version=3, operation="X"), 1, 3).action \
        is RetryAction.RETRY


def test_the_task_delay_is_the_conflict_policy_layered_over_the_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__CONFLICT_POLICIES", json.dumps(
        {"ConcurrentAppendException": {"initial_delay": 100, "multiplier": 3, "jitter": 0}}))
    op = merge(conflict_policies={"ConcurrentAppendException": {"initial_delay": 7}})
    exhausted = conflict_failure(ConflictKind.APPEND, 5, RuntimeError("files were added"))
    decision = op.retry_policy.evaluate(exhausted, 2, 3)
    assert decision.action is RetryAction.RETRY
    assert decision.retry_delay is not None and decision.retry_delay.total_seconds() == 21  # 7 * 3 ** (2 - 1)
    # The runner resolves the spec's policies with the same function and gets the same answer.
    assert op.retry_policy.policies == policies_for("merge", op.retry_policies())


def test_optimize_skips_at_both_levels() -> None:
    policy = DeltaOptimizeOperator(task_id="o", table="/t").retry_policy
    decision = policy.evaluate(conflict_failure(ConflictKind.DELETE_DELETE, 1, RuntimeError("x")), 1, 3)
    assert decision.action is RetryAction.FAIL  # a skip never reaches Airflow as a failure; never retried


def test_delta_tasks_get_retries_by_default_and_authors_keep_the_last_word(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW__DELTA_OCC__TASK_RETRIES", raising=False)
    assert merge().retries == 2
    assert merge(retries=0).retries == 0
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__TASK_RETRIES", "5")
    assert merge().retries == 5
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__TASK_RETRIES", "many")
    with pytest.raises(ProviderConfigError, match=r"\[delta_occ\] task_retries"):
        merge()


def test_default_args_retries_win_over_the_provider_default() -> None:
    from airflow.sdk import DAG

    with DAG("d", schedule=None, default_args={"retries": 7}):
        assert merge().retries == 7


def _no_partitions():  # type: ignore[no-untyped-def]
    from airflow_delta_occ.jobs.partitions import PartitionFilter

    return PartitionFilter(())


def test_mapped_delta_tasks_get_the_default_retries_where_the_scheduler_reads_them() -> None:
    import datetime as dt

    from airflow.sdk import DAG

    with DAG("mapped", schedule=None, start_date=dt.datetime(2024, 1, 1)):
        mapped = DeltaMergeOperator.partial(task_id="m", table="/t", merge_condition="t.id = s.id") \
            .expand(source=["/a", "/b"])
    assert mapped.retries == 2
    with DAG("mapped_defaults", schedule=None, default_args={"retries": 4}):
        mapped = DeltaMergeOperator.partial(task_id="m", table="/t", merge_condition="t.id = s.id") \
            .expand(source=["/a", "/b"])
    assert mapped.retries == 4


@pytest.mark.parametrize(("error", "action"), [
    ("SourceNotFoundError", "fail"), ("SourceOutsidePartitionsError", "fail"), ("ProviderConfigError", "fail"),
    ("StorageConnectionError", "fail"), ("UnsafeLogStoreError", "fail"), ("UnsupportedStorageError", "fail"),
    ("StorageError", "default"), ("RuntimeError", "default"), ("OSError", "default")])
def test_permanent_failures_fail_at_once_and_the_rest_is_left_to_airflow(error: str, action: str) -> None:
    import builtins

    from airflow_delta_occ import exceptions
    from airflow_delta_occ.engine import errors
    from airflow_delta_occ.operators.retry_policy import DeltaConflictRetryPolicy

    cls = getattr(exceptions, error, None) or getattr(errors, error, None) or getattr(builtins, error)
    decision = DeltaConflictRetryPolicy("merge").evaluate(cls("boom"), try_number=1, max_tries=3)
    assert decision.action.value == action, decision
