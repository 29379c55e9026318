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

Each mode is a ``JobTransport`` (``hooks/transports/``), picked once when the hook is built. A test
(of an operator or of a whole DAG) runs the jobs without Spark through ``MemoryTransport``: installed
under a mode name (``register_transport``, or ``MemoryTransport.registered("memory")``) and chosen
with the connection extra ``mode``, or given directly as ``DeltaSparkHook(transport=...)``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_delta_occ.config import MODES, default_mode
from airflow_delta_occ.exceptions import DeltaJobError, JobKilledError, ProviderConfigError
from airflow_delta_occ.hooks.transports.base import JobTransport, RunningJob, transport_factory
from airflow_delta_occ.jobs.result import JobResult
from airflow_delta_occ.jobs.spec import JobSpec, commit_identity_confs
from airflow_delta_occ.spark.storage import SparkStorageSettings, with_redaction

if TYPE_CHECKING:
    from airflow_delta_occ.engine.object_store import StorageCredentials
    from airflow_delta_occ.spark.early_abort import TableWatch


class DeltaSparkHook(BaseHook):
    conn_name_attr = "delta_conn_id"
    default_conn_name = "delta_occ_default"
    conn_type = "delta_occ"
    hook_name = "Delta Lake (airflow-delta-occ)"

    def __init__(self, delta_conn_id: str | None = default_conn_name, *, mode: str | None = None,
                 spark_conf: Mapping[str, str] | None = None, storage_conn_id: str | None = None,
                 transport: JobTransport | None = None) -> None:
        """
        Args:
            transport: run the jobs through this transport (its mode is the hook's) instead of the
                one the mode names; ``transports.MemoryTransport`` runs them without Spark.
        """
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
        self.mode: str = transport.mode if transport is not None else mode or extras.get("mode") or default_mode()
        factory = transport.bind if transport is not None else transport_factory(self.mode)
        if factory is None:
            raise DeltaJobError(f"unknown mode {self.mode!r} in connection {delta_conn_id!r}; use one of {MODES}")
        connection_conf = extras.get("spark_conf") or {}
        if not isinstance(connection_conf, Mapping):
            raise ProviderConfigError(f"connection {delta_conn_id!r}: spark_conf must be an object of Spark settings, "
                                      f"got {type(connection_conf).__name__}")
        for where, conf in ((f"connection {delta_conn_id!r}", connection_conf), ("the hook's", spark_conf or {})):
            if owned := commit_identity_confs(conf):
                raise ProviderConfigError(f"{where} spark_conf sets {', '.join(owned)}: the provider names each commit "
                                          "after the task run itself; remove it")
        self.spark_conf = {**connection_conf, **(spark_conf or {})}
        # Object storage: the credentials the engine reads the table with are the job's too.
        self.storage_conn_id: str | None = storage_conn_id or extras.get("storage_conn_id") or None
        self._storage: SparkStorageSettings | None = None
        for key in ("spark_history_url", "spark_ui_url"):
            value = extras.get(key)
            if value is not None and not str(value).lower().startswith(("http://", "https://")):
                raise ProviderConfigError(f"connection {delta_conn_id!r}: {key} must be an http(s) URL, got {value!r}")
        #: Where the last job's Spark UI is (``spark_ui_link``), for the operators' extra link.
        self.spark_ui_url: str | None = None
        #: How this hook's jobs reach Spark (one per mode; see ``hooks/transports``).
        self.transport: JobTransport = factory(self)

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
            policy = unsafe_s3_commits()
            # One long-lived driver (Spark Connect's server) keeps S3 commits exclusive on its own.
            warning = None if self.transport.one_driver else check_s3_commits(used[0], self.mode, self.spark_conf,
                                                                               policy)
            if warning:
                self.log.warning("%s", warning)
        self._storage = storage_settings(used, self.storage_credentials)

    def conf_with_storage(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` confs, then the storage settings, then the user's; connector jars join the packages.

        Spark's redaction pattern is widened when a secret is among them (``spark.storage.with_redaction``)
        so its UI and event logs hide OpenLineage transport credentials and ABFS keys too."""
        conf = {**base, **self.storage.spark_conf(), **self.spark_conf}
        packages = [p for value in (base.get("spark.jars.packages"), ",".join(self.storage.packages),
                                    self.spark_conf.get("spark.jars.packages")) if value for p in value.split(",")]
        if packages:
            conf["spark.jars.packages"] = ",".join(dict.fromkeys(p.strip() for p in packages if p.strip()))
        return with_redaction(conf)

    _conf_with_storage = conf_with_storage

    # -- sessions ---------------------------------------------------------------------------------
    def connect_url(self) -> str:
        """The Spark Connect URL: from the ``spark_connect`` connection named by ``spark_connect_conn_id``
        (built by the Spark provider's ``SparkConnectHook``), else ``connect_url``, else ``SPARK_REMOTE``.

        Raises:
            ProviderConfigError: none of them is set, or ``connect_url`` carries a token.
        """
        from airflow_delta_occ.hooks.transports.connect import connect_url

        return connect_url(self.extras, self.delta_conn_id)

    def get_spark(self) -> Any:
        """A SparkSession for embedded or Connect mode (a new Connect session on every call; the
        embedded session in spark-submit mode).

        Embedded: the secret confs (storage keys, OpenLineage transport credentials) reach the JVM
        over py4j, never its command line (see ``spark.session.local_delta_session``).
        """
        return self.transport.get_spark()

    def warm_up(self) -> None:
        """Get ready to run a job soon (start the embedded JVM, load the Connect client), so a job that
        waits for its lease starts its Spark work as soon as it is granted."""
        self.transport.warm_up()

    @property
    def light_warm_up(self) -> bool:
        """Whether ``warm_up`` may start with the task, before the job is planned (it loads code only)."""
        return self.transport.light_warm_up

    def job_session(self) -> contextlib.AbstractContextManager[Any]:
        """The session one job runs in; a Connect session is private to the job and closed after it
        (see ``transports.connect.ConnectTransport.job_session``)."""
        result: contextlib.AbstractContextManager[Any] = self.transport.job_session()
        return result

    def test_connection(self) -> tuple[bool, str]:
        """The connection form's test button: can this connection run a job?

        * embedded: a Java runtime starts and the delta-spark coordinates are known (no session is
          started: the test runs in the api-server);
        * spark-submit: the Spark connection exists and its ``spark-submit`` runs ``--version``;
        * connect: a session opens on the server and runs ``SELECT 1``.
        """
        try:
            return self.transport.test_connection()
        except Exception as exc:  # the button shows the reason; nothing is raised to the UI
            return False, f"{self.mode}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"

    def table_location(self, name: str) -> str:
        """The storage location of a catalog table (so the engine can read its log), looked up where
        the jobs run (spark-submit: the cluster's catalog, through the runner on the cluster)."""
        from airflow_delta_occ.engine.errors import TableNotFoundError
        from airflow_delta_occ.jobs.text import refuse_substitution

        refuse_substitution(name, "table_name")
        table = self.transport.describe_table(name)
        if table.format.lower() != "delta":
            raise TableNotFoundError(name, f"the catalog table is {table.format}, not Delta")
        return table.location

    # -- running ----------------------------------------------------------------------------------
    def run(self, spec: JobSpec, *, watch: TableWatch | None = None) -> JobResult:
        """Execute the job and return its result; any other outcome raises its typed exception.

        ``watch`` (how to read the table's log, and how often) turns early abort on: embedded and over Spark
        Connect the runner in this process reads the log as ``watch`` says; a ``spark-submit`` driver reads it
        through its own Hadoop file system at ``watch``'s interval.

        Every mode returns the runner's ``JobResult`` through its JSON form, and one call
        (``JobResult.raise_for_status``) decodes it: the same failure raises the same class with the
        same message whether the job ran embedded, through ``spark-submit`` or over Spark Connect.

        Raises:
            JobKilledError: ``on_kill`` stopped the job before it committed.
        """
        transport = self.transport
        transport.killed = False
        self.spark_ui_url = self.spark_ui_link(None, None)
        try:
            result = transport.run(spec, watch=watch)
            self.spark_ui_url = self.spark_ui_link(result.spark_app_id, result.spark_ui_url)
            return result.raise_for_status()
        except Exception as exc:
            if not transport.killed:
                raise
            # A job that committed before the kill returned its result above; this one did not.
            raise JobKilledError(f"the {self.mode} job on {spec.target.label} was stopped by on_kill before it "
                                 f"committed: {type(exc).__name__}: {str(exc).strip()[:500]}") from exc

    # -- stopping ---------------------------------------------------------------------------------
    @property
    def _running(self) -> RunningJob | None:
        """The job ``run`` is executing (its session and tag, or its spark-submit hook)."""
        return self.transport.running

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
        self.transport.kill()

    def spark_ui_link(self, app_id: str | None, live_url: str | None) -> str | None:
        """Where a job's Spark UI is, best first: the connection's history server at the job's
        application (``spark_history_url``: lasts after the driver is gone), else ``spark_ui_url``,
        else the driver's live UI as it reported it (embedded and spark-submit: gone with the driver;
        Connect: the server's), else, for Spark Connect, the server's host on Spark's default port.

        Only http(s) URLs are returned: the link is rendered in the Airflow UI.
        """
        from urllib.parse import quote

        history = self.extras.get("spark_history_url")
        if history and app_id:
            return f"{str(history).rstrip('/')}/history/{quote(app_id, safe='')}/jobs/"
        configured = self.extras.get("spark_ui_url")
        if configured:
            return str(configured)
        if live_url and live_url.lower().startswith(("http://", "https://")):
            return live_url
        return self.transport.default_ui_url()
