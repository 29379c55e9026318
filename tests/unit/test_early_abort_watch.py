"""Early abort around the judge: which jobs are certain to commit, the pinned read version, the watch of one
attempt (with a stand-in for Spark, on a real log), the options and arguments that turn it on, and how a stopped
attempt is recorded and retried. (tests/spark/test_early_abort.py runs it on real Spark.)"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_delta_occ import config
from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.errors import ConflictKind
from airflow_delta_occ.engine.expressions import Column, Comparison, Literal
from airflow_delta_occ.engine.sql_parser import parse_predicate
from airflow_delta_occ.exceptions import ConflictFailure, JobSpecError, JobStoppedEarly, ProviderConfigError
from airflow_delta_occ.jobs.footprint import CommitCertainty, asks_for_source_rows, commit_certainty, running_commit_of
from airflow_delta_occ.jobs.operations import ClauseKind, JobOperation
from airflow_delta_occ.jobs.result import JobResult, JobStatus
from airflow_delta_occ.jobs.spec import JobSpec, MergeClause, RunIdentity, SourceRef, TableRef
from airflow_delta_occ.jobs.sql import matching_row_sql
from airflow_delta_occ.operators.delta import DeltaMergeOperator
from airflow_delta_occ.retry.policy import RetryOutcome, policies_for, run_with_policies
from airflow_delta_occ.spark.early_abort import AttemptWatch, EarlyAbort, TableWatch, pin_version

from .engine.logbuilder import LogBuilder, add, commit_info, metadata, protocol, txn

pytestmark = pytest.mark.unit

DE = {"date": "2024-01-01", "country": "DE"}
FR = {"date": "2024-01-01", "country": "FR"}
RUN = RunIdentity("d", "t", "r")


def _merge(*clauses: MergeClause) -> JobSpec:
    condition = Comparison("=", Column("country", "t"), Literal("DE"))
    return JobSpec(operation=JobOperation.MERGE, target=TableRef(path="/t"), run=RUN, source=SourceRef(path="/s"),
                   condition=condition, clauses=clauses)


def test_only_jobs_certain_to_commit_are_watched():
    certain, unknown = CommitCertainty.CERTAIN, CommitCertainty.UNKNOWN
    both = _merge(MergeClause(ClauseKind.MATCHED_UPDATE_ALL), MergeClause(ClauseKind.NOT_MATCHED_INSERT_ALL))
    assert commit_certainty(both, True) is certain and asks_for_source_rows(both)
    assert commit_certainty(both, False) is unknown and commit_certainty(both, None) is unknown
    # A source row that matches nothing, or matches only a conditional clause, changes nothing: no commit.
    assert commit_certainty(_merge(MergeClause(ClauseKind.NOT_MATCHED_INSERT_ALL)), True) is unknown
    conditional = MergeClause(ClauseKind.MATCHED_DELETE, condition=Comparison("=", Column("v", "s"), Literal(1)))
    assert commit_certainty(_merge(conditional, MergeClause(ClauseKind.NOT_MATCHED_INSERT_ALL)), True) is unknown
    append = JobSpec(operation=JobOperation.APPEND, target=TableRef(path="/t"), run=RUN, source=SourceRef(path="/s"))
    assert commit_certainty(append, True) is certain
    assert commit_certainty(append, False) is unknown   # an empty append may skip its commit
    optimize = JobSpec(operation=JobOperation.OPTIMIZE, target=TableRef(path="/t"), run=RUN)
    # A compaction commits when its bin packing surely rewrites a file holding a row, read from the log per attempt.
    assert commit_certainty(optimize, None) is CommitCertainty.IF_IT_SURELY_REWRITES
    assert not asks_for_source_rows(optimize)


def test_an_update_or_delete_is_certain_once_a_row_meets_a_condition_the_engine_understands():
    """Certain only if a row matches at the read version (asked of Spark per attempt), and only for a condition
    free of function calls: a row that meets ``rand() < 0.5`` once may not meet it in the statement."""
    understood = parse_predicate("country = 'DE' AND (v > 3 OR v IS NULL) AND id IN (1, 2)")
    for operation in (JobOperation.UPDATE, JobOperation.DELETE):
        spec = JobSpec(operation=operation, target=TableRef(path="/t"), run=RUN, condition=understood,
                       set={"v": Literal(1)} if operation is JobOperation.UPDATE else {})
        assert commit_certainty(spec, None) is CommitCertainty.IF_A_ROW_MATCHES and not asks_for_source_rows(spec)
        assert matching_row_sql(spec, 7) == (
            f"SELECT 1 FROM delta.`/t` VERSION AS OF 7 WHERE {spec.condition_sql} LIMIT 1")
        for called in ("country = 'DE' AND rand() < 0.5", "country = 'DE' AND lower(name) = 'x'"):
            assert commit_certainty(replace(spec, condition=parse_predicate(called)), None) is CommitCertainty.UNKNOWN
    every_row = JobSpec(operation=JobOperation.DELETE, target=TableRef(name="db.t"), run=RUN)
    assert commit_certainty(every_row, None) is CommitCertainty.IF_A_ROW_MATCHES
    assert matching_row_sql(every_row, 0) == "SELECT 1 FROM `db`.`t` VERSION AS OF 0 LIMIT 1"


def test_the_read_version_is_pinned_when_two_reads_agree():
    reads = iter([4, 5, 5])
    assert pin_version(lambda: next(reads)) == 5
    moving = iter(range(10))
    assert pin_version(lambda: next(moving), tries=3) is None
    # The watch's own listing is the first read: one history read that agrees with it pins the version ...
    history = iter([7])
    assert pin_version(lambda: next(history), listed=7) == 7
    # ... and one that names a newer version starts the pairs over from the history reads.
    history = iter([8, 8])
    assert pin_version(lambda: next(history), listed=7) == 8
    history = iter([8, 9])
    assert pin_version(lambda: next(history), tries=2, listed=7) is None


class _Work:
    """Stands in for an attempt's Spark work: started when the test says, counts its cancels."""

    def __init__(self) -> None:
        self.began = threading.Event()
        self.broke = threading.Event()
        self.cancels = 0

    def started(self) -> bool:
        return self.began.is_set()

    def failed(self) -> bool:
        return self.broke.is_set()

    def cancel(self) -> None:
        self.cancels += 1


def _table(tmp_path):
    b = LogBuilder(tmp_path / "t")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata())
    b.commit(commit_info(), add("de-0.parquet", DE), add("fr-0.parquet", FR))
    return b


def _watch(b, version=1):
    log = DeltaLog.for_table(b.root)
    running = running_commit_of(_merge(MergeClause(ClauseKind.MATCHED_UPDATE_ALL),
                                       MergeClause(ClauseKind.NOT_MATCHED_INSERT_ALL)),
                                log.snapshot(version), commits=True)
    work = _Work()
    own = lambda commit: commit.commit_info is not None and commit.commit_info.user_metadata == "mine"  # noqa: E731
    return AttemptWatch(log, running, work, interval=0.02, own=own), work


def _until(condition, seconds=20.0):   # generous: a loaded machine delays the watch thread
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_fatal_commit_is_judged_only_after_the_work_began_and_cancelled_until_the_attempt_ends(tmp_path):
    b = _table(tmp_path)
    watch, work = _watch(b)
    watch.start()
    time.sleep(0.1)
    assert not watch.report.judged and work.cancels == 0   # no Spark work yet: the version read is not known
    work.began.set()
    _until(lambda: watch.report.judged)
    b.commit(commit_info("WRITE"), add("fr-1.parquet", FR))   # another partition: judged, not fatal
    _until(lambda: watch.report.commits_seen == 1)
    assert watch.report.found is None and work.cancels == 0
    b.commit(commit_info("MERGE"), add("de-1.parquet", DE))
    _until(lambda: work.cancels >= 3)   # again at every interval while the statement has not returned
    report = watch.stop()
    assert report.found is not None and report.found.version == 3 and report.found.kind is ConflictKind.APPEND
    assert report.cancelled_after is not None and report.found_after is not None


def test_the_jobs_own_commit_ends_the_watch_and_is_never_judged(tmp_path):
    # Found in the log before the statement returns (a checkpoint, a Connect response still on its way): judged
    # as a winner it would doom the job's own success, and the cancel would turn it into an error and a retry.
    b = _table(tmp_path)
    watch, work = _watch(b)
    work.began.set()
    watch.start()
    _until(lambda: watch.report.judged)
    b.commit(commit_info("MERGE", userMetadata="mine"), add("de-1.parquet", DE))
    b.commit(commit_info("MERGE"), add("de-2.parquet", DE))
    _until(lambda: watch.report.committed)
    time.sleep(0.1)
    report = watch.stop()
    assert report.found is None and work.cancels == 0 and report.commits_seen == 0


def test_a_failed_spark_job_stops_the_judging(tmp_path):
    # delta-spark may re-run a MERGE whose materialised source was lost in a new transaction, which reads a newer
    # version than the one pinned: from then on no commit is judged.
    b = _table(tmp_path)
    watch, work = _watch(b)
    work.began.set()
    watch.start()
    _until(lambda: watch.report.judged)
    work.broke.set()
    _until(lambda: watch.report.not_judged is not None)
    b.commit(commit_info("MERGE"), add("de-1.parquet", DE))
    time.sleep(0.1)
    report = watch.stop()
    assert report.found is None and work.cancels == 0 and "failed" in (report.not_judged or "")


def test_a_commit_before_the_work_was_seen_leaves_the_attempt_unjudged(tmp_path):
    # It may have landed before the transaction read the log: it may be in its snapshot, not a winner.
    b = _table(tmp_path)
    watch, work = _watch(b)
    watch.start()
    b.commit(commit_info("MERGE"), add("de-1.parquet", DE))
    work.began.set()
    _until(lambda: watch.report.not_judged is not None)
    report = watch.stop()
    assert not report.judged and report.found is None and work.cancels == 0
    assert "version 2 landed before" in (report.not_judged or "")


def test_a_stopped_attempt_is_retried_as_its_conflict_and_recorded_as_early():
    calls = []

    def attempt(n: int) -> str:
        calls.append(n)
        if n == 1:
            raise JobStoppedEarly("ConcurrentAppendException foreseen ...", kind=ConflictKind.APPEND, version=7,
                                  operation="WRITE")
        return "done"

    outcome = RetryOutcome()
    assert run_with_policies(attempt, policies_for("merge", {"ConcurrentAppendException": {"initial_delay": 0.0,
                                                                                          "jitter": 0.0}}),
                             outcome=outcome, sleep=lambda _: None) == "done"
    record = outcome.conflicts[0]
    assert calls == [1, 2] and record.early and record.winning_version == 7 and record.winning_operation == "WRITE"
    assert "foreseen and stopped early" in record.describe("/t", 5)
    result = JobResult(status=JobStatus.SUCCESS, table="/t", operation="merge", conflicts=(record,))
    assert JobResult.from_json(result.to_json()).conflicts == (record,)
    # Attempts that run out end as the conflict's failure, which Airflow's retry policy decides on.
    with pytest.raises(ConflictFailure) as failed:
        run_with_policies(lambda n: attempt(1), policies_for("merge", {"ConcurrentAppendException": "fail"}),
                          sleep=lambda _: None)
    assert failed.value.kind is ConflictKind.APPEND


def test_options_and_arguments(monkeypatch):
    monkeypatch.delenv("AIRFLOW__DELTA_OCC__EARLY_ABORT", raising=False)
    monkeypatch.delenv("AIRFLOW__DELTA_OCC__EARLY_ABORT_INTERVAL", raising=False)
    assert config.early_abort() is True and config.early_abort_interval() == 1.0   # on unless turned off
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__EARLY_ABORT", "false")
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__EARLY_ABORT_INTERVAL", "2.5")
    assert config.early_abort() is False and config.early_abort_interval() == 2.5
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__EARLY_ABORT", "On")
    assert config.early_abort() is True
    for bad in ("0", "-1", "61", "nan", "soon", ""):
        monkeypatch.setenv("AIRFLOW__DELTA_OCC__EARLY_ABORT_INTERVAL", bad)
        with pytest.raises(ProviderConfigError, match=r"\[delta_occ\] early_abort_interval"):
            config.early_abort_interval()
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__EARLY_ABORT", "maybe")
    with pytest.raises(ProviderConfigError, match=r"\[delta_occ\] early_abort is 'maybe'"):
        config.early_abort()
    # Refused when the DAG is parsed.
    kwargs = {"task_id": "m", "table": "/t", "source": "/s", "merge_condition": "t.id = s.id"}
    with pytest.raises(JobSpecError, match="early_abort must be"):
        DeltaMergeOperator(**kwargs, early_abort="yes")
    for bad in (0, 0.05, -1.0, 120, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ProviderConfigError, match="early_abort_interval must be"):
            DeltaMergeOperator(**kwargs, early_abort_interval=bad)
    op = DeltaMergeOperator(**kwargs, early_abort=True, early_abort_interval=0.5)
    assert (op.early_abort, op.early_abort_interval) == (True, 0.5)


def test_the_exception_survives_pickling_with_its_fields():
    import pickle

    stopped = JobStoppedEarly("m", kind=ConflictKind.DELETE_READ, version=3, operation="OPTIMIZE")
    exc = pickle.loads(pickle.dumps(stopped))
    assert (exc.kind, exc.version, exc.operation, str(exc)) == (ConflictKind.DELETE_READ, 3, "OPTIMIZE", "m")
    assert json.loads(json.dumps({"kind": exc.kind}))["kind"] == "ConcurrentDeleteReadException"


def test_a_pooled_jobs_early_stop_is_in_the_release_audit_line(tmp_path):
    from airflow_delta_occ.engine.planner import TableState, plan_footprint
    from airflow_delta_occ.pools.holding import HeldLease, holding
    from airflow_delta_occ.pools.leases.memory import MemoryLeaseStore
    from airflow_delta_occ.pools.requests import AuditKind, LeaseRequest

    snapshot = DeltaLog.for_table(_table(tmp_path).root).snapshot()
    store = MemoryLeaseStore()
    request = LeaseRequest.of(pool="p", table="t", owner="o", footprint=plan_footprint(snapshot, "UPDATE", None),
                              table_state=TableState.of(snapshot), ttl=30.0)
    state = store.acquire(request)
    assert state.granted
    lease = HeldLease(pool="p", request_id=state.request_id, owner="o", waited=0.0)
    with holding(store, lease, 5.0, __import__("logging").getLogger("test")):
        lease.release_note = "attempt 1 stopped early by version 7 (WRITE): ConcurrentAppendException"
    released = [e for e in store.history(pool="p") if e.kind is AuditKind.RELEASE]
    assert released and released[0].detail.startswith("held ")
    assert released[0].detail.endswith("; attempt 1 stopped early by version 7 (WRITE): ConcurrentAppendException")


# -- EarlyAbort.attempt end to end, with a stand-in for Spark on a real log ----------------------------------

class _Attempt(_Work):
    """An attempt's Spark work as ``EarlyAbort.attempt`` drives it: tagged, and ended by a cancel it recognises."""

    def __init__(self) -> None:
        super().__init__()
        self.tags = 0
        self.began.set()

    @contextlib.contextmanager
    def tagged(self):
        self.tags += 1
        yield

    def ended_by_cancel(self, error: BaseException) -> bool:
        return str(error) == "cancelled"


@pytest.fixture(autouse=True)
def _watch_logs(caplog):
    caplog.set_level("INFO", logger="airflow_delta_occ.spark.early_abort")


def _early(b, work, *, idempotent=True):
    spec = replace(_merge(MergeClause(ClauseKind.MATCHED_UPDATE_ALL), MergeClause(ClauseKind.NOT_MATCHED_INSERT_ALL)),
                   idempotent=idempotent)
    watch = TableWatch(open_log=lambda: DeltaLog.for_table(b.root), interval=0.02)
    return EarlyAbort(spec, watch, work_for=lambda _session: work), spec


def _newest(b):
    return lambda: DeltaLog.for_table(b.root).latest_version()


def _judging(caplog):
    """Wait until the watch has confirmed the version the attempt read (a commit after that is a winner)."""
    _until(lambda: "Early abort judges this attempt" in caplog.text)


def _doomed(b, caplog, work, file):
    """Inside an attempt: once judged, a commit in the job's partition lands and the watch cancels the work."""
    _judging(caplog)
    b.commit(commit_info("MERGE"), add(file, DE))
    _until(lambda: work.cancels > 0)


def test_a_doomed_attempt_is_cancelled_and_raised_as_its_conflict(tmp_path, caplog):
    b = _table(tmp_path)
    work = _Attempt()
    early, _ = _early(b, work)
    with pytest.raises(JobStoppedEarly) as stopped:
        with early.attempt(None, _newest(b)):
            _doomed(b, caplog, work, "de-1.parquet")
            raise RuntimeError("cancelled")
    assert stopped.value.kind is ConflictKind.APPEND and stopped.value.version == 2 and work.tags == 1
    assert early.reports[0].found is not None and early.reports[0].cancelled_after is not None


def test_an_error_that_is_not_the_cancel_stays_itself(tmp_path, caplog):
    # A verdict was reached, but the statement ended with its own error (a constraint, an outage): not a conflict.
    b = _table(tmp_path)
    work = _Attempt()
    early, _ = _early(b, work)
    with pytest.raises(ValueError, match="a row matched twice"):
        with early.attempt(None, _newest(b)):
            _doomed(b, caplog, work, "de-1.parquet")
            raise ValueError("a row matched twice")


def test_a_statement_that_committed_before_the_cancel_reached_it_succeeded(tmp_path, caplog):
    # The commit happened: raising a conflict now would retry a job that wrote (and write twice without idempotency).
    b = _table(tmp_path)
    work = _Attempt()
    early, spec = _early(b, work)
    with early.attempt(None, _newest(b)):
        _doomed(b, caplog, work, "de-1.parquet")
        b.commit(commit_info("MERGE", userMetadata=spec.run.user_metadata()), add("de-2.parquet", DE))
        raise RuntimeError("cancelled")
    assert "yet its statement committed" in caplog.text


def test_an_attempt_whose_earlier_try_committed_runs_unwatched(tmp_path, caplog):
    """An idempotent job whose app id the table holds (an earlier try, in this Airflow try or another) commits
    nothing: Delta skips its write. Not watched, so a foreign commit cannot cancel a no-op."""
    b = _table(tmp_path)
    work = _Attempt()
    early, spec = _early(b, work)
    b.commit(commit_info("MERGE", userMetadata=spec.run.user_metadata()), txn(spec.run.app_id, 0),
             add("de-1.parquet", DE))
    with early.attempt(None, _newest(b)):
        b.commit(commit_info("MERGE"), add("de-2.parquet", DE))
        time.sleep(0.1)
    assert work.tags == 0 and work.cancels == 0 and "an earlier try of this task run committed" in caplog.text
    # Not idempotent: a re-run writes again, so it commits and is watched.
    again, _ = _early(b, work, idempotent=False)
    with pytest.raises(JobStoppedEarly):
        with again.attempt(None, _newest(b)):
            _doomed(b, caplog, work, "de-3.parquet")
            raise RuntimeError("cancelled")


def test_an_update_is_watched_only_when_a_row_meets_its_condition_at_the_pinned_version(tmp_path, caplog):
    b = _table(tmp_path)
    update = JobSpec(operation=JobOperation.UPDATE, target=TableRef(path=str(b.root)), run=RUN,
                     condition=parse_predicate("country = 'DE' AND id > 3"), set={"id": Literal(1)})
    asked: list[str] = []
    answer: list[int] = []   # the LIMIT 1 query's rows

    class Session:
        def sql(self, text: str) -> Any:
            asked.append(text)
            return type("Frame", (), {"collect": lambda _self: list(answer)})()

    work = _Attempt()
    watch = TableWatch(open_log=lambda: DeltaLog.for_table(b.root), interval=0.02)
    early = EarlyAbort(update, watch, CommitCertainty.IF_A_ROW_MATCHES, work_for=lambda _session: work)
    with early.attempt(Session(), _newest(b)):
        pass
    assert work.tags == 0 and asked == [matching_row_sql(update, 1)] and "no row meets its condition" in caplog.text
    answer.append(1)
    with pytest.raises(JobStoppedEarly):
        with early.attempt(Session(), _newest(b)):
            _doomed(b, caplog, work, "de-1.parquet")
            raise RuntimeError("cancelled")
    assert work.tags == 1 and asked[-1] == matching_row_sql(update, 1)


def test_an_update_whose_row_the_logs_statistics_show_asks_spark_nothing(tmp_path, caplog):
    """Every row of the DE file has id 5 to 9 (no NULL): the log shows a row meets ``id > 3``, so the statement is
    certain to commit without a query; a condition the statistics cannot show is asked of Spark as before."""
    b = LogBuilder(tmp_path / "t")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata())
    stats = {"numRecords": 4, "minValues": {"id": 5}, "maxValues": {"id": 9}, "nullCount": {"id": 0}}
    b.commit(commit_info(), add("de-0.parquet", DE, stats=stats), add("fr-0.parquet", FR))
    asked: list[str] = []

    class Session:
        def sql(self, text: str) -> Any:
            asked.append(text)
            return type("Frame", (), {"collect": lambda _self: []})()

    def early_for(condition: str) -> tuple[EarlyAbort, _Attempt]:
        update = JobSpec(operation=JobOperation.UPDATE, target=TableRef(path=str(b.root)), run=RUN,
                         condition=parse_predicate(condition), set={"id": Literal(1)})
        work = _Attempt()
        watch = TableWatch(open_log=lambda: DeltaLog.for_table(b.root), interval=0.02)
        return EarlyAbort(update, watch, CommitCertainty.IF_A_ROW_MATCHES, work_for=lambda _session: work), work

    early, work = early_for("country = 'DE' AND id > 3")
    with pytest.raises(JobStoppedEarly):
        with early.attempt(Session(), _newest(b)):
            _doomed(b, caplog, work, "de-1.parquet")
            raise RuntimeError("cancelled")
    assert asked == [] and "a row meets its condition at version 1 (from the log's statistics" in caplog.text
    early, work = early_for("country = 'DE' AND id > 5")   # some row may, or none: Spark says none
    with early.attempt(Session(), _newest(b)):
        pass
    assert len(asked) == 1 and work.tags == 0 and "(asked of Spark" in caplog.text


def test_a_cancel_while_the_watch_is_set_up_stops_the_attempt(tmp_path):
    """A kill that cancels the LIMIT 1 query must not let the statement start with early abort off."""
    b = _table(tmp_path)
    update = JobSpec(operation=JobOperation.UPDATE, target=TableRef(path=str(b.root)), run=RUN,
                     condition=parse_predicate("country = 'DE'"), set={"id": Literal(1)})

    class Killed:
        def sql(self, text: str) -> Any:
            raise RuntimeError("[SPARK_JOB_CANCELLED] Job 3 cancelled part of cancelled job tag delta-occ-1")

    work = _Attempt()
    watch = TableWatch(open_log=lambda: DeltaLog.for_table(b.root), interval=0.02)
    early = EarlyAbort(update, watch, CommitCertainty.IF_A_ROW_MATCHES, work_for=lambda _session: work)
    ran = []
    with pytest.raises(RuntimeError, match="SPARK_JOB_CANCELLED"):
        with early.attempt(Killed(), _newest(b)):
            ran.append(True)
    assert ran == [] and work.tags == 0


def test_a_kill_ends_the_watch_with_the_attempt(tmp_path):
    b = _table(tmp_path)
    work = _Attempt()
    early, _ = _early(b, work)
    with pytest.raises(KeyboardInterrupt):
        with early.attempt(None, _newest(b)):
            raise KeyboardInterrupt
    assert len(early.reports) == 1 and early.reports[0].found is None
    b.commit(commit_info("MERGE"), add("de-1.parquet", DE))
    time.sleep(0.1)
    assert work.cancels == 0   # the watch thread is gone


def test_the_row_query_quotes_hostile_names_and_never_reaches_spark_with_substitution_text(tmp_path):
    """The LIMIT 1 query passes through Spark's text handling like the statement: a backtick in the table path
    stays inside its quoted name, quotes in a condition stay one literal (Spark joins adjacent string literals, and
    so does the parser the text is rendered from), and a ``${`` (which Spark's variable
    substitution would rewrite before parsing) is refused before the session sees the text."""
    from airflow_delta_occ.exceptions import StatementTextError
    from airflow_delta_occ.spark.statements import run_sql

    hostile = JobSpec(operation=JobOperation.DELETE, target=TableRef(path="/t` WHERE 1=1; --"), run=RUN,
                      condition=parse_predicate("country = 'DE'' OR ''1''=''1' AND id = 1"))
    text = matching_row_sql(hostile, 3)
    assert text.startswith("SELECT 1 FROM delta.`/t`` WHERE 1=1; --` VERSION AS OF 3 WHERE ")
    assert text.endswith("WHERE `country` = 'DE OR 1=1' AND `id` = 1 LIMIT 1"), text
    with pytest.raises(StatementTextError):   # the spec refuses it first ...
        replace(hostile, condition=Comparison("=", Column("country"), Literal("${spark.app.name}")))
    seen: list[str] = []

    class Session:
        def sql(self, text: str) -> Any:
            seen.append(text)
            raise AssertionError("the text reached Spark")

    with pytest.raises(StatementTextError):   # ... and the last check before Spark again
        run_sql(Session(), text.replace("'DE OR 1=1'", "'${spark.app.name}'"))
    assert seen == []


def test_an_optimizes_settings_are_the_sessions_own_or_delta_sparks_defaults() -> None:
    """``conf.get(key, None)``: the session's own value (a cluster default included) or ``None`` (measured on
    delta-spark 4.4: ``get(key)`` raises before delta-spark has registered the setting); a read that fails raises,
    so the watch is off rather than guessing a size."""
    from airflow_delta_occ.engine.compaction import MIN_FILE_SIZE_CONF, CompactionSettings
    from airflow_delta_occ.spark.early_abort import compaction_settings

    class Conf:
        def __init__(self, values: dict[str, str], fail: bool = False) -> None:
            self.values, self.fail, self.asked = values, fail, []

        def get(self, key: str, default: Any = "no default given") -> Any:
            self.asked.append((key, default))
            if self.fail:
                raise RuntimeError("the Spark Connect server is gone")
            return self.values.get(key, default)

    conf = Conf({MIN_FILE_SIZE_CONF: "1048576"})
    assert compaction_settings(SimpleNamespace(conf=conf)) == CompactionSettings(min_file_size=1048576)
    assert all(default is None for _, default in conf.asked)
    with pytest.raises(RuntimeError):
        compaction_settings(SimpleNamespace(conf=Conf({}, fail=True)))


def test_an_optimize_is_watched_only_when_its_task_asks(monkeypatch):
    """A later commit that puts back a file a compaction rewrites (a RESTORE) would let delta-spark's retry commit
    it after all: its verdict is not as sure as Delta's own check, so the default (on) does not watch it."""
    from airflow_delta_occ.jobs.operations import JobOperation
    from airflow_delta_occ.operators.delta import DeltaOptimizeOperator, DeltaUpdateOperator

    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_DEFAULT", json.dumps({"conn_type": "delta_occ",
                                                                     "extra": {"mode": "embedded"}}))
    monkeypatch.delenv("AIRFLOW__DELTA_OCC__EARLY_ABORT", raising=False)

    def prepared(operation: JobOperation) -> SimpleNamespace:
        return SimpleNamespace(spec=SimpleNamespace(operation=operation), location="/t")

    import structlog.testing

    optimize = DeltaOptimizeOperator(task_id="o", table="/t")
    with structlog.testing.capture_logs() as lines:
        assert optimize._table_watch(prepared(JobOperation.OPTIMIZE)) is None
    assert any("watched only when its task asks (early_abort=True)" in str(e["event"]) for e in lines), lines
    asked = DeltaOptimizeOperator(task_id="o", table="/t", early_abort=True, early_abort_interval=0.5)
    watch = asked._table_watch(prepared(JobOperation.OPTIMIZE))
    assert watch is not None and watch.interval == 0.5
    update = DeltaUpdateOperator(task_id="u", table="/t", set={"v": "1"})
    assert update._table_watch(prepared(JobOperation.UPDATE)) is not None   # the others: on by default
    assert DeltaOptimizeOperator(task_id="o", table="/t", early_abort=False)._table_watch(
        prepared(JobOperation.OPTIMIZE)) is None
