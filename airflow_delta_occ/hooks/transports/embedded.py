"""``embedded``: jobs run in a local Spark session of the task process (the default, for a laptop or a
single worker)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from airflow_delta_occ.hooks.transports.base import RunningJob
from airflow_delta_occ.hooks.transports.session import SessionTransport

INTERRUPT_ON_CANCEL = "spark.job.interruptOnCancel"


class EmbeddedTransport(SessionTransport):
    mode = "embedded"

    def get_spark(self) -> Any:
        """The process's local Delta session, with this hook's confs and storage settings.

        The secret confs (storage keys, OpenLineage transport credentials) reach the JVM over py4j,
        never its command line (see ``spark.session.local_delta_session``).
        """
        from airflow_delta_occ.jobs.result import OpenLineageParent
        from airflow_delta_occ.spark.session import delta_submit_conf, local_delta_session

        host = self.host
        conf = host.conf_with_storage({"spark.jars.packages": delta_submit_conf()["spark.jars.packages"]})
        spark = local_delta_session("airflow-delta-occ", master=host.extras.get("master", "local[2]"), conf=conf)
        # An earlier task of this process may have left its OpenLineage parent on the session; the
        # runner's job session copies this one's, so a job given no parent must not inherit it.
        for key in set(OpenLineageParent.SPARK_CONF.values()).difference(conf):
            spark.conf.unset(key)
        # A session this process started earlier keeps its Hadoop settings: give it this job's too
        # (the embedded session belongs to one task process).
        hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
        for key, value in host.storage.hadoop.items():
            hadoop_conf.set(key, value)
        return spark

    def warm_up(self) -> None:
        """Start the process's session (the JVM: seconds) before the job needs it."""
        self.get_spark()

    @contextlib.contextmanager
    def job_session(self) -> Iterator[Any]:
        yield self.get_spark()

    def _tag(self, spark: Any, tag: str) -> Any:
        """A SparkContext job tag (thread-local, inherited by the runner's private session) with
        interrupt-on-cancel, so a cancelled task stops at once instead of finishing its partition."""
        from airflow_delta_occ.spark.jvm_output import expect_errors

        expect_errors()   # an earlier job of this process may have been killed: this one's errors count
        context = spark.sparkContext
        context.addJobTag(tag)
        previous = context.getLocalProperty(INTERRUPT_ON_CANCEL)
        context.setInterruptOnCancel(True)
        return previous

    def _untag(self, spark: Any, tag: str, previous: Any) -> None:
        spark.sparkContext.removeJobTag(tag)
        spark.sparkContext.setLocalProperty(INTERRUPT_ON_CANCEL, previous)

    def _cancel(self, running: RunningJob) -> None:
        """Cancel the jobs tagged for this job (the session, the task process's own, is stopped next). What
        the JVM logs from now on is the kill's fallout: logged at INFO at most (``jvm_output.after_kill``)."""
        from airflow_delta_occ.spark.jvm_output import after_kill

        after_kill()
        running.session.sparkContext.cancelJobsWithTag(running.tag)
        self.log.info("Cancelled the Spark jobs tagged %s", running.tag)

    def test_connection(self) -> tuple[bool, str]:
        """A Java runtime starts and the delta-spark coordinates are known (no session is started:
        the test runs in the api-server)."""
        import subprocess

        from airflow_delta_occ.spark.session import delta_maven_coordinates

        java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            return False, f"embedded: {java} -version failed: {done.stderr.strip()[:300]}"
        version = (done.stderr or done.stdout).strip().splitlines()[0]
        return True, f"embedded: {version}; Delta jars {delta_maven_coordinates()}"
