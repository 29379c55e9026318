"""Execute a ``JobSpec`` with delta-spark: one program for every mode (embedded, spark-submit, Connect).

The runner reads the source once (``localCheckpoint``, registered as a temporary view) and retries
conflicts inside the same Spark application according to the job's typed policies: each retry
re-reads the target's newest snapshot (Delta does that when the statement restarts) but never the
source. DML and OPTIMIZE run as SQL statements, which behave the same in a classic session and over
Spark Connect; names are quoted here and expressions were checked by the operator. Every commit is tagged with the
Airflow run in ``commitInfo.userMetadata``, and DML, appends and overwrites carry Delta's
``txnAppId``/``txnVersion`` derived from the run, so re-running the same task run after an
ambiguous failure commits nothing twice.

As a program (``spark-submit .../runner.py --spec-file job.json``) it prints one line
``DELTA_OCC_RESULT {json}`` and exits with a code that names the outcome (see ``EXIT_CODES``), so
the caller does not depend on the last lines of the driver log.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
import traceback
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_delta_occ.engine.snapshot import DeltaLog
from airflow_delta_occ.engine.sql_parser import render_identifier
from airflow_delta_occ.exceptions import (
    ConflictFailure,
    ConflictSkipped,
    JobSpecError,
    ProviderConfigError,
    SourceNotFoundError,
    SourceOutsidePartitionsError,
    StatementRefusedError,
)
from airflow_delta_occ.jobs.result import REFUSED_TYPES, JobResult, JobStatus, OpenLineageParent
from airflow_delta_occ.jobs.spec import TXN_APP_ID_CONF, TXN_VERSION, TXN_VERSION_CONF, USER_METADATA_CONF, JobSpec
from airflow_delta_occ.jobs.sql import source_check_sql, source_values_sql, statement_sql, table_name_sql, target_sql
from airflow_delta_occ.retry.classify import ConflictKind, classify_conflict
from airflow_delta_occ.retry.policy import RetryOutcome, policies_for, run_with_policies
from airflow_delta_occ.spark import errors as spark_errors
from airflow_delta_occ.spark.early_abort import EarlyAbort, TableWatch
from airflow_delta_occ.spark.hadoop_storage import HadoopStorage
from airflow_delta_occ.spark.session import INHERITED_CONNECT_ENV
from airflow_delta_occ.spark.statements import pinned_settings, run_sql
from airflow_delta_occ.spark.storage import SECRET_CONF_ENV

RESULT_PREFIX = "DELTA_OCC_RESULT "
TABLE_PREFIX = "DELTA_OCC_TABLE "
"""The line ``--describe-table`` prints: JSON ``{"location", "format"}`` or ``{"error"}``."""
EXIT_CODES = {JobStatus.SUCCESS: 0, JobStatus.ERROR: 1, JobStatus.CONFLICT: 75, JobStatus.SKIPPED: 76,
              JobStatus.REJECTED: 65}
BAD_SPEC_EXIT_CODE = 64


def _check_target(session: Any, spec: JobSpec) -> int:
    """The target's current version; a typed error when it is not a Delta table.

    Raises:
        TableNotFoundError: Spark says the target is no Delta table (an outage is raised as it came).
    """
    try:
        return int(run_sql(session, f"DESCRIBE HISTORY {target_sql(spec)} LIMIT 1").collect()[0]["version"])
    except Exception as exc:
        if not spark_errors.is_analysis_error(exc):  # an outage, not a missing table: left to retries
            raise
        from airflow_delta_occ.engine.errors import TableNotFoundError

        raise TableNotFoundError(spec.target.label, spark_errors.message(exc)) from exc


def read_source(session: Any, spec: JobSpec) -> Any:
    """The source rows, materialised once so conflict retries never read the source again."""
    src = spec.source
    if src is None:
        return None
    try:
        if src.path is not None:
            df = session.read.format(src.format).load(src.path)
        elif src.table is not None:
            df = session.table(src.table)
        else:  # Spark's parser accepts only a query inside FROM ( ... ), whatever the text says
            df = run_sql(session, f"SELECT * FROM ({src.query}) AS {render_identifier('delta_occ_query')}")
        with _active(session):
            return df.localCheckpoint(eager=True)
    except Exception as exc:
        if not spark_errors.is_analysis_error(exc):  # an outage, not a missing source: left to retries
            raise
        label = src.path or src.table or "query"
        raise SourceNotFoundError(f"cannot read source {label!r}: {spark_errors.message(exc)}") from exc


SAMPLE_ROWS = 5


@dataclass(frozen=True)
class ConfinedSource:
    """The source a job writes from, once rows outside its partitions are refused or dropped."""

    frame: Any
    dropped: int = 0
    has_rows: bool | None = None
    """Whether any row is left, when the check counted them (``None``: not counted); early abort needs it."""


def confine_source(session: Any, spec: JobSpec, source: Any, source_view: str) -> ConfinedSource:
    """Refuse (or drop) source rows that would be written outside the job's partitions.

    Runs on the materialised source before anything is written, so a refusal leaves the table as
    it was. Returns the source to use, how many rows were dropped and whether any is left (one query counts
    both).

    Raises:
        SourceOutsidePartitionsError: with the number of such rows and a few of their partition values.
    """
    check = source_check_sql(spec)
    if check is None:
        return ConfinedSource(source)
    alias = render_identifier(spec.source_alias)
    columns = {c.lower() for c in source.columns}
    values = source_values_sql(spec)
    for name, operand in values.items():
        # A written value read from the source column of that name must be a top-level column: Spark
        # would otherwise resolve `s`.`date` to a field of a struct column named like the alias.
        if operand == f"{alias}.{render_identifier(name)}" and name.lower() not in columns:
            raise SourceOutsidePartitionsError(
                f"the source has no column {name!r}, so its rows cannot be checked against the partitions "
                f"{spec.partition_filter_sql}; nothing was written")
    inside = f"coalesce(({check}), false)"
    counted = run_sql(session, f"SELECT count(*) AS total, count_if(NOT {inside}) AS n "
                               f"FROM {render_identifier(source_view)} AS {alias}").collect()[0]
    outside, total = int(counted["n"]), int(counted["total"])
    if not outside:
        return ConfinedSource(source, has_rows=total > 0)
    if spec.source_outside == "drop":
        kept = run_sql(session, f"SELECT {alias}.* FROM {render_identifier(source_view)} AS {alias} WHERE {inside}")
        kept.createOrReplaceTempView(source_view)
        return ConfinedSource(kept, dropped=outside, has_rows=total > outside)
    shown = ", ".join(f"{expr} AS {render_identifier(name)}" for name, expr in values.items())
    samples = tuple(row.asDict() for row in run_sql(
        session, f"SELECT DISTINCT {shown} FROM {render_identifier(source_view)} AS {alias} WHERE NOT {inside} "
        f"LIMIT {SAMPLE_ROWS}").collect()) if shown else ()
    raise SourceOutsidePartitionsError(
        f"{outside} source row(s) would be written outside the partitions {spec.partition_filter_sql} of "
        f"{spec.target.label}, for example {', '.join(map(_plain_values, samples)) or 'see the source'}; nothing "
        "was written. Fix the source, or pass source_outside_partitions='drop' to leave such rows out.",
        count=int(outside), samples=samples)


def _plain_values(values: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={v!s}" for k, v in values.items()) + "}"


def _identify_writes(session: Any, spec: JobSpec) -> None:
    """Name the job's commits: its run in ``userMetadata`` and, for an idempotent DML statement, the run's
    transaction id (a DataFrame write passes it as writer options). Set before every attempt, not once per job:
    with ``spark.databricks.delta.write.txnVersion.autoReset.enabled`` delta-spark clears ``txnVersion`` once a
    commit was tried, and the retry must still carry it.

    Otherwise both are unset: a ``txnAppId`` from the cluster's own defaults (``spark-defaults.conf``, a Connect
    server's launch settings) would make Delta skip a write the provider counts on (the commit check, early
    abort); a task's or a connection's ``spark_conf`` cannot set them (refused before the job)."""
    session.conf.set(USER_METADATA_CONF, spec.run.user_metadata())
    if spec.idempotent and spec.operation in ("merge", "update", "delete"):
        session.conf.set(TXN_APP_ID_CONF, spec.run.app_id)
        session.conf.set(TXN_VERSION_CONF, str(TXN_VERSION))
    else:   # an append passes the run's id as writer options; nothing else may name the write
        session.conf.unset(TXN_APP_ID_CONF)
        session.conf.unset(TXN_VERSION_CONF)


def _execute_once(session: Any, spec: JobSpec, source: Any, source_view: str | None,
                  early: EarlyAbort | None = None) -> None:
    """One attempt; Spark refusing the statement (not a conflict) is ``StatementRefusedError``, or
    ``TableNotFoundError`` when the refusal is that the target is gone (checked only then). Watched for early
    abort when ``early`` is given (``JobStoppedEarly``: a commit that landed meanwhile dooms the attempt)."""
    _identify_writes(session, spec)   # again for each attempt: delta-spark may reset txnVersion after a commit try
    try:
        with early.attempt(session, lambda: _check_target(session, spec)) if early is not None \
                else contextlib.nullcontext():
            _write(session, spec, source, source_view)
        return
    except Exception as exc:
        if classify_conflict(exc) is not None or not spark_errors.is_analysis_error(exc):
            raise
        refusal = exc
    if not _checks_first(spec):
        # Checked outside the ``except``: a check that fails for another reason (an outage) must not
        # inherit the refusal as its context and pass for "no such table".
        from airflow_delta_occ.engine.errors import TableNotFoundError

        try:
            _check_target(session, spec)
        except TableNotFoundError:
            raise   # the target is gone: that is the refusal's reason
        except Exception as failed:
            logging.getLogger(__name__).warning("could not check the target after Spark refused the "
                                                "statement: %s", failed)
    raise StatementRefusedError(f"Spark refused the job's statement: {spark_errors.message(refusal)}") from refusal


def _checks_first(spec: JobSpec) -> bool:
    """Whether the target is checked before the write: a DataFrame write would create a table where
    there is none, and without the planned version the runner reads the version it starts from.
    A statement on a table that is gone fails by itself, and is checked after that failure."""
    return spec.operation.is_write or spec.planned_version is None


def _write(session: Any, spec: JobSpec, source: Any, source_view: str | None) -> None:
    sql = statement_sql(spec, source_view)
    if sql is not None:
        run_sql(session, sql).collect()
        return
    writer = source.write.format("delta").option("userMetadata", spec.run.user_metadata())
    if spec.idempotent:
        writer = writer.option("txnAppId", spec.run.app_id).option("txnVersion", TXN_VERSION)
    if spec.operation == "append":
        writer = writer.mode("append")
    else:
        writer = writer.mode("overwrite").option("replaceWhere", spec.partition_filter_sql)
    if spec.target.path is not None:
        writer.save(spec.target.path)
    else:
        writer.saveAsTable(spec.target.name)


@dataclass(frozen=True)
class Commit:
    """A commit of this task run found in the table's history."""

    version: int
    operation: str
    metrics: Mapping[str, str]
    user_metadata: str
    new: bool
    """Made by this job (its version is past the one the job started from), not by an earlier try."""


HISTORY_LOOKS = (10, 100)   # commits read to find the run's own: the newest few first, then further back


def find_commit(session: Any, spec: JobSpec, after_version: int) -> Commit | None:
    """The newest commit of this task run (any try) in the table's last 100 commits, if there is one.

    Each commit read is a file read (an object-store request on S3): the newest ten are read first,
    which finds a job's commit unless others committed many times since.
    """
    for limit in HISTORY_LOOKS:
        rows = run_sql(session, f"DESCRIBE HISTORY {target_sql(spec)} LIMIT {limit}").collect()
        for row in rows:
            if spec.run.tagged(row["userMetadata"]) and not _auto_compaction(row):
                return Commit(version=int(row["version"]), operation=row["operation"],
                              metrics=dict(row["operationMetrics"] or {}), user_metadata=row["userMetadata"],
                              new=int(row["version"]) > after_version)
        if len(rows) < limit:   # the whole history was read
            return None
    return None


def _auto_compaction(row: Any) -> bool:
    """Whether a history row is Delta's auto-compaction, which follows a job's commit with the job's own
    ``userMetadata`` (``delta.autoOptimize.autoCompact``): not the job's commit, whose version and
    metrics the result reports."""
    parameters = row["operationParameters"] or {}
    return str(row["operation"]) == "OPTIMIZE" and str(parameters.get("auto", "")).lower() == "true"


def run_job(spark: Any, spec: JobSpec, *, sleep: Any = time.sleep, watch: TableWatch | None = None) -> JobResult:
    """Execute ``spec`` with conflict retries and return what happened, in every mode the same way.

    Never raises for the job's own outcome: a refusal, a conflict, a skip or an error is the
    result's status and message (``JobResult.raise_for_status`` turns it into the exception). With
    ``watch`` (how to read the table's log), each attempt is watched for early abort (``spark.early_abort``).
    """
    started = time.monotonic()
    outcome = RetryOutcome()
    progress = JobProgress()
    try:
        ended = _succeeded(_run(spark, spec, outcome, progress, sleep, watch))
    except Exception as exc:  # every outcome of the job becomes a status (decoded by raise_for_status)
        ended = _failure(exc)
    conflicts = tuple(outcome.conflicts)
    app_id, ui_url = spark_application(spark)
    return JobResult(spark_app_id=app_id, spark_ui_url=ui_url, phase_seconds=dict(progress.phases),
                     table=spec.target.label, operation=spec.operation, condition=spec.condition_sql,
                     partition_filter=spec.partition_filter_sql, attempts=outcome.attempts, conflicts=conflicts,
                     run_seconds=round(time.monotonic() - started, 3),
                     wait_seconds=round(sum(c.delay for c in conflicts if c.action == "retry"), 3),
                     dropped_source_rows=progress.dropped_source_rows, openlineage_parent=progress.openlineage_parent,
                     status=ended.status, version=ended.version, metrics=ended.metrics,
                     already_committed=ended.already_committed, error=ended.error, error_type=ended.error_type,
                     conflict=ended.conflict, refused=ended.refused)


@dataclass
class JobProgress:
    """What a job learned on its way, reported whether it succeeds or fails (filled in as it runs)."""

    dropped_source_rows: int = 0
    openlineage_parent: OpenLineageParent | None = None
    phases: dict[str, float] = field(default_factory=dict)   # seconds per step of the job, in order

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the block's seconds to ``phase`` (the provider's own steps are told apart from the write)."""
        began = time.monotonic()
        try:
            yield
        finally:
            self.phases[phase] = round(self.phases.get(phase, 0.0) + time.monotonic() - began, 3)


@dataclass(frozen=True)
class JobEnd:
    """How a job ended: the status and the result fields that go with it."""

    status: JobStatus
    version: int | None = None
    metrics: Mapping[str, str] = field(default_factory=dict)
    already_committed: bool = False
    error: str | None = None
    error_type: str | None = None
    conflict: ConflictKind | None = None
    refused: Mapping[str, Any] = field(default_factory=dict)


def _succeeded(commit: Commit | None) -> JobEnd:
    if commit is None:  # nothing committed (e.g. a DELETE that matched no row)
        return JobEnd(JobStatus.SUCCESS)
    return JobEnd(JobStatus.SUCCESS, version=commit.version, metrics=commit.metrics,
                  already_committed=not commit.new)


def spark_application(spark: Any) -> tuple[str | None, str | None]:
    """The application id of the session's Spark driver and the URL of its UI, as the driver reports
    them (over Spark Connect: the server's, read from its conf). Never raises: a link is not worth
    failing a job for."""
    try:
        context = spark.sparkContext  # classic only: a Connect session raises here
        return str(context.applicationId), (str(context.uiWebUrl) if context.uiWebUrl else None)
    except Exception:
        pass
    try:
        conf = spark.conf
        app_id, host = conf.get("spark.app.id", None), conf.get("spark.driver.host", None)
        ui_on = str(conf.get("spark.ui.enabled", "true")).lower() == "true"
        url = f"http://{host}:{conf.get('spark.ui.port', '4040')}" if host and ui_on else None
        return (str(app_id) if app_id else None), url
    except Exception:
        return None, None


def _failure(exc: Exception) -> JobEnd:
    """The status, message and fields a failure is reported with (decoded by ``raise_for_status``)."""
    if isinstance(exc, ConflictSkipped):
        return JobEnd(JobStatus.SKIPPED, error=str(exc), conflict=exc.kind)
    if isinstance(exc, ConflictFailure):
        return JobEnd(JobStatus.CONFLICT, error=str(exc), conflict=exc.kind)
    if isinstance(exc, REFUSED_TYPES):
        refused = {"count": exc.count, "samples": list(exc.samples)} \
            if isinstance(exc, SourceOutsidePartitionsError) else {}
        return JobEnd(JobStatus.REJECTED, error=str(exc), error_type=type(exc).__name__, refused=refused)
    traceback.print_exception(exc)  # the driver log (and the task log, embedded) keeps the whole story
    return JobEnd(JobStatus.ERROR, error=f"{type(exc).__name__}: {spark_errors.message(exc)}",
                  error_type=type(exc).__name__)


def _run(spark: Any, spec: JobSpec, outcome: RetryOutcome, progress: JobProgress, sleep: Any,
         watch: TableWatch | None = None) -> Commit | None:
    session = _private_session(spark)
    progress.openlineage_parent = openlineage_parent_seen(session)
    with pinned_settings(session):  # every statement below means what the provider rendered
        return _run_pinned(session, spec, outcome, progress, sleep, watch)


def _run_pinned(session: Any, spec: JobSpec, outcome: RetryOutcome, progress: JobProgress, sleep: Any,
                watch: TableWatch | None = None) -> Commit | None:
    # The worker's plan, when there is one, says which commits of this run are this try's, the same
    # for every operation (a driver re-run by its cluster manager reports its first run's commit).
    before = spec.planned_version
    if before is None or _checks_first(spec):
        with progress.timed("target_check"):
            checked = _check_target(session, spec)
        before = checked if before is None else before
    with progress.timed("source_read"):
        source = read_source(session, spec)
    source_view = None
    confined = ConfinedSource(source)
    if source is not None:
        source_view = f"delta_occ_source_{uuid.uuid4().hex}"
        source.createOrReplaceTempView(source_view)
        with progress.timed("source_check"):
            confined = confine_source(session, spec, source, source_view)
        source, progress.dropped_source_rows = confined.frame, confined.dropped
    early = None
    if watch is not None:
        with progress.timed("early_abort_setup"):
            early = EarlyAbort.for_job(spec, watch, source, confined.has_rows)
    try:
        with progress.timed("write"):
            run_with_policies(lambda attempt: _execute_once(session, spec, source, source_view, early),
                              policies_for(spec.operation, spec.retry_policies), outcome=outcome, sleep=sleep,
                              what=spec.target.label)
    finally:
        if source_view is not None:
            session.catalog.dropTempView(source_view)
    with progress.timed("find_commit"):
        return find_commit(session, spec, before)


def _private_session(spark: Any) -> Any:
    """A session whose confs (userMetadata, txnAppId) stay private to this job.

    Spark Connect sessions cannot spawn siblings, but each Connect client session is already
    private (the hook creates one per job). A classic ``newSession`` starts from the SparkContext's
    conf, not from ``spark``'s: the OpenLineage confs the hook gave ``spark`` for this job are
    carried over (see ``_carry_openlineage_conf``).
    """
    if _is_connect(spark):
        return spark
    session = spark.newSession()
    _carry_openlineage_conf(spark, session)
    return session


OPENLINEAGE_CONF_PREFIX = "spark.openlineage."


def _carry_openlineage_conf(parent: Any, child: Any) -> None:
    """Give ``child`` exactly ``parent``'s ``spark.openlineage.*`` confs.

    An embedded job runs on the process's SparkContext, started by the first task of the process
    (``airflow dags test`` runs every task in one). A new session starts from that context's conf, so
    without this it would name the first task as the OpenLineage parent of every later job, or no
    parent at all when the first task handed none over. The hook sets this job's parent on the
    session it returns and unsets parent keys this job was not given, so mirroring it is right.
    """
    wanted = {k: v for k, v in parent.conf.getAll.items() if k.startswith(OPENLINEAGE_CONF_PREFIX)}
    for key in child.conf.getAll:
        if key.startswith(OPENLINEAGE_CONF_PREFIX) and key not in wanted:
            child.conf.unset(key)
    for key, value in wanted.items():
        child.conf.set(key, value)


def openlineage_parent_seen(session: Any) -> OpenLineageParent | None:
    """The OpenLineage parent job this job's session holds (its ``spark.openlineage.parent*`` confs),
    read from the session in the job, in every mode. Never raises: lineage is not worth failing a job
    for, and a session whose conf cannot be read reports no parent."""
    try:
        return OpenLineageParent.from_conf(dict(session.conf.getAll))
    except Exception as exc:
        logging.getLogger(__name__).warning("cannot read the OpenLineage confs of the job's session: %s", exc)
        return None


def _is_connect(session: Any) -> bool:
    return type(session).__module__.startswith("pyspark.sql.connect")


@contextlib.contextmanager
def _active(session: Any) -> Iterator[None]:
    """Make a Spark Connect session the thread's active one while a checkpoint result is bound.

    pyspark's Connect client binds a checkpointed DataFrame to ``SparkSession.active()`` rather than
    to the session that ran the checkpoint (``proto_to_remote_cached_dataframe``, pyspark 4.0-4.2).
    When the process holds an older Connect session (an earlier job, or the user's own), the source
    would name a relation the server keeps in another session (``DATAFRAME_NOT_FOUND``). Classic
    sessions are unaffected and left alone.
    """
    holder = getattr(type(session), "_active_session", None)
    if not _is_connect(session) or holder is None:
        yield
        return
    previous = getattr(holder, "session", None)
    holder.session = session
    try:
        yield
    finally:
        holder.session = previous


def _forget_inherited_connect_client() -> None:
    """Drop Spark Connect client state inherited from the process that ran ``spark-submit``.

    Once an Airflow worker has opened a Spark Connect session, pyspark leaves
    ``SPARK_CONNECT_MODE_ENABLED`` (and possibly ``SPARK_REMOTE``) in its environment, and every
    ``spark-submit`` it starts inherits them; the submitted runner's ``getOrCreate()`` would then look
    for a Connect server instead of using the driver spark-submit just started.
    """
    for name in INHERITED_CONNECT_ENV:
        os.environ.pop(name, None)


def _driver_session() -> Any:
    """The session of the driver spark-submit started, with the secret confs the hook passed in the
    environment (``SECRET_CONF_ENV``) rather than on the command line; the variable is dropped at once."""
    import json

    from pyspark.sql import SparkSession

    _forget_inherited_connect_client()
    builder = SparkSession.builder
    for key, value in json.loads(os.environ.pop(SECRET_CONF_ENV, "") or "{}").items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _log_to_driver_output() -> None:
    """Print the provider's log lines (every conflict and backoff) on the driver's stdout.

    spark-submit runs this module as a plain program with no logging set up, so the lines would be
    dropped; on stdout they reach the spark-submit output, which the hook streams into the task log.
    Only the provider's logger is configured: py4j's and pyspark's stay as Spark set them.
    """
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    package = logging.getLogger("airflow_delta_occ")
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    package.propagate = False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one airflow-delta-occ JobSpec with delta-spark")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--spec-file")
    group.add_argument("--spec-json")
    group.add_argument("--describe-table", help="print where a catalog table of this cluster lives (table_name=)")
    parser.add_argument("--local", action="store_true", help="start a local Delta session (tests, laptops)")
    parser.add_argument("--early-abort-interval", type=_watch_interval, metavar="SECONDS",
                        help="watch the table's log every SECONDS while the job runs, and stop it early when a "
                             "commit dooms it (spark.early_abort)")
    args = parser.parse_args(argv)
    _log_to_driver_output()
    if args.describe_table:
        return _describe_table(args.describe_table)
    try:
        text = args.spec_json if args.spec_json else open(args.spec_file, encoding="utf-8").read()
        spec = JobSpec.from_json(text)
    except (OSError, JobSpecError) as exc:
        print(f"airflow-delta-occ runner: cannot read the job spec: {exc}", file=sys.stderr, flush=True)
        return BAD_SPEC_EXIT_CODE
    if args.local:
        from airflow_delta_occ.spark.session import local_delta_session

        spark = local_delta_session("airflow-delta-occ-runner")
    else:
        spark = _driver_session()
        try:  # conflicts arrive as delta.exceptions classes, as in the embedded session
            import delta.exceptions.captured  # noqa: F401
        except ImportError:
            pass
    watch = _driver_table_watch(spark, spec, args.early_abort_interval) if args.early_abort_interval else None
    result = run_job(spark, spec, watch=watch)
    print(RESULT_PREFIX + result.to_json(), flush=True)
    return EXIT_CODES[result.status]


def _watch_interval(text: str) -> float:
    """``--early-abort-interval``: checked as ``[delta_occ] early_abort_interval`` is (NaN and inf refused)."""
    from airflow_delta_occ.config import check_early_abort_interval

    try:
        return check_early_abort_interval(float(text), "--early-abort-interval")
    except (ValueError, ProviderConfigError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _driver_table_watch(spark: Any, spec: JobSpec, interval: float) -> TableWatch | None:
    """Early abort in a driver (``spark-submit``): the table's log read through the driver's own Hadoop file
    system (``HadoopStorage``), where and as Spark reads the table; ``None`` (logged) when the catalog cannot
    say where a named table lives."""
    try:
        location = spec.target.path if spec.target.path is not None else \
            describe_table(spark, str(spec.target.name))["location"]
        storage = HadoopStorage(spark)
    except Exception as exc:   # an optimisation: the job runs unwatched, to Delta's own check
        logging.getLogger(__name__).warning("Early abort is off for this job: %s: %s", type(exc).__name__, exc)
        return None
    return TableWatch(open_log=lambda: DeltaLog.for_table(location, storage), interval=interval)


def _describe_table(name: str) -> int:
    """Look ``name`` up in the catalog of the cluster the driver runs on and print one ``TABLE_PREFIX`` line.

    ``table_name=`` in spark-submit mode must resolve where the jobs run, not in a Spark on the worker.
    """
    import json

    try:
        line = describe_table(_driver_session(), name)
    except Exception as exc:  # AnalysisException (no such table), or a setting the session refused
        line = {"error": (str(exc).strip().splitlines() or [type(exc).__name__])[0]}
    print(TABLE_PREFIX + json.dumps(line), flush=True)
    return 0


def describe_table(session: Any, name: str) -> dict[str, str]:
    """``{"location", "format"}`` of catalog table ``name`` (``DESCRIBE DETAIL``), in every mode.

    Raises:
        StatementTextError: the name holds ``${``; SessionSettingError: see ``pinned_settings``;
        and Spark's own error for a table that does not exist.
    """
    with pinned_settings(session):
        row = run_sql(session, f"DESCRIBE DETAIL {table_name_sql(name)}").collect()[0]
    return {"location": str(row["location"]), "format": str(row["format"])}


if __name__ == "__main__":
    sys.exit(main())
