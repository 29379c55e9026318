"""spark-submit driver output reaches the task log line by line, while the job runs.

The hook reads the runner's result line and the first conflict from the same lines; it must not hold
them back until spark-submit exits (a long MERGE would show nothing in the task log until its end).
The real submissions are in tests/spark/test_cluster_modes.py and tests/spark/test_kill.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import structlog.testing

from airflow_delta_occ.hooks.transports.submit import _submit_hook_class
from airflow_delta_occ.jobs.result import JobResult, JobStatus
from airflow_delta_occ.retry.classify import ConflictKind
from airflow_delta_occ.spark.runner import RESULT_PREFIX

pytestmark = pytest.mark.unit

CONFLICT = ("2026-11-24 06:00:01,123 WARNING airflow_delta_occ.retry.policy: ConcurrentAppendException on /lake/sales "
            "(attempt 1 of 5, winning version 7): retrying in 1.00 s")


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    return _submit_hook_class()(application="runner.py", conn_id="spark_default")


def test_each_line_is_logged_before_the_next_one_is_read(hook: Any) -> None:
    result = JobResult(status=JobStatus.SUCCESS, table="/lake/sales", operation="merge", version=8, attempts=2)
    lines = ["26/11/24 06:00:00 INFO SparkContext: Running Spark version 4.2.0", CONFLICT,
             RESULT_PREFIX + result.to_json(), "26/11/24 06:00:03 INFO ShutdownHookManager: Shutdown hook called"]
    logged_when_read: list[list[str]] = []

    with structlog.testing.capture_logs() as logs:
        def driver_output() -> Iterator[str]:  # what spark-submit's stdout yields, one line at a time
            for line in lines:
                logged_when_read.append([str(entry["event"]) for entry in logs])
                yield line + "\n"
            logged_when_read.append([str(entry["event"]) for entry in logs])

        hook._process_spark_submit_log(driver_output())

    # When line n was read, lines 0..n-1 were already in the log: nothing waits for the end.
    assert logged_when_read == [lines[:n] for n in range(len(lines) + 1)]
    assert [entry["log_level"] for entry in logs] == ["info"] * len(lines)
    # ... and the provider still read what it needs from the stream.
    assert hook.result == result
    assert hook.conflict is ConflictKind.APPEND


def test_a_result_seen_before_the_driver_dies_is_kept(hook: Any) -> None:
    """spark-submit killed after the runner printed its result: the lines read so far count."""
    result = JobResult(status=JobStatus.SUCCESS, table="/t", operation="merge", version=3, attempts=1)

    def killed_driver() -> Iterator[str]:
        yield RESULT_PREFIX + result.to_json() + "\n"
        raise OSError("the pipe closed")

    with structlog.testing.capture_logs() as logs, pytest.raises(OSError):
        hook._process_spark_submit_log(killed_driver())
    assert hook.result == result
    assert [entry["event"] for entry in logs] == [RESULT_PREFIX + result.to_json()]
