"""What the two modes that run the runner in a session of this process share (embedded and Connect):
running a job in ``job_session``, tagging its Spark work so ``kill`` stops exactly that, and looking a
catalog table up in the session."""

from __future__ import annotations

import contextlib
import threading
import uuid
from abc import abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from airflow_delta_occ.exceptions import DeltaJobError
from airflow_delta_occ.hooks.transports.base import JobTransport, RunningJob, TableDescription
from airflow_delta_occ.jobs.result import JobResult

if TYPE_CHECKING:
    from airflow_delta_occ.jobs.spec import JobSpec
    from airflow_delta_occ.spark.early_abort import TableWatch

KILL_TIMEOUT_SECONDS = 60.0
"""How long ``kill`` waits for Spark to confirm the stop (the Task SDK's SIGKILL follows anyway)."""


class SessionTransport(JobTransport):
    """A transport whose jobs run through ``spark.runner.run_job`` in a session this process holds."""

    @abstractmethod
    def get_spark(self) -> Any:
        """A SparkSession for this mode."""

    @abstractmethod
    def job_session(self) -> contextlib.AbstractContextManager[Any]:
        """The session one job runs in."""

    @abstractmethod
    def _tag(self, spark: Any, tag: str) -> Any:
        """Tag every Spark job this thread starts in ``spark``; returns what ``_untag`` restores."""

    @abstractmethod
    def _untag(self, spark: Any, tag: str, previous: Any) -> None:
        """Undo ``_tag``."""

    @abstractmethod
    def _cancel(self, running: RunningJob) -> None:
        """Cancel the Spark work tagged for ``running`` (may raise: ``_stop_session`` logs it)."""

    def run(self, spec: JobSpec, *, watch: TableWatch | None = None) -> JobResult:
        """Run ``spec`` in this process's session; with ``watch``, each attempt is watched for early abort."""
        from airflow_delta_occ.spark.runner import run_job

        with self.job_session() as spark, self._tracked(spark):
            # Through its JSON form, as the other modes' results travel.
            return JobResult.from_json(run_job(spark, spec, watch=watch).to_json())

    def describe_table(self, name: str) -> TableDescription:
        from airflow_delta_occ.engine.errors import TableNotFoundError
        from airflow_delta_occ.spark.runner import describe_table

        with self.job_session() as spark:
            try:
                return TableDescription.from_row(describe_table(spark, name))
            except DeltaJobError:  # the name or the session refused: not a missing table
                raise
            except Exception as exc:  # AnalysisException (classic or Connect): no such table
                raise TableNotFoundError(name, str(exc).strip().splitlines()[0]) from exc

    @contextlib.contextmanager
    def _tracked(self, spark: Any) -> Iterator[None]:
        """Tag every Spark job this thread starts for the job, so ``kill`` can cancel exactly those."""
        tag = f"delta-occ-{uuid.uuid4().hex}"
        previous = self._tag(spark, tag)
        self.running = RunningJob(self.mode, tag, session=spark)
        try:
            yield
        except BaseException as exc:
            self._stop_if_interrupted(exc)
            raise
        finally:
            self.running = None
            with contextlib.suppress(Exception):  # a killed session is stopped: nothing left to clear
                self._untag(spark, tag, previous)

    def _stop(self, running: RunningJob) -> None:
        """Cancel the job's Spark work, then stop its session, from a helper thread.

        The Task SDK calls ``on_kill`` from its SIGTERM handler, in the thread that is waiting inside
        a Spark call; that thread's py4j connection is busy until the job ends, and a helper thread
        has its own.
        """
        stopper = threading.Thread(target=self._stop_session, args=(running,), name="delta-occ-on-kill",
                                   daemon=True)
        stopper.start()
        stopper.join(KILL_TIMEOUT_SECONDS)
        if stopper.is_alive():
            self.log.warning("Spark did not confirm the %s job %s stopped within %s s", running.mode, running.tag,
                             KILL_TIMEOUT_SECONDS)

    def _stop_session(self, running: RunningJob) -> None:
        """Cancel the job's Spark work and stop its session; every step is tried, none raises."""
        try:
            self._cancel(running)
        except Exception as exc:  # the stop below still ends the work
            self.log.warning("Could not cancel the Spark work of job %s: %s", running.tag, exc)
        try:
            running.session.stop()
            self.log.info("Stopped the Spark session of job %s", running.tag)
        except Exception as exc:
            self.log.warning("Could not stop the Spark session of job %s: %s", running.tag, exc)
