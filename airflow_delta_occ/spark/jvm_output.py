"""The embedded Spark JVM's own output, relayed to Python logging at the level each line states.

An embedded session's JVM (``spark-submit ... pyspark-shell``, started by pyspark) inherits the task
process's stdout and stderr. Airflow's task supervisor logs every stderr line at ERROR, and the JVM
writes its ordinary chatter there: about forty lines of Ivy's dependency resolution at every start,
log4j's WARN and INFO lines. A successful task then showed more ERROR lines than INFO ones (issue #24).
The session's JVM is therefore started with both streams piped into this module: a line that carries a
log4j level (``25/11/27 10:00:00 WARN Utils: ...``) is logged at that level; a stack trace's lines
(``\tat ...``, ``Caused by: ...``, ``... 12 more``) at DEBUG, after the headline they belong to, which keeps
its own level; everything else (Ivy, banners) at INFO.

Once the task is being killed (``after_kill``), the JVM's errors are the kill's expected fallout (cancelled
tasks, a closed connection): they are logged at INFO at most, so the log's errors are the ones that matter.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from typing import IO

LOGGER_NAME = "airflow_delta_occ.spark.jvm"

# A log4j line of Spark's default layouts: "yy/MM/dd HH:mm:ss LEVEL logger: message", or the level first
# ("WARN  NativeCodeLoader: ..."), as Spark's console patterns print it.
_LEVELLED = re.compile(r"^(?:\d{2,4}[/-]\d{2}[/-]\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\s+)?"
                       r"(TRACE|DEBUG|INFO|WARN|WARNING|ERROR|FATAL)\b")
_STACK = re.compile(r"^(?:\s+at\s|\s*\.\.\.\s*\d+\s+more|\s*Caused by:|\s+Suppressed:)")
# What the JVM writes without log4j when it is in trouble: an uncaught exception, memory, a crash report.
_FATAL = re.compile(r"^(?:Exception in thread |Error: |#\s+A fatal error has been detected"
                    r"|.*java\.lang\.OutOfMemoryError)")
_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "WARNING": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}


def line_level(line: str) -> int:
    """The logging level a line of the JVM's output is relayed at (module docstring)."""
    if _STACK.match(line):
        return logging.DEBUG
    found = _LEVELLED.match(line)
    if found:
        return _LEVELS[found.group(1)]
    return logging.ERROR if _FATAL.match(line) else logging.INFO


_KILLED = threading.Event()


def after_kill() -> None:
    """From now on this process's JVM is being stopped on purpose: its lines are logged at INFO at most."""
    _KILLED.set()


def expect_errors() -> None:
    """A new job starts (``dag.test()`` or a long-lived process may run several): its errors are errors again."""
    _KILLED.clear()


def relay_lines(lines: Iterable[str], logger: logging.Logger) -> None:
    """Log each line at its level (capped at INFO after ``after_kill``); blank lines are dropped."""
    for raw in lines:
        # Spark's console progress bar rewrites its line with carriage returns and no newline: what follows the
        # last one is the line (a log4j line the bar ran into keeps its level).
        line = raw.rstrip("\r\n").rsplit("\r", 1)[-1]
        if line.strip():
            level = line_level(line)
            logger.log(min(level, logging.INFO) if _KILLED.is_set() else level, "%s", line)


def start_relay(stream: IO[bytes], name: str) -> threading.Thread:
    """Drain ``stream`` (the read end of a pipe the JVM writes to) in a daemon thread until every write end is
    closed, relaying its lines. It must run before the JVM starts: a pipe nobody reads stops the JVM once
    its buffer fills, and what a JVM that fails to start writes is the reason it failed."""
    def drain() -> None:
        logger = logging.getLogger(LOGGER_NAME)
        with stream:
            try:
                relay_lines((raw.decode("utf-8", "replace") for raw in stream), logger)
            except Exception:   # a logging failure must not stop the draining: the JVM would block
                logger.exception("relaying the Spark JVM's %s failed; the rest is discarded", name)
                for _ in stream:
                    pass

    thread = threading.Thread(target=drain, name=f"delta-occ-jvm-{name}", daemon=True)
    thread.start()
    return thread
