"""``spark-submit``: every job is a Spark application of its own, started with the Spark provider's
``SparkSubmitHook`` (the runner is its program; its result comes back as one line of its output)."""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from airflow_delta_occ.exceptions import DeltaJobError
from airflow_delta_occ.hooks.transports.base import JobTransport, RunningJob, TableDescription, TransportHost
from airflow_delta_occ.jobs.result import JobResult
from airflow_delta_occ.retry.classify import ConflictKind, classify_conflict, conflict_failure
from airflow_delta_occ.spark.storage import SECRET_CONF_ENV, split_secret_confs

if TYPE_CHECKING:
    from airflow_delta_occ.jobs.spec import JobSpec
    from airflow_delta_occ.spark.early_abort import TableWatch


class SubmitTransport(JobTransport):
    mode = "spark-submit"

    def __init__(self, host: TransportHost) -> None:
        super().__init__(host)
        self.spark_conn_id: str = host.extras.get("spark_conn_id", "spark_default")

    def _hook(self, application_args: list[str], name: str) -> Any:
        from airflow_delta_occ.spark import runner
        from airflow_delta_occ.spark.session import delta_submit_conf

        return _submit_hook_class()(conn_id=self.spark_conn_id, application=runner.__file__,
                                    application_args=application_args,
                                    conf=self.host.conf_with_storage(delta_submit_conf()), name=name)

    def run(self, spec: JobSpec, *, watch: TableWatch | None = None) -> JobResult:
        """Submit the runner with ``spec``; with ``watch``, the driver watches the table for early abort at its
        interval, reading the log through its own Hadoop file system (``spark.hadoop_storage``): where and as
        Spark reads the table, with the cluster's credentials, so only the interval travels."""
        args = ["--spec-json", spec.to_json()]
        if watch is not None:
            args += ["--early-abort-interval", repr(float(watch.interval))]
        hook = self._hook(args, f"delta-occ-{spec.run.dag_id}.{spec.run.task_id}")
        self.running = RunningJob(self.mode, str(hook._name), submit=hook)
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
            self.running = None
        final: JobResult | None = hook.result
        if final is None:
            raise DeltaJobError("spark-submit finished without the runner's result line")
        return final

    def _stop(self, running: RunningJob) -> None:
        """``SparkSubmitHook.on_kill`` kills the spark-submit process (the driver in client mode) and,
        in cluster deploy mode, the driver or application through the cluster manager (standalone
        master, YARN, Kubernetes)."""
        self.log.info("Killing the spark-submit job %s", running.tag)
        running.submit.on_kill()

    def describe_table(self, name: str) -> TableDescription:
        """The cluster's catalog, through the runner's ``--describe-table`` submitted like a job."""
        from airflow_delta_occ.engine.errors import TableNotFoundError

        hook = self._hook(["--describe-table", name], f"delta-occ-describe-{name}")
        hook.submit(hook.application)
        table: TableDescription | str | None = hook.table
        if table is None:
            raise DeltaJobError(f"spark-submit finished without the runner's table line for {name!r}")
        if isinstance(table, str):
            raise TableNotFoundError(name, table)
        return table

    def test_connection(self) -> tuple[bool, str]:
        """The Spark connection exists and its ``spark-submit`` runs ``--version``."""
        import subprocess

        conn_id = self.spark_conn_id
        self.host.get_connection(conn_id)  # AirflowNotFoundException names it
        hook = _submit_hook_class()(conn_id=conn_id, application="", conf={})
        binary = hook._connection["spark_binary"]
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=120, check=False)
        output = (done.stdout + done.stderr).strip()
        if done.returncode != 0:
            return False, f"spark-submit: {binary} --version exited {done.returncode}: {output[-300:]}"
        version = next((line.strip() for line in output.splitlines() if "version" in line.lower()), output[:100])
        return True, f"spark-submit: connection {conn_id!r} to {hook._connection['master']}, {binary}: {version}"

    # A local session next to the cluster's, for code that wants one in the worker (as before the
    # transports: the hook's session outside Connect mode is the embedded one).
    def get_spark(self) -> Any:
        from airflow_delta_occ.hooks.transports.embedded import EmbeddedTransport

        return EmbeddedTransport(self.host).get_spark()

    def job_session(self) -> Any:
        from airflow_delta_occ.hooks.transports.embedded import EmbeddedTransport

        return EmbeddedTransport(self.host).job_session()


def for_the_task_log(raw: str, log: logging.Logger | Any) -> bool:
    """Whether a driver line goes on to ``SparkSubmitHook``, which logs every line at INFO.

    A stack trace's frames (``\tat ...``, ``... 12 more``) and log4j DEBUG lines are logged here at DEBUG
    instead: a missing source made 84 Java stack lines at INFO before the one line that says what is missing
    (issue #24). Its headline and its ``Caused by:`` lines stay. The levels are the embedded JVM's
    (``spark.jvm_output.line_level``); what the hook parses (application ids, exit codes) is never a frame.
    """
    from airflow_delta_occ.spark.jvm_output import line_level

    line = raw.rstrip("\r\n")
    if line_level(line) > logging.DEBUG or line.lstrip().startswith(("Caused by:", "Suppressed:")):
        return True   # a cause often says what went wrong (a missing jar, a 403): kept with the headline
    log.debug("%s", line)
    return False


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
            #: The runner's ``--describe-table`` answer: the table, or why it was not found.
            self.table: TableDescription | str | None = None

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
                    row = json.loads(line[len(TABLE_PREFIX):])
                    self.table = str(row["error"]) if "error" in row else TableDescription.from_row(row)
                elif self.conflict is None:
                    self.conflict = classify_conflict(line)
                if for_the_task_log(raw, self.log):
                    yield raw

    return ResultCapturingSubmitHook
