"""Reading spark-submit driver output (pure logic; the real submissions are in tests/spark/test_cluster_modes.py).

SparkSubmitHook keeps only the last lines of the driver log for its error message; a conflict
logged early (the typical case: the stack trace is followed by shutdown noise) must still be found.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from airflow_delta_occ.hooks.transports.submit import _submit_hook_class
from airflow_delta_occ.jobs.result import JobResult, JobStatus
from airflow_delta_occ.retry.classify import ConflictKind
from airflow_delta_occ.spark.runner import RESULT_PREFIX

pytestmark = pytest.mark.unit

CONFLICT_LINE = ("pyspark.errors.exceptions.captured.AnalysisException: [DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT] "
                 "ConcurrentAppendException: Files were added to partition [country=DE] by a concurrent update.")
NOISE = [f"26/11/23 05:00:{i:02d} INFO ShutdownHookManager: Deleting directory /tmp/spark-{i}" for i in range(40)]


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    return _submit_hook_class()(application="runner.py", conn_id="spark_default")


def test_conflict_far_above_the_tail_is_classified(hook: Any) -> None:
    lines = ["Traceback (most recent call last):", CONFLICT_LINE, *NOISE]
    hook._process_spark_submit_log(iter(line + "\n" for line in lines))
    assert hook.conflict is ConflictKind.APPEND
    assert hook.result is None


def test_result_line_is_read_wherever_it_is(hook: Any) -> None:
    result = JobResult(status=JobStatus.CONFLICT, table="/t", operation="merge",
                       conflict=ConflictKind.DELETE_READ, attempts=3, error="ConcurrentDeleteReadException after 3")
    lines = [*NOISE[:5], RESULT_PREFIX + result.to_json(), *NOISE]
    hook._process_spark_submit_log(iter(line + "\n" for line in lines))
    assert hook.result == result
    assert hook.conflict is None


def test_unrelated_failure_is_not_a_conflict(hook: Any) -> None:
    lines = ["java.io.FileNotFoundException: /data/missing.parquet", *NOISE]
    hook._process_spark_submit_log(iter(line + "\n" for line in lines))
    assert hook.conflict is None and hook.result is None


def test_a_java_stack_goes_to_debug_not_to_the_hooks_info_lines(hook: Any, capsys: pytest.CaptureFixture[str],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Issue #24: a missing source logged 84 Java stack lines at INFO (the Spark provider logs every driver line
    at INFO) before the one line that matters. The stack's frames are at DEBUG now; the headline and the
    ``Caused by:`` lines stay INFO; a conflict named in a ``Caused by:`` line is still classified."""
    stack = ["26/11/27 09:00:00 WARN FileStreamSink: Assume no metadata directory. Error while looking for "
             "metadata directory in the path: /landing/missing.",
             "java.io.FileNotFoundException: File /landing/missing does not exist",
             *[f"\tat org.apache.hadoop.fs.RawLocalFileSystem.m{i}(RawLocalFileSystem.java:{i})" for i in range(80)],
             "Caused by: io.delta.exceptions.ConcurrentAppendException: Files were added by a concurrent update.",
             "\t... 42 more"]
    hook._process_spark_submit_log(iter(line + "\n" for line in stack))
    logged = capsys.readouterr().out   # the task logger (structlog) writes its INFO lines here
    assert stack[0] in logged and stack[1] in logged and stack[-2] in logged   # the cause stays (review)
    assert "RawLocalFileSystem" not in logged and "42 more" not in logged
    assert hook.conflict is ConflictKind.APPEND
    # What is left out of the INFO lines is logged at DEBUG.
    from airflow_delta_occ.hooks.transports.submit import for_the_task_log

    log = logging.getLogger("test.submit")
    with caplog.at_level(logging.DEBUG, logger="test.submit"):
        passed = [line for line in stack if for_the_task_log(line + "\n", log)]
    assert passed == [*stack[:2], stack[-2]]
    assert [r.levelno for r in caplog.records] == [logging.DEBUG] * 81
