"""Early abort while a job's statement runs: watch the table's log, judge each new commit with the engine's
commit-time rules, and cancel the job's Spark work as soon as its commit is certain to fail.

The judge (``engine.early_abort``) needs the version the job's Delta transaction read, exactly: a commit that
landed before the transaction read the log is in its snapshot, and judging it as a winner would stop a job
that commits. Delta does not show that version until the commit, so the watch pins it:

1. **Before the statement**, ``pin_version`` reads the table's newest version until two reads in a row name the
   same version ``v``: the first is the watch's own listing of the log, the others read the table's history
   through the session. Each history read brings the driver's cached snapshot of the table up to date first
   (measured: ``DESCRIBE HISTORY`` updates ``DeltaLog``'s snapshot), so a history read that agrees with the read
   before it proves the driver holds ``v`` itself,
   and the statement's analysis, finding nothing newer, computes no snapshot (runs no Spark job) before its
   transaction starts.
2. **While the statement runs**, the watch waits for its first Spark job (the attempt's job tag in a classic
   session; the first progress report over Spark Connect). Every Spark job of a MERGE, UPDATE, DELETE, OPTIMIZE
   or DataFrame write runs inside its transaction (delta-spark starts the transaction first, the MERGE's source
   materialisation included), so by then the transaction has read the log. If commit ``v + 1`` is still absent
   after that, the transaction read ``v``. If it is present, the version read is not known, and this attempt is
   not judged (it runs to its commit as without early abort). One exception: delta-spark re-runs a MERGE whose
   materialised source was lost in a new transaction (``MATERIALIZED_SOURCE_ATTEMPTS``); a failed Spark job
   of the attempt ends the judging (classic), and over Connect a MERGE is watched only where the server
   allows one transaction per statement.
3. From then on, each interval reads the next commit by name (one read, no listing), judges the commits since
   ``v`` and, when one is fatal, cancels the attempt's Spark work, again at every interval until the statement
   returns (a cancel between two Spark jobs reaches the next one). A commit of the job's own task run (its
   ``userMetadata``) ends the watch at once: the statement committed, and a cancel now would only turn its
   success into an error after the fact (a non-idempotent job would then write twice).

The runner then reports the attempt as the conflict Delta would have raised (``JobStoppedEarly``), which the
retry policies treat like the conflict itself, and the next attempt starts from the newer version. Only an
error that is this cancel (Spark names the attempt's tag; Connect reports the operation cancelled) becomes
``JobStoppedEarly``: any other error of the statement stays itself.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_delta_occ.engine.compaction import CompactionSettings
from airflow_delta_occ.engine.early_abort import CertainConflict, CommitJudge, RunningCommit, commits_show_at_once
from airflow_delta_occ.engine.expressions import TRUE
from airflow_delta_occ.engine.snapshot import Commit, DeltaLog, Snapshot
from airflow_delta_occ.exceptions import JobStoppedEarly
from airflow_delta_occ.jobs.footprint import CommitCertainty, asks_for_source_rows, commit_certainty, running_commit_of
from airflow_delta_occ.jobs.operations import JobOperation
from airflow_delta_occ.jobs.spec import TXN_VERSION, JobSpec
from airflow_delta_occ.jobs.sql import matching_row_sql
from airflow_delta_occ.spark.statements import run_sql

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_SECONDS = 1.0
PIN_TRIES = 5
"""History reads ``pin_version`` makes before giving up (a table committed to without pause)."""
MATERIALIZED_SOURCE_ATTEMPTS = "spark.databricks.delta.merge.materializeSource.maxAttempts"
"""delta-spark re-runs a MERGE inside its statement, with a new transaction, when its materialised source is
lost (a static conf, 4 attempts by default): the new transaction may read a newer version than the one pinned.
A classic session sees the failed Spark job that precedes such a re-run and stops judging; over Spark Connect
the client cannot, so a MERGE there is watched only where the server sets this to 1."""


@dataclass(frozen=True)
class TableWatch:
    """How a job reads its table's log while it runs, given by the process that can (the hook): early abort is
    on for a job only with one."""

    open_log: Callable[[], DeltaLog]
    interval: float = DEFAULT_INTERVAL_SECONDS


class SparkWork(Protocol):
    """One attempt's Spark work in one mode: tagged while it runs, known to have started, cancellable."""

    def tagged(self) -> contextlib.AbstractContextManager[None]: ...

    def started(self) -> bool: ...

    def cancel(self) -> None: ...

    def failed(self) -> bool: ...

    def ended_by_cancel(self, error: BaseException) -> bool: ...


class ClassicWork:
    """An attempt in a classic session: a SparkContext job tag (thread-local: set in the thread that runs the
    statement), read back from the driver's status tracker."""

    def __init__(self, session: Any) -> None:
        self.context = session.sparkContext
        self.tag = f"delta-occ-attempt-{uuid.uuid4().hex}"

    @contextlib.contextmanager
    def tagged(self) -> Iterator[None]:
        self.context.addJobTag(self.tag)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):   # a failed clean-up must not turn a committed job into an error
                self.context.removeJobTag(self.tag)

    def started(self) -> bool:
        return len(list(self.context._jsc.sc().statusTracker().getJobIdsForTag(self.tag))) > 0

    def cancel(self) -> None:
        self.context.cancelJobsWithTag(self.tag)

    def failed(self) -> bool:
        """Whether a Spark job of the attempt failed (a MERGE may then start a new transaction inside it)."""
        tracker = self.context.statusTracker()
        for job_id in list(self.context._jsc.sc().statusTracker().getJobIdsForTag(self.tag)):
            info = tracker.getJobInfo(int(job_id))
            if info is not None and str(info.status) == "FAILED":
                return True
        return False

    def ended_by_cancel(self, error: BaseException) -> bool:
        """Whether the statement failed because this attempt's jobs were cancelled (Spark names the tag)."""
        return is_cancel(error) and self.tag in str(error)


class ConnectWork:
    """An attempt over Spark Connect: an operation tag of the job's own session; the server's progress reports
    (every ``spark.connect.progress.reportInterval``) tell that its Spark work began."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.tag = f"delta-occ-attempt-{uuid.uuid4().hex}"
        self._began = threading.Event()

    def _progress(self, stages: Any, inflight_tasks: int, operation_id: Any, done: bool) -> None:
        if stages:
            self._began.set()

    @contextlib.contextmanager
    def tagged(self) -> Iterator[None]:
        self.session.addTag(self.tag)
        try:
            self.session.registerProgressHandler(self._progress)
            try:
                yield
            finally:
                with contextlib.suppress(Exception):   # as the transport's own untag: never fail a committed job
                    self.session.removeProgressHandler(self._progress)
        finally:
            with contextlib.suppress(Exception):
                self.session.removeTag(self.tag)

    def started(self) -> bool:
        return self._began.is_set()

    def cancel(self) -> None:
        self.session.interruptTag(self.tag)

    def failed(self) -> bool:
        """Not seen over Connect (see ``MATERIALIZED_SOURCE_ATTEMPTS``)."""
        return False

    def ended_by_cancel(self, error: BaseException) -> bool:
        """Whether the statement's operation was interrupted (this session's only operation: the attempt's; a
        kill of the whole job is told apart by the transport, which then reports the kill)."""
        return is_cancel(error)


CANCEL_CONDITIONS = ("SPARK_JOB_CANCELLED", "OPERATION_CANCELED", "OPERATION_CANCELLED")
"""How Spark names a cancelled job (classic) or an interrupted operation (Connect) in the error it raises."""


def is_cancel(error: BaseException) -> bool:
    """Whether ``error`` is Spark reporting cancelled work (a kill's cancel, or early abort's own): its error
    condition, as Spark writes it at the head of a message (``[SPARK_JOB_CANCELLED] Job 3 cancelled ...``), so a
    condition's name quoted in the statement's own text (a string literal Spark echoes back) does not count."""
    text = str(error)
    return any(f"[{condition}]" in text for condition in CANCEL_CONDITIONS)


def spark_work(session: Any) -> ClassicWork | ConnectWork:
    """The attempt adapter for the session's mode."""
    if type(session).__module__.startswith("pyspark.sql.connect"):
        return ConnectWork(session)
    return ClassicWork(session)


def pin_version(newest: Callable[[], int], tries: int = PIN_TRIES, listed: int | None = None) -> int | None:
    """The version the driver's snapshot of the table holds: ``newest()`` (a history read, which updates that
    snapshot first) until two reads in a row agree; ``None`` when the table moved between every pair.

    ``listed`` is a first read made without Spark (the watch's own listing of the log, just before): when the
    history read that follows names the same version, no commit landed between the two, so the driver's update
    inside that history read found exactly it (delta-spark's history read ends at the version its ``update()``
    returned, so the version it names is the one the driver then holds; a listing that runs behind or ahead of
    the driver's file system only makes the two disagree, and the pairs of history reads take over). One history
    read (about 0.15 s) instead of two, in the common case of a table nobody commits to meanwhile."""
    last = newest() if listed is None else listed
    for _ in range(tries - 1):
        again = newest()
        if again == last:
            return last
        last = again
    return None


@dataclass
class WatchReport:
    """What the watch of one attempt saw, for the result and the task log."""

    read_version: int
    judged: bool = False
    not_judged: str | None = None
    found: CertainConflict | None = None
    found_after: float | None = None      # seconds from the statement's start to the verdict
    cancelled_after: float | None = None  # ... to the first cancel sent
    commits_seen: int = 0
    committed: bool = False               # the job's own commit was seen: the watch ended there


class AttemptWatch:
    """Watches one attempt from a helper thread (``start`` before the statement, ``stop`` after it)."""

    def __init__(self, log_: DeltaLog, running: RunningCommit, work: SparkWork, interval: float,
                 own: Callable[[Commit], bool], clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log_
        self.running = running
        self.own = own
        self.work = work
        self.interval = interval
        self.clock = clock
        self.report = WatchReport(read_version=running.read_version)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="delta-occ-early-abort", daemon=True)
        self._began = 0.0
        self._judge_of = CommitJudge(running)

    def start(self) -> None:
        self._began = self.clock()
        self._thread.start()

    def stop(self) -> WatchReport:
        self._stop.set()
        self._thread.join(max(5.0, 3 * self.interval))
        return self.report

    def _watch(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                if not self.report.judged and not self._confirm_read_version():
                    continue
                if self.report.not_judged is not None:
                    return
                if self.report.found is None and self.work.failed():
                    self.report.not_judged = ("a Spark job of the statement failed: delta-spark may run it again in a "
                                              "new transaction, which reads a newer version")
                    log.info("Early abort stops judging this attempt: %s", self.report.not_judged)
                    return
                self._judge()
                if self.report.committed:
                    return
                if self.report.found is not None:
                    self.work.cancel()   # again at every interval: a cancel between two Spark jobs reaches the next
                    if self.report.cancelled_after is None:
                        self.report.cancelled_after = round(self.clock() - self._began, 3)
                        log.warning("Early abort: %s; cancelled the job's Spark work %.1f s into the attempt",
                                    self.report.found.describe(), self.report.cancelled_after)
        except Exception as exc:   # watching is an optimisation: the statement goes on to its own commit check
            self.report.not_judged = f"the watch failed: {type(exc).__name__}: {exc}"
            log.warning("Early abort is off for this attempt: %s", self.report.not_judged)

    def _confirm_read_version(self) -> bool:
        """Once the attempt's Spark work began: whether the transaction surely read ``read_version``."""
        if not self.work.started():
            return False
        version = self.report.read_version
        if self.log.commit_if_present(version + 1) is not None:
            self.report.not_judged = (f"version {version + 1} landed before the statement's transaction was known "
                                      f"to have read the log, so the version it read is not known")
            log.info("Early abort does not judge this attempt: %s", self.report.not_judged)
        else:
            self.report.judged = True
            log.info("Early abort judges this attempt: its transaction read version %d", version)
        return True

    def _judge(self) -> None:
        """Judge each commit that landed since the last look, once (``CommitJudge`` keeps the rebased state)."""
        while (commit := self.log.commit_if_present(self.report.read_version + self.report.commits_seen + 1)) \
                is not None:
            if self.own(commit):   # the statement committed: nothing left to stop, even after a verdict
                self.report.committed = True
                return
            self.report.commits_seen += 1
            found = self._judge_of.judge(commit)
            if found is not None and self.report.found is None:
                self.report.found = found
                self.report.found_after = round(self.clock() - self._began, 3)


class EarlyAbort:
    """Early abort for one job: each attempt (``attempt``) is pinned, watched and, when doomed, stopped.

    Built only for a job certain to commit (``jobs.footprint.commit_certainty``): a job that may commit
    nothing cannot fail, so no commit can doom it. An UPDATE or DELETE is certain once a row at the attempt's
    pinned version meets its condition: known from the log's statistics where they tell, else asked of Spark
    before each attempt (one ``LIMIT 1`` query).
    """

    def __init__(self, spec: JobSpec, watch: TableWatch,
                 certainty: CommitCertainty = CommitCertainty.CERTAIN,
                 work_for: Callable[[Any], SparkWork] = spark_work) -> None:
        self.spec = spec
        self.watch = watch
        self.certainty = certainty
        self.work_for = work_for   # the attempt adapter for a session (a stand-in in the unit tests)
        self.reports: list[WatchReport] = []

    @classmethod
    def for_job(cls, spec: JobSpec, watch: TableWatch, source: Any,
                source_has_rows: bool | None = None) -> EarlyAbort | None:
        """Early abort for ``spec``, or ``None`` (logged) when no commit can doom it or it cannot be set up.
        ``source`` is the job's materialised source: when whether it holds a row decides whether the job commits,
        and the runner's source check has not counted its rows already (``source_has_rows``), Spark is asked
        (``isEmpty``, a ``LIMIT 1`` query, not a count)."""
        try:
            rows = source_has_rows
            if rows is None and source is not None and asks_for_source_rows(spec):
                rows = not source.isEmpty()
        except Exception as exc:   # an optimisation: the job runs unwatched ...
            if is_cancel(exc):     # ... unless the query was cancelled (a kill): then the job must not run
                raise
            log.warning("Early abort is off for this job: its source could not be read: %s", exc)
            return None
        certainty = commit_certainty(spec, rows)
        if certainty is CommitCertainty.UNKNOWN:
            log.info("Early abort does not watch this %s: it may commit no file (%s), and such a commit is left to "
                     "Delta's own check",
                     spec.operation, "no source rows" if rows is False else
                     "only a MERGE with an unconditional WHEN MATCHED and WHEN NOT MATCHED clause, an append or an "
                     "overwrite with rows, and an UPDATE or DELETE whose condition is only columns, literals, "
                     "comparisons, IN, IS NULL, AND, OR and NOT are known to commit before they run")
            return None
        return cls(spec, watch, certainty)

    @contextlib.contextmanager
    def attempt(self, session: Any, newest: Callable[[], int]) -> Iterator[None]:
        """Run the attempt's statement inside: pinned, tagged and watched. ``newest`` reads the table's newest
        version through the session (a history read, which brings the driver's snapshot up to date).

        Raises:
            JobStoppedEarly: the watch cancelled the attempt's Spark work (from the error the statement ended with).
        """
        try:
            watcher, work = self._watcher(session, newest)
        except Exception as exc:   # an optimisation: the attempt runs unwatched, to Delta's own check ...
            if is_cancel(exc):     # ... unless the setup was cancelled (a kill): then the statement must not run
                raise
            log.warning("Early abort is off for this attempt: %s: %s", type(exc).__name__, exc)
            watcher = work = None
        if watcher is None or work is None:
            yield
            return
        report: WatchReport | None = None
        with work.tagged():
            watcher.start()
            try:
                yield
            except Exception as exc:
                report = self._stopped(watcher)
                if report.found is None or not work.ended_by_cancel(exc):   # not the cancel's doing
                    raise
                try:
                    committed = self._committed(watcher)
                except Exception as unread:   # the log cannot tell: the statement's own error stands
                    log.warning("Early abort could not read the log after its cancel: %s", unread)
                    raise exc from None
                if not committed:
                    raise _stopped_early(report) from exc
                # The statement committed before the cancel reached it (the judge was wrong): its error came
                # after the fact, so the attempt succeeded, and retrying it would write again.
                self._misjudged(report)
                return
            finally:
                if report is None:   # a success, or a BaseException (a timeout, a kill): the watch ends with it
                    report = self._stopped(watcher)
        if report.found is not None:
            self._misjudged(report)

    def _watcher(self, session: Any, newest: Callable[[], int]) -> tuple[AttemptWatch | None, SparkWork | None]:
        table_log = self.watch.open_log()
        listed = table_log.snapshot()   # the newest version, read without Spark: the pin's first read
        version = pin_version(newest, listed=listed.version)
        if version is None:
            log.info("Early abort does not judge this attempt: the table moved between every pair of reads")
            return None, None
        snapshot = listed if listed.version == version else table_log.snapshot(version)
        if not commits_show_at_once(snapshot):
            log.info("Early abort does not watch this job: its table's commits are ratified elsewhere first "
                     "(coordinated or catalog-managed commits), so the log may not show a commit it read yet")
            return None, None
        if self._committed_already(snapshot):
            return None, None
        if self.certainty is CommitCertainty.IF_A_ROW_MATCHES and not self._a_row_matches(session, snapshot):
            return None, None
        work = self.work_for(session)
        if isinstance(work, ConnectWork) and self.spec.operation is JobOperation.MERGE \
                and str(session.conf.get(MATERIALIZED_SOURCE_ATTEMPTS, "4")).strip() != "1":
            log.info("Early abort does not watch this MERGE: the Spark Connect server lets delta-spark re-run it in a "
                     "new transaction when its materialised source is lost (%s; set it to 1 on the server)",
                     MATERIALIZED_SOURCE_ATTEMPTS)
            return None, None
        compaction = None
        if self.certainty is CommitCertainty.IF_IT_SURELY_REWRITES:
            compaction = compaction_settings(session)
        running = running_commit_of(self.spec, snapshot, commits=True, compaction=compaction)
        if compaction is not None and not running.commits:
            log.info("Early abort does not watch this optimize: %s at version %d, so it may commit nothing, and such a "
                     "commit is left to Delta's own check", running.uncertain or "the files it surely rewrites hold "
                     "no row known from the log's statistics", snapshot.version)
            return None, None
        if compaction is not None:
            log.info("Early abort watches this optimize: it surely rewrites %d file(s) at version %d; a commit that "
                     "takes one of them out of the table dooms it (delta-spark's OPTIMIZE retries any other conflict)",
                     len(running.rewrites), snapshot.version)
        return AttemptWatch(table_log, running, work, self.watch.interval, own=self._own), work

    def _committed_already(self, snapshot: Snapshot) -> bool:
        """Whether an earlier try of this task run committed, so this one commits nothing (no commit can fail
        it): an idempotent job whose transaction id is in the snapshot at least at ``TXN_VERSION`` (Delta then
        skips its write, as the runner asks). Any try of the run, in this Airflow try or an earlier one: the id is
        the run's. A job that is not idempotent writes again, so it commits."""
        if not self.spec.idempotent:
            return False
        marker = snapshot.app_transactions.get(self.spec.run.app_id)
        if marker is not None and marker.version >= TXN_VERSION:
            log.info("Early abort does not watch this attempt: an earlier try of this task run committed at or "
                     "before version %d (Delta skips this one's write, so it commits nothing)", snapshot.version)
            return True
        return False

    def _a_row_matches(self, session: Any, snapshot: Snapshot) -> bool:
        """Whether a row of the table at the snapshot's version meets the UPDATE's or DELETE's condition: then the
        statement, whose transaction reads that version when the attempt is judged, is certain to commit.

        The log answers first (a file whose partition values and statistics make the condition true on every
        row, ``Snapshot.holds_a_row_matching``): no Spark query, so early abort costs such a job nothing before
        it runs. Otherwise Spark is asked (one ``LIMIT 1`` query at that version)."""
        began = time.monotonic()
        version = snapshot.version
        try:
            known = snapshot.holds_a_row_matching(self.spec.condition if self.spec.condition is not None else TRUE)
        except Exception as exc:   # a condition the engine cannot bind: Spark answers
            log.info("Early abort asks Spark whether a row meets this %s's condition: the log cannot tell (%s)",
                     self.spec.operation, exc)
            known = False
        matches = known or bool(run_sql(session, matching_row_sql(self.spec, version)).collect())
        log.info("Early abort %s this %s: %s row meets its condition at version %d (%s, %.1f s to find out)%s",
                 "watches" if matches else "does not watch", self.spec.operation, "a" if matches else "no",
                 version, "from the log's statistics" if known else "asked of Spark", time.monotonic() - began,
                 "" if matches else "; it may commit no file, and such a commit is left to Delta's own check")
        return matches

    def _own(self, commit: Commit) -> bool:
        """Whether ``commit`` is this task run's (any try of it): never a winner against the job itself."""
        info = commit.commit_info
        return info is not None and self.spec.run.tagged(info.user_metadata)

    def _stopped(self, watcher: AttemptWatch) -> WatchReport:
        report = watcher.stop()
        self.reports.append(report)
        if report.judged and report.found is None:
            log.info("Early abort watched this attempt: %d commit(s) landed after version %d while it ran, none "
                     "makes its commit certain to fail", report.commits_seen, report.read_version)
        return report

    @staticmethod
    def _misjudged(report: WatchReport) -> None:
        assert report.found is not None
        log.error("Early abort judged this attempt doomed (%s), yet its statement committed; its cancel came too "
                  "late to stop it. Please report this: early abort must never judge a commit that succeeds.",
                  report.found.describe())

    def _committed(self, watcher: AttemptWatch) -> bool:
        """Whether the log holds a commit of this task run after the version the attempt read."""
        return any(self._own(c) for c in watcher.log.commits_after(watcher.report.read_version))


def compaction_settings(session: Any) -> CompactionSettings:
    """The settings an OPTIMIZE run in ``session`` picks its files by: each one the session sets (a cluster's
    defaults included), else delta-spark's default. ``conf.get(key, None)`` gives the session's own value or
    ``None``, whether or not delta-spark has registered the setting yet (measured, delta-spark 4.4: ``get(key)``
    raises before it has). A setting that cannot be read raises, and the watch is off for the attempt: a wrong
    guess of a size could count a file as certain that delta-spark leaves alone.

    Raises:
        InvalidCommitError: a value delta-spark would not accept either.
    """
    def get(key: str) -> str | None:
        value = session.conf.get(key, None)
        return None if value is None else str(value)

    return CompactionSettings.from_conf(get)


def _stopped_early(report: WatchReport) -> JobStoppedEarly:
    found = report.found
    assert found is not None
    return JobStoppedEarly(
        f"{found.kind.value} foreseen while the job ran, so its Spark work was stopped "
        f"{report.cancelled_after if report.cancelled_after is not None else report.found_after} s into the attempt "
        f"instead of failing at its commit: {found.describe()}",
        kind=found.kind, version=found.version, operation=found.operation)
