"""What a Delta task says in its log: the condition as the SQL it runs, not a parse tree (issue #24).

The operator runs for real on a hand-written Delta log; only Spark is replaced (a ``MemoryTransport``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_delta_occ.engine import Snapshot
from airflow_delta_occ.hooks.transports import MemoryTransport
from airflow_delta_occ.operators.delta import DeltaUpdateOperator

pytestmark = pytest.mark.unit


def _context() -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="d", task_id="u", map_index=-1, try_number=1, max_tries=2)
    return {"ti": ti, "run_id": "manual__1"}


def test_the_condition_is_logged_as_the_sql_that_runs(sales_log: tuple[str, Snapshot], monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_DEFAULT",
                       json.dumps({"conn_type": "delta_occ", "extra": {"mode": "memory"}}))
    transport = MemoryTransport(lambda spec: MemoryTransport.success())
    operator = DeltaUpdateOperator(task_id="u", table=sales_log[0], set={"name": "upper(name)"},
                                   where="id < 10", partitions={"date": "2024-01-01", "country": "DE"})
    with transport.registered("memory"):
        operator.execute(_context())
    out = capsys.readouterr().out
    [line] = [line for line in out.splitlines() if "condition:" in line]
    assert "Comparison(" not in line and "And(" not in line, line
    assert "`id` < 10" in line and "`country` = 'DE'" in line and "DATE'2024-01-01'" in line, line


def test_the_retries_the_task_got_are_stated_at_its_start(sales_log: tuple[str, Snapshot],
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_DEFAULT",
                       json.dumps({"conn_type": "delta_occ", "extra": {"mode": "memory"}}))
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__TASK_RETRIES", "1")
    operator = DeltaUpdateOperator(task_id="u", table=sales_log[0], set={"name": "upper(name)"},
                                   partitions={"date": "2024-01-01", "country": "DE"})
    with MemoryTransport(lambda spec: MemoryTransport.success()).registered("memory"):
        operator.execute({"ti": SimpleNamespace(dag_id="d", task_id="u", map_index=-1, try_number=1, max_tries=1),
                          "run_id": "manual__1"})
    [line] = [line for line in capsys.readouterr().out.splitlines() if "retries:" in line]
    assert "retries: 1 (a Delta task that sets none gets [delta_occ] task_retries)" in line, line
    assert "DeltaConflictRetryPolicy" in line, line


def _killed_job(table: str, *, commit_first: bool, compacted: bool = False) -> MemoryTransport:
    """A job that is killed while it runs: having committed first (the kill came after the commit; with Delta's
    auto-compaction after it, which carries the job's tag too) or not."""
    from ..engine.logbuilder import LogBuilder, add, commit_info

    def job(spec: Any) -> Any:
        if commit_first:
            log = LogBuilder(Path(table))
            log.commits = [[]] * 2   # versions 0 and 1 exist: this is version 2
            log.commit(commit_info("MERGE", userMetadata=spec.run.user_metadata()),
                       add("DE-new.parquet", {"date": "2024-01-01", "country": "DE"}))
            if compacted:
                log.commit(commit_info("OPTIMIZE", userMetadata=spec.run.user_metadata()),
                           add("DE-compacted.parquet", {"date": "2024-01-01", "country": "DE"}, data_change=False))
        transport.killed = True   # what on_kill sets before it stops the session
        raise RuntimeError("Py4JError: the session was stopped")

    transport = MemoryTransport(job)
    return transport


def test_a_kill_after_the_commit_says_the_write_is_in_the_table(sales_log: tuple[str, Snapshot],
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_delta_occ.exceptions import JobKilledAfterCommitError

    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_DEFAULT",
                       json.dumps({"conn_type": "delta_occ", "extra": {"mode": "memory"}}))
    operator = DeltaUpdateOperator(task_id="u", table=sales_log[0], set={"name": "upper(name)"},
                                   partitions={"date": "2024-01-01", "country": "DE"})
    with _killed_job(sales_log[0], commit_first=True).registered("memory"), \
            pytest.raises(JobKilledAfterCommitError, match=r"committed version 2 .*do not run it again") as killed:
        operator.execute(_context())
    assert killed.value.version == 2
    [line] = [line for line in capsys.readouterr().out.splitlines() if "after its job committed" in line]
    assert "version 2" in line and "warning" in line, line


def test_a_kill_before_the_commit_says_nothing_was_written(sales_log: tuple[str, Snapshot],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_delta_occ.exceptions import JobKilledAfterCommitError, JobKilledError

    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_DEFAULT",
                       json.dumps({"conn_type": "delta_occ", "extra": {"mode": "memory"}}))
    operator = DeltaUpdateOperator(task_id="u", table=sales_log[0], set={"name": "upper(name)"},
                                   partitions={"date": "2024-01-01", "country": "DE"})
    with _killed_job(sales_log[0], commit_first=False).registered("memory"), \
            pytest.raises(JobKilledError, match="before it committed") as killed:
        operator.execute(_context())
    assert not isinstance(killed.value, JobKilledAfterCommitError)


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_kill_after_the_commit_names_the_jobs_version_and_whether_a_retry_writes_again(
        sales_log: tuple[str, Snapshot], monkeypatch: pytest.MonkeyPatch, idempotent: bool) -> None:
    from airflow_delta_occ.exceptions import JobKilledAfterCommitError
    from airflow_delta_occ.operators.retry_policy import DeltaConflictRetryPolicy

    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_DEFAULT",
                       json.dumps({"conn_type": "delta_occ", "extra": {"mode": "memory"}}))
    operator = DeltaUpdateOperator(task_id="u", table=sales_log[0], set={"name": "upper(name)"}, idempotent=idempotent,
                                   partitions={"date": "2024-01-01", "country": "DE"})
    with _killed_job(sales_log[0], commit_first=True, compacted=True).registered("memory"), \
            pytest.raises(JobKilledAfterCommitError) as killed:
        operator.execute(_context())
    assert killed.value.version == 2   # the job's commit, not the auto-compaction's (3)
    decision = DeltaConflictRetryPolicy("update").evaluate(killed.value, 1, 3)
    assert (decision.action.value == "fail") is (not idempotent), decision
    assert ("would write it again" in str(killed.value)) is (not idempotent)
