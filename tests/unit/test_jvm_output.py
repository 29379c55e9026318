"""Which level a line of the embedded JVM's output is logged at (``spark.jvm_output``)."""

from __future__ import annotations

import logging

import pytest

from airflow_delta_occ.spark.jvm_output import line_level, relay_lines


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
    import threading

    from airflow_delta_occ.spark import jvm_output

    monkeypatch.setattr(jvm_output, "_KILLED", threading.Event())
    logger = logging.getLogger("test.jvm.kill")
    with caplog.at_level(logging.DEBUG, logger="test.jvm.kill"):
        relay_lines(["ERROR TaskSchedulerImpl: Exception in statusUpdate"], logger)
        jvm_output.after_kill()
        relay_lines(["ERROR TaskSchedulerImpl: Exception in statusUpdate", "\tat x.y(Z.java:1)"], logger)
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.INFO, logging.DEBUG]
