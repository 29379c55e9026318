"""``DeltaSparkHook``: where a JobSpec runs (embedded local Spark, spark-submit, or Spark Connect).

The connection (type ``delta_occ``, default id ``delta_occ_default``) is optional: without it jobs
run in an embedded local Spark session, the default for a laptop or a single worker. Its extras:

* ``mode``: ``embedded`` (default), ``spark-submit`` or ``connect``;
* ``spark_conn_id``: the Spark connection ``spark-submit`` uses (apache-airflow-providers-apache-spark);
* ``connect_url``: ``sc://host:15002`` for Spark Connect;
* ``master``: the embedded session's master (default ``local[2]``).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_delta_occ.config import MODES, default_mode
from airflow_delta_occ.exceptions import DeltaJobError
from airflow_delta_occ.jobs.result import JobResult
from airflow_delta_occ.jobs.spec import JobSpec
from airflow_delta_occ.retry.classify import ConflictKind, classify_conflict, conflict_failure
from airflow_delta_occ.spark.session import CONNECT_MODE_FLAG


class DeltaSparkHook(BaseHook):
    conn_name_attr = "delta_conn_id"
    default_conn_name = "delta_occ_default"
    conn_type = "delta_occ"
    hook_name = "Delta Lake (airflow-delta-occ)"

    def __init__(self, delta_conn_id: str | None = default_conn_name, *, mode: str | None = None,
                 spark_conf: Mapping[str, str] | None = None) -> None:
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

    # -- sessions ---------------------------------------------------------------------------------
    def get_spark(self) -> Any:
        """A SparkSession for embedded or Connect mode (a new Connect session on every call)."""
        if self.mode == "connect":
            from pyspark.sql import SparkSession

            url = self.extras.get("connect_url") or os.environ.get("SPARK_REMOTE")
            if not url:
                raise DeltaJobError("connect mode needs connect_url in the connection extras (sc://host:15002)")
            return SparkSession.builder.remote(url).create()
        from airflow_delta_occ.spark.session import local_delta_session

        return local_delta_session("airflow-delta-occ", master=self.extras.get("master", "local[2]"),
                                   conf=self.spark_conf)

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
            yield spark
        finally:
            try:
                spark.stop()  # releases the server-side session and the job's cached source
            finally:
                if flag_before is None:
                    os.environ.pop(CONNECT_MODE_FLAG, None)
                else:
                    os.environ[CONNECT_MODE_FLAG] = flag_before

    def table_location(self, name: str) -> str:
        """The storage location of a catalog table (so the engine can read its log)."""
        from airflow_delta_occ.engine.errors import TableNotFoundError
        from airflow_delta_occ.engine.sql_parser import render_identifier

        quoted = ".".join(render_identifier(part) for part in name.split("."))
        with self.job_session() as spark:
            try:
                row = spark.sql(f"DESCRIBE DETAIL {quoted}").collect()[0]
            except Exception as exc:  # AnalysisException (classic or Connect): no such table
                raise TableNotFoundError(name, str(exc).strip().splitlines()[0]) from exc
        if str(row["format"]).lower() != "delta":
            raise TableNotFoundError(name, f"the catalog table is {row['format']}, not Delta")
        return str(row["location"])

    # -- running ----------------------------------------------------------------------------------
    def run(self, spec: JobSpec) -> JobResult:
        """Execute the job and return its result; any other outcome raises its typed exception.

        Every mode returns the runner's ``JobResult`` through its JSON form, and one call
        (``JobResult.raise_for_status``) decodes it: the same failure raises the same class with the
        same message whether the job ran embedded, through ``spark-submit`` or over Spark Connect.
        """
        if self.mode == "spark-submit":
            result = self._submit(spec)
        else:
            from airflow_delta_occ.spark.runner import run_job

            with self.job_session() as spark:
                result = JobResult.from_json(run_job(spark, spec).to_json())
        return result.raise_for_status()

    def _submit(self, spec: JobSpec) -> JobResult:
        from airflow_delta_occ.spark import runner
        from airflow_delta_occ.spark.session import delta_submit_conf

        hook = _submit_hook_class()(
            conn_id=self.extras.get("spark_conn_id", "spark_default"),
            application=runner.__file__,
            application_args=["--spec-json", spec.to_json()],
            conf={**delta_submit_conf(), **self.spark_conf},
            name=f"delta-occ-{spec.run.dag_id}.{spec.run.task_id}",
        )
        try:
            hook.submit(hook.application)
        except Exception as exc:
            reported: JobResult | None = hook.result
            if reported is not None:  # the runner reported its outcome; the exit code only repeats it
                return reported
            if hook.conflict is not None:  # the driver died after Delta raised a conflict
                raise conflict_failure(hook.conflict, 0, exc) from exc
            raise
        final: JobResult | None = hook.result
        if final is None:
            raise DeltaJobError("spark-submit finished without the runner's result line")
        return final


@functools.cache
def _submit_hook_class() -> Any:
    # Built lazily: importing this module must not need the Spark provider.
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from airflow_delta_occ.spark.runner import RESULT_PREFIX

    class ResultCapturingSubmitHook(SparkSubmitHook):
        """Reads the runner's result line and classifies conflicts from *every* driver output line.

        The base hook keeps only the last 20 lines for its error message; a conflict printed earlier
        would be lost there.
        """

        def __init__(self, *, application: str, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.application = application
            self.result: JobResult | None = None
            self.conflict: ConflictKind | None = None

        def _process_spark_submit_log(self, itr: Any) -> None:
            lines = []
            for raw in itr:
                line = raw.strip()
                lines.append(line)
                if line.startswith(RESULT_PREFIX):
                    self.result = JobResult.from_json(line[len(RESULT_PREFIX):])
                elif self.conflict is None:
                    self.conflict = classify_conflict(line)
            super()._process_spark_submit_log(iter(line + "\n" for line in lines))

    return ResultCapturingSubmitHook
