"""Which level a line of the embedded JVM's output is logged at (``spark.jvm_output``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from airflow_delta_occ.spark.jvm_output import line_level, relay_lines


@pytest.fixture(autouse=True)
def _not_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kill flag is the process's: a test of this process that killed a job (the spark tier) must not
    change the levels asserted here."""
    import threading

    from airflow_delta_occ.spark import jvm_output

    monkeypatch.setattr(jvm_output, "_KILLED", threading.Event())


@pytest.mark.parametrize(("line", "level"), [
    ("25/11/27 10:00:00 WARN NativeCodeLoader: Unable to load native-hadoop library", logging.WARNING),
    ("25/11/27 10:00:00 INFO SparkContext: Running Spark version 4.2.0", logging.INFO),
    ("2025-11-27 10:00:00,123 ERROR Executor: Exception in task 0.0", logging.ERROR),
    ("WARN  Utils: Service 'SparkUI' could not bind on port 4040", logging.WARNING),
    ("ERROR SparkContext: Error initializing SparkContext.", logging.ERROR),
    (":: resolving dependencies :: org.apache.spark#spark-submit-parent;1.0", logging.INFO),
    ("\tio.delta#delta-spark_2.13;4.4.0 from central in [default]", logging.INFO),
    ("\tat org.apache.spark.sql.Dataset.ofRows(Dataset.scala:99)", logging.DEBUG),
    ("Caused by: java.io.FileNotFoundException: /lake/missing", logging.DEBUG),
    ("\t... 42 more", logging.DEBUG),
    ("Ivy Default Cache set to: /root/.cache/airflow-delta-occ/ivy/cache", logging.INFO),
    ("an ERROR in the middle of a line is no level", logging.INFO),
])
def test_a_line_is_logged_at_the_level_it_states(line: str, level: int) -> None:
    assert line_level(line) == level


def test_blank_lines_are_dropped_and_line_ends_stripped(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.jvm")
    with caplog.at_level(logging.DEBUG, logger="test.jvm"):
        relay_lines(["WARN X: y\n", "\n", "  \r\n", "plain\r\n"], logger)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.WARNING, "WARN X: y"),
                                                                      (logging.INFO, "plain")]


def test_after_a_kill_the_jvms_errors_are_information(caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_delta_occ.spark import jvm_output

    logger = logging.getLogger("test.jvm.kill")
    with caplog.at_level(logging.DEBUG, logger="test.jvm.kill"):
        relay_lines(["ERROR TaskSchedulerImpl: Exception in statusUpdate"], logger)
        jvm_output.after_kill()
        relay_lines(["ERROR TaskSchedulerImpl: Exception in statusUpdate", "\tat x.y(Z.java:1)"], logger)
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.INFO, logging.DEBUG]


@pytest.mark.parametrize(("line", "level"), [
    ('Exception in thread "main" java.lang.RuntimeException: [unresolved dependency: io.delta#x;9: not found]',
     logging.ERROR),
    ("java.lang.OutOfMemoryError: Java heap space", logging.ERROR),
    ("# A fatal error has been detected by the Java Runtime Environment:", logging.ERROR),
    ("\tCaused by: java.io.IOException: Broken pipe", logging.DEBUG),
])
def test_what_the_jvm_writes_in_trouble_without_log4j(line: str, level: int) -> None:
    assert line_level(line) == level


def test_a_line_the_progress_bar_ran_into_keeps_its_level(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.jvm.bar")
    with caplog.at_level(logging.DEBUG, logger="test.jvm.bar"):
        relay_lines(["\r[Stage 3:=>   (1 + 1) / 2]\r   \r25/11/27 10:00:00 ERROR Executor: Exception in task 0.0\n"],
                    logger)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, "25/11/27 10:00:00 ERROR Executor: Exception in task 0.0")]


def test_a_new_job_counts_its_errors_again(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_delta_occ.spark import jvm_output

    logger = logging.getLogger("test.jvm.again")
    jvm_output.after_kill()
    jvm_output.expect_errors()
    with caplog.at_level(logging.DEBUG, logger="test.jvm.again"):
        relay_lines(["ERROR X: y"], logger)
    assert [r.levelno for r in caplog.records] == [logging.ERROR]


def test_a_jvm_that_fails_to_start_says_why_in_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """The pipes are drained from before the JVM starts: a JVM that exits during start-up (an offline worker
    without Ivy's cache) leaves its reason in the log, and a JVM that writes more than a pipe holds before
    its gateway is up does not hang (a stand-in ``spark-submit`` plays the JVM)."""
    from pyspark.core.context import SparkContext

    from airflow_delta_occ.spark import session

    home = tmp_path / "spark"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "spark-submit").write_text(
        "#!/bin/sh\nhead -c 200000 /dev/zero | tr '\\\\0' 'x' >&2\necho >&2\n"
        "echo 'Exception in thread \"main\" java.lang.RuntimeException: [unresolved dependency: io.delta#d;1: not "
        "found]' >&2\nexit 1\n")
    (home / "bin" / "spark-submit").chmod(0o755)
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setattr(SparkContext, "_gateway", None)
    with caplog.at_level(logging.INFO, logger="airflow_delta_occ.spark.jvm"), pytest.raises(Exception,
                                                                                         match="JAVA_GATEWAY_EXITED"):
        session._launch_jvm_without_secrets({"spark.app.name": "x"})
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any("unresolved dependency" in r.getMessage() for r in caplog.records):
        time.sleep(0.05)
    [reason] = [r for r in caplog.records if "unresolved dependency" in r.getMessage()]
    assert reason.levelno == logging.ERROR
