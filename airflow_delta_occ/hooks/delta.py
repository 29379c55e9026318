"""``DeltaSparkHook``: where a JobSpec runs (embedded local Spark, spark-submit, or Spark Connect).

The connection (type ``delta_occ``, default id ``delta_occ_default``) is optional: without it jobs
run in an embedded local Spark session, the default for a laptop or a single worker. Its extras:

* ``mode``: ``embedded`` (default), ``spark-submit`` or ``connect``;
* ``spark_conn_id``: the Spark connection ``spark-submit`` uses (apache-airflow-providers-apache-spark);
* ``spark_connect_conn_id``: the Spark provider's ``spark_connect`` connection for Spark Connect
  (host, port, user id, the token in its password field, which Airflow masks, ``use_ssl``);
* ``connect_url``: ``sc://host:15002`` for a Connect server without a token (a URL carrying
  ``token=`` is refused: the token would sit unmasked in an extra);
* ``master``: the embedded session's master (default ``local[2]``);
* ``spark_conf``: Spark settings for every job of the connection;
* ``storage_conn_id``: the connection of the tables' object store (see ``hooks/storage.py``);
* ``spark_history_url``, ``spark_ui_url``: where the operators' Spark UI link points (see
  ``DeltaSparkHook.spark_ui_link``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_delta_occ.config import MODES, default_mode
from airflow_delta_occ.exceptions import DeltaJobError, JobKilledError, ProviderConfigError
from airflow_delta_occ.jobs.result import JobResult
from airflow_delta_occ.jobs.spec import JobSpec
from airflow_delta_occ.retry.classify import ConflictKind, classify_conflict, conflict_failure
from airflow_delta_occ.spark.session import CONNECT_MODE_FLAG
from airflow_delta_occ.spark.storage import (
    SECRET_CONF_ENV,
    SparkStorageSettings,
    is_secret_conf,
    split_secret_confs,
    with_redaction,
)

if TYPE_CHECKING:
    from airflow_delta_occ.engine.object_store import StorageCredentials


class DeltaSparkHook(BaseHook):
    conn_name_attr = "delta_conn_id"
    default_conn_name = "delta_occ_default"
    conn_type = "delta_occ"
    hook_name = "Delta Lake (airflow-delta-occ)"

    def __init__(self, delta_conn_id: str | None = default_conn_name, *, mode: str | None = None,
                 spark_conf: Mapping[str, str] | None = None, storage_conn_id: str | None = None) -> None:
        super().__init__()
        self.delta_conn_id = delta_conn_id
        extras: dict[str, Any] = {}
        if delta_conn_id:
            try:
                extras = dict(self.get_connection(delta_conn_id).extra_dejson)
            except AirflowNotFoundException:
                if delta_conn_id != self.default_conn_name:
                    raise
        self.extras = extras
        self.mode = mode or extras.get("mode") or default_mode()
        if self.mode not in MODES:
            raise DeltaJobError(f"unknown mode {self.mode!r} in connection {delta_conn_id!r}; use one of {MODES}")
        self.spark_conf = {**extras.get("spark_conf", {}), **(spark_conf or {})}
        # Object storage: the credentials the engine reads the table with are the job's too.
        self.storage_conn_id: str | None = storage_conn_id or extras.get("storage_conn_id") or None
        self._storage: SparkStorageSettings | None = None
        for key in ("spark_history_url", "spark_ui_url"):
            value = extras.get(key)
            if value is not None and not str(value).lower().startswith(("http://", "https://")):
                raise ProviderConfigError(f"connection {delta_conn_id!r}: {key} must be an http(s) URL, got {value!r}")
        #: Where the last job's Spark UI is (``spark_ui_link``), for the operators' extra link.
        self.spark_ui_url: str | None = None

    # -- object storage ---------------------------------------------------------------------------
    @functools.cached_property
    def storage_credentials(self) -> StorageCredentials | None:
        """The storage connection's credentials (``None`` without one: the stores' default chains)."""
        from airflow_delta_occ.hooks.storage import storage_credentials

        return storage_credentials(self.storage_conn_id) if self.storage_conn_id else None

    @property
    def storage(self) -> SparkStorageSettings:
        """The storage settings the next session or job gets: those of ``use_storage``, or, before it
        ran (a ``table_name`` lookup), the connection's store-wide settings."""
        if self._storage is None:
            from airflow_delta_occ.spark.storage import credential_settings

            credentials = self.storage_credentials
            return credential_settings(credentials) if credentials is not None else SparkStorageSettings()
        return self._storage

    def credentials_for(self, location: str) -> StorageCredentials | None:
        """What the engine reads ``location``'s log with (``None`` for a local path)."""
        from airflow_delta_occ.hooks.storage import credentials_for

        return credentials_for(location, self.storage_conn_id)

    def use_storage(self, *locations: str | None) -> None:
        """Give the next job the settings (credentials, connector jars) for the stores it touches,
        and refuse a job whose S3 commits could be lost before anything is written.

        Raises:
            UnsupportedStorageError: a URI holds credentials (shown redacted, masked in the log).
            UnsafeLogStoreError: the table is on S3, each job starts its own driver and no LogStore
                coordinates drivers (see ``spark.storage.unsafe_s3_commit``), under the default
                ``[delta_occ] unsafe_s3_commits = refuse``.
            StorageConnectionError, UnsupportedStorageError: unusable storage settings.
        """
        from airflow_delta_occ.config import unsafe_s3_commits
        from airflow_delta_occ.engine.errors import UnsupportedStorageError
        from airflow_delta_occ.engine.object_store import redact_uri, uri_secrets
        from airflow_delta_occ.hooks.storage import mask_uri_secrets
        from airflow_delta_occ.spark.storage import check_s3_commits, storage_settings

        mask_uri_secrets(*locations)  # a URI with credentials is refused here and never shown in the log
        used = [loc for loc in locations if loc]
        for location in used:
            if uri_secrets(location):
                raise UnsupportedStorageError(f"{redact_uri(location)}: credentials do not belong in a table or "
                                              "source URI (put them in a storage connection: storage_conn_id)")
        if used:
            warning = check_s3_commits(used[0], self.mode, self.spark_conf, unsafe_s3_commits())
            if warning:
                self.log.warning("%s", warning)
        self._storage = storage_settings(used, self.storage_credentials)

    def _conf_with_storage(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` confs, then the storage settings, then the user's; connector jars join the packages.

        Spark's redaction pattern is widened when a secret is among them (``spark.storage.with_redaction``)
        so its UI and event logs hide OpenLineage transport credentials and ABFS keys too."""
        conf = {**base, **self.storage.spark_conf(), **self.spark_conf}
        packages = [p for value in (base.get("spark.jars.packages"), ",".join(self.storage.packages),
                                    self.spark_conf.get("spark.jars.packages")) if value for p in value.split(",")]
        if packages:
            conf["spark.jars.packages"] = ",".join(dict.fromkeys(p.strip() for p in packages if p.strip()))
        return with_redaction(conf)

    # -- sessions ---------------------------------------------------------------------------------
    def connect_url(self) -> str:
        """The Spark Connect URL: from the ``spark_connect`` connection named by ``spark_connect_conn_id``
        (built by the Spark provider's ``SparkConnectHook``), else ``connect_url``, else ``SPARK_REMOTE``.

        Raises:
            ProviderConfigError: none of them is set, or ``connect_url`` carries a token.
        """
        conn_id = self.extras.get("spark_connect_conn_id")
        if conn_id:
            from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

            return SparkConnectHook(conn_id).get_connection_url()
        url = self.extras.get("connect_url") or os.environ.get("SPARK_REMOTE")
        if not url:
            raise ProviderConfigError(f"connect mode needs spark_connect_conn_id (a spark_connect connection) or "
                                      f"connect_url in the extras of connection {self.delta_conn_id!r}")
        if "token=" in str(url).lower() and self.extras.get("connect_url"):
            raise ProviderConfigError(f"connection {self.delta_conn_id!r}: connect_url carries a token, which would "
                                      "be stored and shown unmasked; put the server in a spark_connect connection "
                                      "(token in its password field) and name it with spark_connect_conn_id")
        return str(url)

    def get_spark(self) -> Any:
        """A SparkSession for embedded or Connect mode (a new Connect session on every call).

        Embedded: the secret confs (storage keys, OpenLineage transport credentials) reach the JVM
        over py4j, never its command line (see ``spark.session.local_delta_session``).
        """
        if self.mode == "connect":
            from pyspark.sql import SparkSession

            return SparkSession.builder.remote(self.connect_url()).create()
        from airflow_delta_occ.spark.session import delta_submit_conf, local_delta_session

        conf = self._conf_with_storage({"spark.jars.packages": delta_submit_conf()["spark.jars.packages"]})
        spark = local_delta_session("airflow-delta-occ", master=self.extras.get("master", "local[2]"), conf=conf)
        # An earlier task of this process may have left its OpenLineage parent on the session; the
        # runner's job session copies this one's, so a job given no parent must not inherit it.
        from airflow_delta_occ.jobs.result import OpenLineageParent

        for key in set(OpenLineageParent.SPARK_CONF.values()).difference(conf):
            spark.conf.unset(key)
        # A session this process started earlier keeps its Hadoop settings: give it this job's too
        # (the embedded session belongs to one task process).
        hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
        for key, value in self.storage.hadoop.items():
            hadoop_conf.set(key, value)
        return spark

    @contextlib.contextmanager
    def job_session(self) -> Iterator[Any]:
        """The session one job runs in; a Connect session is private to the job and closed after it.

        Opening a Connect session makes pyspark set ``SPARK_CONNECT_MODE_ENABLED`` for the whole
        process, after which a classic session (the embedded mode) cannot start and ``spark-submit``
        children inherit the flag. The worker is left as it was found, so modes can be mixed in one
        process (``airflow dags test`` runs every task in one).
        """
        if self.mode != "connect":
            yield self.get_spark()
            return
        flag_before = os.environ.get(CONNECT_MODE_FLAG)
        spark = self.get_spark()
        try:
            for key, value in self.storage.hadoop.items():  # session-level Hadoop settings on the server
                spark.conf.set(key, value)
            self._set_connect_conf(spark)  # the user's last: it overrides the storage settings
            yield spark
        finally:
            try:
                spark.stop()  # releases the server-side session and the job's cached source
            finally:
                if flag_before is None:
                    os.environ.pop(CONNECT_MODE_FLAG, None)
                else:
                    os.environ[CONNECT_MODE_FLAG] = flag_before

    def _set_connect_conf(self, spark: Any) -> None:
        """Set ``spark_conf`` (the connection's, the task's, the OpenLineage properties) on the job's
        Connect session.

        A Connect client can change only its session's runtime settings (``spark.sql.*``, Delta's,
        ``spark.hadoop.*``, OpenLineage's); the server's own launch fixes the rest (executor memory,
        jars, SQL extensions), and the server refuses them with ``CANNOT_MODIFY_CONFIG`` or
        ``CANNOT_MODIFY_STATIC_CONFIG``. Those keys are skipped with one warning naming them, not
        raised: a connection's ``spark_conf`` also serves its spark-submit jobs, where such keys are
        right, and pyspark's own Connect builder skips them too (silently; here the task log says
        so). A value the server rejects for a key it *would* set (a mistyped number) is the
        author's error, and the job would otherwise run with a setting it was not given.

        Raises:
            ProviderConfigError: the server rejected a value, naming the key (a secret's value is not shown).
        """
        from pyspark.errors import PySparkException

        skipped = []
        for key, value in self.spark_conf.items():
            try:
                spark.conf.set(key, value)
            except PySparkException as exc:
                condition = exc.getCondition() or ""
                if condition in CONNECT_SERVER_WIDE_CONDITIONS:
                    skipped.append(key)
                    continue
                if not condition.startswith("INVALID_CONF_VALUE"):
                    raise
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else condition
                shown = "***" if is_secret_conf(key) else repr(value)
                if is_secret_conf(key) and value:
                    reason = reason.replace(value, "***")
                raise ProviderConfigError(f"the Spark Connect server refused spark_conf {key}={shown}: {reason}") \
                    from exc
        if skipped:
            self.log.warning("Spark Connect: spark_conf %s not applied to the job's session: the server fixes "
                             "them when it starts (set them in the server's own configuration)", ", ".join(skipped))

    def test_connection(self) -> tuple[bool, str]:
        """The connection form's test button: can this connection run a job?

        * embedded: a Java runtime starts and the delta-spark coordinates are known (no session is
          started: the test runs in the api-server);
        * spark-submit: the Spark connection exists and its ``spark-submit`` runs ``--version``;
        * connect: a session opens on the server and runs ``SELECT 1``.
        """
        try:
            if self.mode == "connect":
                reachable = _reachable(self.connect_url())
                if reachable is not None:  # pyspark's client would retry for minutes
                    return False, f"connect: {reachable}"
                with self.job_session() as spark:
                    value = spark.sql("SELECT 1 AS ok").collect()[0]["ok"]
                return value == 1, f"Spark Connect at {_without_params(self.connect_url())} answered SELECT 1"
            if self.mode == "spark-submit":
                return self._test_submit()
            return self._test_embedded()
        except Exception as exc:  # the button shows the reason; nothing is raised to the UI
            return False, f"{self.mode}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"

    def _test_embedded(self) -> tuple[bool, str]:
        import subprocess

        from airflow_delta_occ.spark.session import delta_maven_coordinates

        java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            return False, f"embedded: {java} -version failed: {done.stderr.strip()[:300]}"
        version = (done.stderr or done.stdout).strip().splitlines()[0]
        return True, f"embedded: {version}; Delta jars {delta_maven_coordinates()}"

    def _test_submit(self) -> tuple[bool, str]:
        import subprocess

        conn_id = self.extras.get("spark_conn_id", "spark_default")
        self.get_connection(conn_id)  # AirflowNotFoundException names it
        hook = _submit_hook_class()(conn_id=conn_id, application="", conf={})
        binary = hook._connection["spark_binary"]
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=120, check=False)
        output = (done.stdout + done.stderr).strip()
        if done.returncode != 0:
            return False, f"spark-submit: {binary} --version exited {done.returncode}: {output[-300:]}"
        version = next((line.strip() for line in output.splitlines() if "version" in line.lower()), output[:100])
        return True, f"spark-submit: connection {conn_id!r} to {hook._connection['master']}, {binary}: {version}"

    def table_location(self, name: str) -> str:
        """The storage location of a catalog table (so the engine can read its log)."""
        from airflow_delta_occ.engine.errors import TableNotFoundError
        from airflow_delta_occ.jobs.text import refuse_substitution

        refuse_substitution(name, "table_name")
        if self.mode == "spark-submit":  # the cluster's catalog, through the runner on the cluster
            row = self._describe_on_cluster(name)
            if "error" in row:
                raise TableNotFoundError(name, row["error"])
        else:
            from airflow_delta_occ.spark.runner import describe_table

            with self.job_session() as spark:
                try:
                    row = describe_table(spark, name)
                except DeltaJobError:  # the name or the session refused: not a missing table
                    raise
                except Exception as exc:  # AnalysisException (classic or Connect): no such table
                    raise TableNotFoundError(name, str(exc).strip().splitlines()[0]) from exc
        if str(row["format"]).lower() != "delta":
            raise TableNotFoundError(name, f"the catalog table is {row['format']}, not Delta")
        return str(row["location"])

    def _describe_on_cluster(self, name: str) -> dict[str, str]:
        """The runner's ``--describe-table`` line, submitted like a job (``{"error": ...}`` when missing)."""
        from airflow_delta_occ.spark import runner
        from airflow_delta_occ.spark.session import delta_submit_conf

        hook = _submit_hook_class()(
            conn_id=self.extras.get("spark_conn_id", "spark_default"), application=runner.__file__,
            application_args=["--describe-table", name], conf=self._conf_with_storage(delta_submit_conf()),
            name=f"delta-occ-describe-{name}")
        hook.submit(hook.application)
        table: dict[str, str] | None = hook.table
        if table is None:
            raise DeltaJobError(f"spark-submit finished without the runner's table line for {name!r}")
        return table

    # -- running ----------------------------------------------------------------------------------
    def run(self, spec: JobSpec) -> JobResult:
        """Execute the job and return its result; any other outcome raises its typed exception.

        Every mode returns the runner's ``JobResult`` through its JSON form, and one call
        (``JobResult.raise_for_status``) decodes it: the same failure raises the same class with the
        same message whether the job ran embedded, through ``spark-submit`` or over Spark Connect.

        Raises:
            JobKilledError: ``on_kill`` stopped the job before it committed.
        """
        self._killed = False
        self.spark_ui_url = self.spark_ui_link(None, None)
        try:
            if self.mode == "spark-submit":
                result = self._submit(spec)
            else:
                from airflow_delta_occ.spark.runner import run_job

                with self.job_session() as spark, self._tracked(spark):
                    result = JobResult.from_json(run_job(spark, spec).to_json())
            self.spark_ui_url = self.spark_ui_link(result.spark_app_id, result.spark_ui_url)
            return result.raise_for_status()
        except Exception as exc:
            if not self._killed:
                raise
            # A job that committed before the kill returned its result above; this one did not.
            raise JobKilledError(f"the {self.mode} job on {spec.target.label} was stopped by on_kill before it "
                                 f"committed: {type(exc).__name__}: {str(exc).strip()[:500]}") from exc

    # -- stopping ---------------------------------------------------------------------------------
    _running: RunningJob | None = None
    _killed: bool = False

    @contextlib.contextmanager
    def _tracked(self, spark: Any) -> Iterator[None]:
        """Tag every Spark job this thread starts for the job, so ``on_kill`` can cancel exactly those.

        Embedded: a SparkContext job tag (thread-local, inherited by the runner's private session)
        with interrupt-on-cancel, so a cancelled task stops at once instead of finishing its
        partition. Connect: a session tag (the session is the job's own, so ``on_kill`` interrupts
        all of its operations anyway).
        """
        tag = f"delta-occ-{uuid.uuid4().hex}"
        connect = self.mode == "connect"
        previous: str | None = None
        if connect:
            spark.addTag(tag)
        else:
            context = spark.sparkContext
            context.addJobTag(tag)
            previous = context.getLocalProperty(INTERRUPT_ON_CANCEL)
            context.setInterruptOnCancel(True)
        self._running = RunningJob(self.mode, tag, session=spark)
        try:
            yield
        except BaseException as exc:
            self._stop_if_interrupted(exc)
            raise
        finally:
            self._running = None
            with contextlib.suppress(Exception):  # a killed session is stopped: nothing left to clear
                if connect:
                    spark.removeTag(tag)
                else:
                    spark.sparkContext.removeJobTag(tag)
                    spark.sparkContext.setLocalProperty(INTERRUPT_ON_CANCEL, previous)

    def _stop_if_interrupted(self, exc: BaseException) -> None:
        """Stop the job's Spark work when something other than the job's own outcome unwinds through it.

        ``execution_timeout`` raises ``AirflowTaskTimeout`` (a ``BaseException``) inside the wait,
        and the Task SDK calls ``on_kill`` only after ``execute`` has returned, when no job is
        tracked any more: a spark-submit driver or the session's jobs would go on and could still
        commit. An ordinary ``Exception`` is the job's own failure and needs no stop.
        """
        if not isinstance(exc, Exception) and self._running is not None:
            self.log.warning("%s while the %s job ran: stopping its Spark work", type(exc).__name__, self.mode)
            self.on_kill()

    def on_kill(self) -> None:
        """Stop the Spark work of the job ``run`` is executing (the operator calls this when its task is
        killed); nothing happens when no job runs.

        * embedded: cancel the jobs tagged for this job, then stop the session (the task process's
          own local Spark);
        * spark-submit: ``SparkSubmitHook.on_kill`` kills the spark-submit process (the driver in
          client mode) and, in cluster deploy mode, the driver or application through the cluster
          manager (standalone master, YARN, Kubernetes);
        * Connect: interrupt every operation of the job's session on the server, then close it.

        ``run`` then raises ``JobKilledError``, unless the job committed before the kill.
        The Task SDK calls ``on_kill`` from its SIGTERM handler, in the thread that is waiting inside
        a Spark call: the Spark calls are made from a helper thread, which has its own py4j
        connection (reusing the waiting one would block until the job ends).
        """
        running = self._running
        if running is None:
            return
        self._killed = True
        if running.submit is not None:
            self.log.info("Killing the spark-submit job %s", running.tag)
            running.submit.on_kill()
            return
        stopper = threading.Thread(target=_stop_session, args=(running, self.log), name="delta-occ-on-kill",
                                   daemon=True)
        stopper.start()
        stopper.join(KILL_TIMEOUT_SECONDS)
        if stopper.is_alive():
            self.log.warning("Spark did not confirm the %s job %s stopped within %s s", running.mode, running.tag,
                             KILL_TIMEOUT_SECONDS)

    def spark_ui_link(self, app_id: str | None, live_url: str | None) -> str | None:
        """Where a job's Spark UI is, best first: the connection's history server at the job's
        application (``spark_history_url``: lasts after the driver is gone), else ``spark_ui_url``,
        else the driver's live UI as it reported it (embedded and spark-submit: gone with the driver;
        Connect: the server's), else, for Spark Connect, the server's host on Spark's default port.

        Only http(s) URLs are returned: the link is rendered in the Airflow UI.
        """
        from urllib.parse import quote, urlparse

        history = self.extras.get("spark_history_url")
        if history and app_id:
            return f"{str(history).rstrip('/')}/history/{quote(app_id, safe='')}/jobs/"
        configured = self.extras.get("spark_ui_url")
        if configured:
            return str(configured)
        if live_url and live_url.lower().startswith(("http://", "https://")):
            return live_url
        if self.mode == "connect":
            try:
                host = urlparse(_without_params(self.connect_url()).replace("sc://", "http://", 1)).hostname
            except ProviderConfigError:
                return None
            return f"http://{host}:4040" if host else None
        return None

    def _submit(self, spec: JobSpec) -> JobResult:
        from airflow_delta_occ.spark import runner
        from airflow_delta_occ.spark.session import delta_submit_conf

        hook = _submit_hook_class()(
            conn_id=self.extras.get("spark_conn_id", "spark_default"),
            application=runner.__file__,
            application_args=["--spec-json", spec.to_json()],
            conf=self._conf_with_storage(delta_submit_conf()),
            name=f"delta-occ-{spec.run.dag_id}.{spec.run.task_id}",
        )
        self._running = RunningJob(self.mode, str(hook._name), submit=hook)
        try:
            hook.submit(hook.application)
        except BaseException as exc:
            if not isinstance(exc, Exception):
                self._stop_if_interrupted(exc)
                raise
            reported: JobResult | None = hook.result
            if reported is not None:  # the runner reported its outcome; the exit code only repeats it
                return reported
            if hook.conflict is not None:  # the driver died after Delta raised a conflict
                raise conflict_failure(hook.conflict, 0, exc) from exc
            raise
        finally:
            self._running = None
        final: JobResult | None = hook.result
        if final is None:
            raise DeltaJobError("spark-submit finished without the runner's result line")
        return final


def _reachable(url: str, timeout: float = 5.0) -> str | None:
    """Why nothing accepts connections at a Connect URL's host and port, or ``None`` when something does."""
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(_without_params(url).replace("sc://", "http://", 1))
    host, port = parsed.hostname or "localhost", parsed.port or 15002
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return f"cannot reach {host}:{port}: {exc}"
    return None


def _without_params(url: str) -> str:
    """A Connect URL without its ``;token=...`` parameters, for messages."""
    return url.split(";", 1)[0]


INTERRUPT_ON_CANCEL = "spark.job.interruptOnCancel"
#: Spark Connect's error conditions for a key only the server's launch can set (skipped, with a warning).
CONNECT_SERVER_WIDE_CONDITIONS = frozenset({"CANNOT_MODIFY_CONFIG", "CANNOT_MODIFY_STATIC_CONFIG"})
KILL_TIMEOUT_SECONDS = 60.0
"""How long ``on_kill`` waits for Spark to confirm the stop (the Task SDK's SIGKILL follows anyway)."""


@dataclass(frozen=True)
class RunningJob:
    """What ``DeltaSparkHook.on_kill`` stops: the job's session and tag, or its spark-submit hook."""

    mode: str
    tag: str
    session: Any = None
    submit: Any = None


def _stop_session(running: RunningJob, log: Any) -> None:
    """Cancel the job's Spark work and stop its session; every step is tried, none raises."""
    session = running.session
    try:
        if running.mode == "connect":
            interrupted = session.interruptAll()  # the session is the job's own
            log.info("Interrupted %d Spark Connect operation(s) of job %s", len(interrupted), running.tag)
        else:
            session.sparkContext.cancelJobsWithTag(running.tag)
            log.info("Cancelled the Spark jobs tagged %s", running.tag)
    except Exception as exc:  # the stop below still ends the work
        log.warning("Could not cancel the Spark work of job %s: %s", running.tag, exc)
    try:
        session.stop()
        log.info("Stopped the Spark session of job %s", running.tag)
    except Exception as exc:
        log.warning("Could not stop the Spark session of job %s: %s", running.tag, exc)


@functools.cache
def _submit_hook_class() -> Any:
    # Built lazily: importing this module must not need the Spark provider.
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_delta_occ.spark.runner import RESULT_PREFIX, TABLE_PREFIX

    class ResultCapturingSubmitHook(SparkSubmitHook):
        """Reads the runner's result line and classifies conflicts from *every* driver output line.

        The base hook keeps only the last 20 lines for its error message; a conflict printed earlier
        would be lost there.
        """

        def __init__(self, *, application: str, conf: Mapping[str, str] | None = None, **kwargs: Any) -> None:
            public, secrets = split_secret_confs(conf or {})
            super().__init__(conf=public, **kwargs)
            self.application = application
            self.secret_env: dict[str, str] = {}
            if secrets and self._connection["deploy_mode"] == "cluster":
                # A driver on the cluster gets nothing from this process's environment: --conf is the
                # only way there (the cluster's own credentials avoid it; see docs/object-storage.md).
                self._conf = {**self._conf, **secrets}
            elif secrets:
                self.secret_env = {SECRET_CONF_ENV: json.dumps(secrets)}
            self.result: JobResult | None = None
            self.conflict: ConflictKind | None = None
            self.table: dict[str, str] | None = None

        def submit(self, application: str = "", **kwargs: Any) -> str | None:
            """Run spark-submit with the secret confs in its environment when the driver runs here."""
            if self.secret_env:
                kwargs.setdefault("env", {**os.environ, **self.secret_env})
            result: str | None = super().submit(application, **kwargs)
            return result

        def _process_spark_submit_log(self, itr: Iterable[str]) -> None:
            # Each line reaches the base hook (and the task log) as the driver prints it.
            super()._process_spark_submit_log(self._read(itr))

        def _read(self, itr: Iterable[str]) -> Iterator[str]:
            """Pass the driver's lines through one by one, picking up the result and the first conflict."""
            for raw in itr:
                line = raw.strip()
                if line.startswith(RESULT_PREFIX):
                    self.result = JobResult.from_json(line[len(RESULT_PREFIX):])
                elif line.startswith(TABLE_PREFIX):
                    self.table = {str(k): str(v) for k, v in json.loads(line[len(TABLE_PREFIX):]).items()}
                elif self.conflict is None:
                    self.conflict = classify_conflict(line)
                yield raw

    return ResultCapturingSubmitHook
