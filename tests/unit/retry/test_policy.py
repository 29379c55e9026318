"""Conflict classification and typed retry policies (pure logic; real conflicts are in tests/spark)."""

from __future__ import annotations

import json
import logging
import random
from dataclasses import replace

import pytest

from airflow_delta_occ.engine import ConcurrentAppendException as EngineAppend
from airflow_delta_occ.exceptions import ConflictFailure, ConflictSkipped
from airflow_delta_occ.retry.classify import ConflictKind, classify_conflict
from airflow_delta_occ.retry.policy import (
    DEFAULT_POLICIES,
    OPTIMIZE_POLICIES,
    Action,
    ConflictPolicy,
    RetryOutcome,
    layer_overrides,
    resolve_policies,
    run_with_policies,
    winning_version,
)

pytestmark = pytest.mark.unit


class ConcurrentAppendException(Exception):
    pass


class _JavaClass:
    def __init__(self, name: str) -> None:
        self._name = name

    def getName(self) -> str:
        return self._name


class _JavaException:
    def __init__(self, name: str) -> None:
        self._cls = _JavaClass(name)

    def getClass(self) -> _JavaClass:
        return self._cls


class FakePy4JJavaError(Exception):
    def __init__(self, java_name: str) -> None:
        super().__init__("An error occurred while calling o123.execute.")
        self.java_exception = _JavaException(java_name)


class FakeConnectError(Exception):
    def __init__(self, condition: str) -> None:
        super().__init__("remote failure")
        self._condition = condition

    def getCondition(self) -> str:
        return self._condition


@pytest.mark.parametrize(("error", "kind"), [
    (ConcurrentAppendException("x"), ConflictKind.APPEND),
    (EngineAppend(version=3, operation="MERGE"), ConflictKind.APPEND),
    (FakePy4JJavaError("io.delta.exceptions.ConcurrentDeleteReadException"), ConflictKind.DELETE_READ),
    (FakeConnectError("DELTA_CONCURRENT_DELETE_DELETE.WITH_PARTITION_HINT"), ConflictKind.DELETE_DELETE),
    (FakeConnectError("DELTA_METADATA_CHANGED"), ConflictKind.METADATA),
    ("26/11/23 INFO blah\nio.delta.exceptions.ProtocolChangedException: [DELTA_PROTOCOL_CHANGED] ...",
     ConflictKind.PROTOCOL),
    (["line", "pyspark.errors: [DELTA_CONCURRENT_TRANSACTION] ConcurrentTransactionException"],
     ConflictKind.TRANSACTION),
    (RuntimeError("wrapped") , None),
    (ValueError("ConcurrentAppendExceptionally odd"), None),
    ("AnalysisException: [TABLE_OR_VIEW_NOT_FOUND] t", None),
])
def test_classify(error, kind):
    assert classify_conflict(error) is kind


def test_classify_follows_causes():
    try:
        try:
            raise FakePy4JJavaError("io.delta.exceptions.ConcurrentAppendException")
        except Exception as inner:
            raise RuntimeError("job failed") from inner
    except RuntimeError as outer:
        assert classify_conflict(outer) is ConflictKind.APPEND


def test_retries_conflicts_with_backoff_then_succeeds():
    sleeps: list[float] = []
    calls = []

    def job(attempt: int) -> str:
        calls.append(attempt)
        if attempt < 3:
            raise ConcurrentAppendException(f"attempt {attempt}")
        return "done"

    outcome = RetryOutcome()
    policies = resolve_policies(DEFAULT_POLICIES, {"ConcurrentAppendException": {"initial_delay": 0.5,
                                                                                 "jitter": 0.0}})
    assert run_with_policies(job, policies, outcome=outcome, sleep=sleeps.append) == "done"
    assert calls == [1, 2, 3] and sleeps == [0.5, 1.0]
    assert [c.kind for c in outcome.conflicts] == ["ConcurrentAppendException"] * 2


def test_gives_up_after_max_attempts_with_advice():
    def job(attempt: int) -> None:
        raise ConcurrentAppendException("files added in partition [date=2024-01-01]")

    policies = resolve_policies(DEFAULT_POLICIES, {"ConcurrentAppendException": {"max_attempts": 2}})
    with pytest.raises(ConflictFailure, match="partitions=") as info:
        run_with_policies(job, policies, sleep=lambda s: None)
    assert info.value.attempts == 2 and info.value.kind is ConflictKind.APPEND


def test_fail_policy_fails_at_once_and_skip_skips():
    calls = []

    def job(attempt: int) -> None:
        calls.append(attempt)
        raise FakeConnectError("DELTA_PROTOCOL_CHANGED")

    with pytest.raises(ConflictFailure, match="create tables"):
        run_with_policies(job, DEFAULT_POLICIES, sleep=lambda s: None)
    assert calls == [1]

    def compaction(attempt: int) -> None:
        raise FakeConnectError("DELTA_CONCURRENT_DELETE_DELETE")

    with pytest.raises(ConflictSkipped):
        run_with_policies(compaction, OPTIMIZE_POLICIES, sleep=lambda s: None)


def test_non_conflicts_are_never_retried():
    calls = []

    def job(attempt: int) -> None:
        calls.append(attempt)
        raise KeyError("missing column")

    with pytest.raises(KeyError):
        run_with_policies(job, DEFAULT_POLICIES, sleep=lambda s: None)
    assert calls == [1]


def test_policy_overrides_are_validated():
    assert resolve_policies(DEFAULT_POLICIES, {"DELTA_CONCURRENT_APPEND": "skip"})[ConflictKind.APPEND].action \
        is Action.SKIP
    with pytest.raises(ValueError, match="unknown conflict"):
        resolve_policies(DEFAULT_POLICIES, {"ConcurrentAppend": "retry"})
    with pytest.raises(ValueError):
        resolve_policies(DEFAULT_POLICIES, {"ConcurrentAppendException": "sometimes"})
    with pytest.raises(ValueError):
        resolve_policies(DEFAULT_POLICIES, {"ConcurrentAppendException": {"tries": 3}})
    with pytest.raises(ValueError):
        ConflictPolicy(max_attempts=0)


def test_platform_and_task_overrides_layer_field_by_field():
    platform = {"DELTA_CONCURRENT_APPEND": {"max_attempts": 9, "initial_delay": 2.0},
                "MetadataChangedException": "fail"}
    task = {"ConcurrentAppendException": {"initial_delay": 0.5}, "MetadataChangedException": {"action": "retry"}}
    layered = layer_overrides(platform, task)
    assert layered == {"ConcurrentAppendException": {"max_attempts": 9, "initial_delay": 0.5},
                       "MetadataChangedException": {"action": "retry"}}
    policies = resolve_policies(DEFAULT_POLICIES, layered)
    assert policies[ConflictKind.APPEND] == replace(DEFAULT_POLICIES[ConflictKind.APPEND], max_attempts=9,
                                                    initial_delay=0.5)
    assert json.loads(json.dumps(layer_overrides({"ConcurrentDeleteDeleteException": ConflictPolicy(Action.SKIP)})))[
        "ConcurrentDeleteDeleteException"]["action"] == "skip"  # plain JSON for the JobSpec
    for bad in ({"ConcurrentAppend": "retry"}, {"ConcurrentAppendException": 3},
                {"ConcurrentAppendException": {"max_attempts": 0}}, {"ConcurrentAppendException": "sometimes"}):
        with pytest.raises(ValueError, match="ConcurrentAppend"):
            layer_overrides(bad)


def test_jitter_stays_in_bounds():
    policy = ConflictPolicy(initial_delay=1.0, multiplier=2.0, max_delay=5.0, jitter=0.5)
    random.seed(7)  # tenacity's wait_random draws from the module's generator
    delays = [policy.delay(n) for n in range(1, 8)]
    assert all(lo <= d <= lo + 0.5 for d, lo in zip(delays, [1, 2, 4, 5, 5, 5, 5], strict=True))
    assert len({round(d - lo, 9) for d, lo in zip(delays, [1, 2, 4, 5, 5, 5, 5], strict=True)}) > 1  # jittered


@pytest.mark.parametrize("fields", [
    {"initial_delay": 1.0, "multiplier": 2.0, "max_delay": 60.0},
    {"initial_delay": 0.25, "multiplier": 3.0, "max_delay": 10.0},
    {"initial_delay": 0.5, "multiplier": 1.0, "max_delay": 0.2},
    {"initial_delay": 0.0, "multiplier": 5.0, "max_delay": 60.0},
    {"initial_delay": 2.0, "multiplier": 10.0, "max_delay": 0.0},
    {"initial_delay": 1.0, "multiplier": 10.0, "max_delay": 30.0},   # the steepest growth a policy accepts
])
def test_tenacity_backoff_is_the_bounded_exponential(fields):
    """The policy's wait (tenacity's wait_exponential + wait_random) keeps the documented formula:
    min(max_delay, initial_delay * multiplier ** (attempt - 1)), plus jitter, never above the bound."""
    policy = ConflictPolicy(jitter=0.0, max_attempts=100, **fields)
    for attempt in range(1, 100):
        try:
            expected = min(fields["max_delay"], fields["initial_delay"] * fields["multiplier"] ** (attempt - 1))
        except OverflowError:
            expected = fields["max_delay"]
        assert policy.delay(attempt) == pytest.approx(expected), attempt


def test_every_conflict_and_backoff_is_logged_before_the_next_attempt(caplog):
    """Each conflict is logged as it happens, with its kind, attempt, the winning version Delta names
    and the backoff; a retried one before the sleep (so before the next attempt starts), the final one
    before its exception is raised."""
    events: list[str] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            events.append(f"log:{record.getMessage()}")

    def job(attempt: int) -> None:
        events.append(f"attempt:{attempt}")
        raise ConcurrentAppendException(
            "[DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT] Transaction conflict detected. a concurrent MERGE added "
            f"data to table delta.`/lake/sales` committed at version {6 + attempt}.")

    recorder = Recorder()
    policy_log = logging.getLogger("airflow_delta_occ.retry.policy")
    policy_log.addHandler(recorder)
    outcome = RetryOutcome()
    policies = resolve_policies(DEFAULT_POLICIES, {"ConcurrentAppendException": {
        "max_attempts": 3, "initial_delay": 0.5, "jitter": 0.0}})
    try:
        with caplog.at_level(logging.INFO, logger="airflow_delta_occ.retry.policy"), \
                pytest.raises(ConflictFailure):
            run_with_policies(job, policies, outcome=outcome, sleep=lambda s: events.append(f"sleep:{s}"),
                              what="/lake/sales")
    finally:
        policy_log.removeHandler(recorder)
    assert events == [
        "attempt:1",
        "log:ConcurrentAppendException on /lake/sales (attempt 1 of 3, winning version 7): retrying in 0.50 s",
        "sleep:0.5",
        "attempt:2",
        "log:ConcurrentAppendException on /lake/sales (attempt 2 of 3, winning version 8): retrying in 1.00 s",
        "sleep:1.0",
        "attempt:3",
        "log:ConcurrentAppendException on /lake/sales (attempt 3 of 3, winning version 9): giving up, no attempts left",
    ]
    records = [r.delta_occ_conflict for r in caplog.records]  # the typed record rides on each log line
    assert records == list(outcome.conflicts)
    assert [(c.attempt, c.kind, c.action, c.delay, c.winning_version) for c in records] == [
        (1, ConflictKind.APPEND, "retry", 0.5, 7), (2, ConflictKind.APPEND, "retry", 1.0, 8),
        (3, ConflictKind.APPEND, "gave up", 0.0, 9)]
    assert [r.levelno for r in caplog.records] == [logging.WARNING] * 3


def test_fail_and_skip_conflicts_are_logged_too(caplog):
    with caplog.at_level(logging.INFO, logger="airflow_delta_occ.retry.policy"):
        with pytest.raises(ConflictFailure):
            run_with_policies(lambda attempt: (_ for _ in ()).throw(FakeConnectError("DELTA_PROTOCOL_CHANGED")),
                              DEFAULT_POLICIES, sleep=lambda s: None, what="t")
        with pytest.raises(ConflictSkipped):
            run_with_policies(lambda attempt: (_ for _ in ()).throw(FakeConnectError("DELTA_CONCURRENT_DELETE_READ")),
                              OPTIMIZE_POLICIES, sleep=lambda s: None, what="t")
    assert [r.getMessage() for r in caplog.records] == [
        "ProtocolChangedException on t (attempt 1 of 1): not retried, its policy is fail",
        "ConcurrentDeleteReadException on t (attempt 1 of 1): skipped, as its policy says (the work is already done)"]
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO]


@pytest.mark.parametrize(("message", "version"), [
    ("Transaction conflict detected. a concurrent MERGE added data to table t committed at version 12.", 12),
    ("a concurrent DELETE deleted data from table t (committed at version 3) that this transaction read.", 3),
    ('MetadataChangedException: ... Please try the operation again.\nConflicting commit: {"timestamp":1,'
     '"operation":"SET TBLPROPERTIES","version":41,"isBlindAppend":true}', 41),
    ("ConcurrentAppendException: winning version 5 (MERGE) added files", 5),
    ("ConcurrentWriteException: A concurrent transaction has written new data.", None),
])
def test_winning_version_is_read_from_the_message(message, version):
    assert winning_version(message) == version


def test_each_conflict_records_how_long_its_lost_attempt_ran():
    """The Spark work a conflict threw away is in the result: the seconds its attempt ran, not the backoff."""
    now = [100.0]

    def job(attempt: int) -> str:
        now[0] += 2.5 if attempt == 1 else 4.0  # the attempt's Spark work
        if attempt < 3:
            raise ConcurrentAppendException(f"attempt {attempt}")
        return "done"

    def sleep(seconds: float) -> None:
        now[0] += seconds  # backoff is not lost work

    outcome = RetryOutcome()
    policies = resolve_policies(DEFAULT_POLICIES, {"ConcurrentAppendException": {"initial_delay": 7.0,
                                                                                 "jitter": 0.0}})
    assert run_with_policies(job, policies, outcome=outcome, sleep=sleep, clock=lambda: now[0]) == "done"
    assert [c.seconds for c in outcome.conflicts] == [2.5, 4.0]
    assert outcome.lost_seconds == 6.5


def test_an_unknown_policy_field_names_the_fields_there_are():
    with pytest.raises(ValueError, match=r"unknown field 'tries'; a policy's fields are action, max_attempts, "
                                         r"initial_delay, max_delay, multiplier, jitter") as refused:
        resolve_policies(DEFAULT_POLICIES, {"ConcurrentAppendException": {"tries": 3}})
    assert "__init__" not in str(refused.value)
