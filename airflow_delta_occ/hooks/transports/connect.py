"""``connect``: every job runs in a private session on a Spark Connect server."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from airflow_delta_occ.exceptions import ProviderConfigError
from airflow_delta_occ.hooks.transports.base import RunningJob
from airflow_delta_occ.hooks.transports.session import SessionTransport
from airflow_delta_occ.spark.session import CONNECT_MODE_FLAG
from airflow_delta_occ.spark.storage import is_secret_conf

#: Spark Connect's error conditions for a key only the server's launch can set (skipped, with a warning).
CONNECT_SERVER_WIDE_CONDITIONS = frozenset({"CANNOT_MODIFY_CONFIG", "CANNOT_MODIFY_STATIC_CONFIG"})


def connect_url(extras: Mapping[str, Any], conn_id: str | None) -> str:
    """The Spark Connect URL: from the ``spark_connect`` connection named by ``spark_connect_conn_id``
    (built by the Spark provider's ``SparkConnectHook``), else ``connect_url``, else ``SPARK_REMOTE``.

    Raises:
        ProviderConfigError: none of them is set, or ``connect_url`` carries a token.
    """
    spark_connect_conn_id = extras.get("spark_connect_conn_id")
    if spark_connect_conn_id:
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        return str(SparkConnectHook(spark_connect_conn_id).get_connection_url())
    url = extras.get("connect_url") or os.environ.get("SPARK_REMOTE")
    if not url:
        raise ProviderConfigError(f"connect mode needs spark_connect_conn_id (a spark_connect connection) or "
                                  f"connect_url in the extras of connection {conn_id!r}")
    if "token=" in str(url).lower() and extras.get("connect_url"):
        raise ProviderConfigError(f"connection {conn_id!r}: connect_url carries a token, which would "
                                  "be stored and shown unmasked; put the server in a spark_connect connection "
                                  "(token in its password field) and name it with spark_connect_conn_id")
    return str(url)


class ConnectTransport(SessionTransport):
    mode = "connect"
    one_driver = True
    light_warm_up = True   # its warm-up imports the client, nothing more

    def connect_url(self) -> str:
        return connect_url(self.host.extras, self.host.delta_conn_id)

    def warm_up(self) -> None:
        """Load the Connect client (gRPC, protobuf: the better part of a second) before the job needs it.
        No session is opened: each job's is private and closed after it."""
        import pyspark.sql.connect.session  # noqa: F401

    def get_spark(self) -> Any:
        """A new session on the server (on every call)."""
        from pyspark.sql import SparkSession

        return SparkSession.builder.remote(self.connect_url()).create()

    @contextlib.contextmanager
    def job_session(self) -> Iterator[Any]:
        """A session private to the job, closed after it.

        Opening a Connect session makes pyspark set ``SPARK_CONNECT_MODE_ENABLED`` for the whole
        process, after which a classic session (the embedded mode) cannot start and ``spark-submit``
        children inherit the flag. The worker is left as it was found, so modes can be mixed in one
        process (``airflow dags test`` runs every task in one).
        """
        flag_before = os.environ.get(CONNECT_MODE_FLAG)
        spark = self.get_spark()
        try:
            for key, value in self.host.storage.hadoop.items():  # session-level Hadoop settings on the server
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
        for key, value in self.host.spark_conf.items():
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

    def _tag(self, spark: Any, tag: str) -> Any:
        """A session tag (the session is the job's own, so ``kill`` interrupts all of its operations anyway)."""
        spark.addTag(tag)
        return None

    def _untag(self, spark: Any, tag: str, previous: Any) -> None:
        spark.removeTag(tag)

    def _cancel(self, running: RunningJob) -> None:
        """Interrupt every operation of the job's session on the server (it is closed next)."""
        interrupted = running.session.interruptAll()  # the session is the job's own
        self.log.info("Interrupted %d Spark Connect operation(s) of job %s", len(interrupted), running.tag)

    def test_connection(self) -> tuple[bool, str]:
        """A session opens on the server and runs ``SELECT 1``."""
        reachable = _reachable(self.connect_url())
        if reachable is not None:  # pyspark's client would retry for minutes
            return False, f"connect: {reachable}"
        with self.job_session() as spark:
            value = spark.sql("SELECT 1 AS ok").collect()[0]["ok"]
        return value == 1, f"Spark Connect at {without_params(self.connect_url())} answered SELECT 1"

    def default_ui_url(self) -> str | None:
        """The server's host on Spark's default UI port."""
        from urllib.parse import urlparse

        try:
            host = urlparse(without_params(self.connect_url()).replace("sc://", "http://", 1)).hostname
        except ProviderConfigError:
            return None
        return f"http://{host}:4040" if host else None


def _reachable(url: str, timeout: float = 5.0) -> str | None:
    """Why nothing accepts connections at a Connect URL's host and port, or ``None`` when something does."""
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(without_params(url).replace("sc://", "http://", 1))
    host, port = parsed.hostname or "localhost", parsed.port or 15002
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return f"cannot reach {host}:{port}: {exc}"
    return None


def without_params(url: str) -> str:
    """A Connect URL without its ``;token=...`` parameters, for messages."""
    return url.split(";", 1)[0]
