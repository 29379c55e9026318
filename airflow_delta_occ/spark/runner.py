"""Execute a ``JobSpec`` with delta-spark: one program for every mode (embedded, spark-submit, Connect).

The runner reads the source once (``localCheckpoint``) and retries conflicts inside the same Spark
application according to the job's typed policies: each retry re-reads the target's newest snapshot
(Delta does that when the operation restarts) but never the source. Every commit is tagged with the
Airflow run in ``commitInfo.userMetadata``, and DML, appends and overwrites carry Delta's
``txnAppId``/``txnVersion`` derived from the run, so re-running the same task run after an
ambiguous failure commits nothing twice.

As a program (``spark-submit .../runner.py --spec-file job.json``) it prints one line
``DELTA_OCC_RESULT {json}`` and exits with a code that names the outcome (see ``EXIT_CODES``), so
the caller does not depend on the last lines of the driver log.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from airflow_delta_occ.exceptions import ConflictSkipped, JobSpecError, SourceNotFoundError
from airflow_delta_occ.jobspec import JobSpec
from airflow_delta_occ.retry import (
    DEFAULT_POLICIES,
    OPTIMIZE_POLICIES,
    ConflictFailure,
    RetryOutcome,
    resolve_policies,
    run_with_policies,
)

RESULT_PREFIX = "DELTA_OCC_RESULT "
EXIT_CODES = {"success": 0, "error": 1, "conflict": 75, "skipped": 76, "bad_spec": 64}
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
# Each task run writes at most once per app id; version 0 is enough because the id is per run.
TXN_VERSION = 0


def _delta_table(session: Any, spec: JobSpec) -> Any:
    from delta.tables import DeltaTable

    try:
        if spec.target.path is not None:
            return DeltaTable.forPath(session, spec.target.path)
        return DeltaTable.forName(session, str(spec.target.name))
    except Exception as exc:  # AnalysisException in classic and Connect alike
        from airflow_delta_occ.engine.errors import TableNotFoundError

        raise TableNotFoundError(spec.target.label, str(exc).splitlines()[0]) from exc


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
        else:
            df = session.sql(src.query)
        return df.localCheckpoint(eager=True)
    except Exception as exc:
        label = src.path or src.table or "query"
        raise SourceNotFoundError(f"cannot read source {label!r}: {str(exc).splitlines()[0]}") from exc


def _execute_once(session: Any, spec: JobSpec, source: Any) -> None:
    table = _delta_table(session, spec)
    op = spec.operation
    if op == "merge":
        builder = table.alias(spec.target_alias).merge(source.alias(spec.source_alias), spec.condition)
        for clause in spec.clauses:
            cond, values = clause.condition, dict(clause.set)
            if clause.kind == "matched_update":
                builder = builder.whenMatchedUpdate(condition=cond, set=values)
            elif clause.kind == "matched_update_all":
                builder = builder.whenMatchedUpdateAll(condition=cond)
            elif clause.kind == "matched_delete":
                builder = builder.whenMatchedDelete(condition=cond)
            elif clause.kind == "not_matched_insert":
                builder = builder.whenNotMatchedInsert(condition=cond, values=values)
            elif clause.kind == "not_matched_insert_all":
                builder = builder.whenNotMatchedInsertAll(condition=cond)
            elif clause.kind == "not_matched_by_source_update":
                builder = builder.whenNotMatchedBySourceUpdate(condition=cond, set=values)
            else:
                builder = builder.whenNotMatchedBySourceDelete(condition=cond)
        builder.execute()
    elif op == "update":
        table.update(condition=spec.condition, set=dict(spec.set))
    elif op == "delete":
        table.delete(spec.condition)
    elif op == "optimize":
        optimizer = table.optimize()
        if spec.partition_filter:
            optimizer = optimizer.where(spec.partition_filter)
        if spec.zorder_by:
            optimizer.executeZOrderBy(*spec.zorder_by)
        else:
            optimizer.executeCompaction()
    else:
        writer = source.write.format("delta").option("userMetadata", spec.run.user_metadata())
        if spec.idempotent:
            writer = writer.option("txnAppId", spec.run.app_id).option("txnVersion", TXN_VERSION)
        if op == "append":
            writer = writer.mode("append")
        else:
            writer = writer.mode("overwrite").option("replaceWhere", spec.partition_filter)
        if spec.target.path is not None:
            writer.save(spec.target.path)
        else:
            writer.saveAsTable(spec.target.name)


def _same_run(user_metadata: str | None, spec: JobSpec) -> bool:
    if not user_metadata:
        return False
    try:
        tag = json.loads(user_metadata)["airflow"]
    except (ValueError, KeyError, TypeError):
        return False
    run = spec.run
    return (tag.get("dag_id"), tag.get("task_id"), tag.get("run_id"), tag.get("map_index")) == (
        run.dag_id, run.task_id, run.run_id, run.map_index)


def find_commit(session: Any, spec: JobSpec, after_version: int) -> dict[str, Any] | None:
    """The newest commit of this task run (any try) in the table's history, if there is one."""
    table = _delta_table(session, spec)
    for row in table.history(100).collect():
        if _same_run(row["userMetadata"], spec):
            return {"version": int(row["version"]), "operation": row["operation"],
                    "metrics": dict(row["operationMetrics"] or {}),
                    "user_metadata": row["userMetadata"], "new": int(row["version"]) > after_version}
    return None


def run_job(spark: Any, spec: JobSpec, *, sleep: Any = time.sleep) -> dict[str, Any]:
    """Execute ``spec`` with conflict retries; return the result the operator pushes to XCom.

    Raises:
        ConflictFailure: a conflict that the policy fails on, or whose retries ran out.
        ConflictSkipped: a conflict that the policy skips.
        TableNotFoundError, SourceNotFoundError: before any write.
    """
    session = spark.newSession()  # confs below stay private to this job
    session.conf.set(USER_METADATA_CONF, spec.run.user_metadata())
    if spec.idempotent and spec.operation in ("merge", "update", "delete"):
        session.conf.set(TXN_APP_ID_CONF, spec.run.app_id)
        session.conf.set(TXN_VERSION_CONF, str(TXN_VERSION))
    started = time.monotonic()
    before = _delta_table(session, spec).history(1).collect()[0]["version"]
    source = read_source(session, spec)
    base = OPTIMIZE_POLICIES if spec.operation == "optimize" else DEFAULT_POLICIES
    policies = resolve_policies(base, spec.retry_policies)
    outcome = RetryOutcome()
    result: dict[str, Any] = {"table": spec.target.label, "operation": spec.operation,
                              "condition": spec.condition, "partition_filter": spec.partition_filter}
    try:
        run_with_policies(lambda attempt: _execute_once(session, spec, source), policies, outcome=outcome,
                          sleep=sleep)
    finally:
        result.update(attempts=outcome.attempts, conflicts=[vars(c) for c in outcome.conflicts],
                      run_seconds=round(time.monotonic() - started, 3))
    commit = find_commit(session, spec, int(before))
    result["version"] = commit["version"] if commit else None
    result["metrics"] = commit["metrics"] if commit else {}
    result["already_committed"] = bool(commit and not commit["new"])
    if source is not None:
        source.unpersist()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one airflow-delta-occ JobSpec with delta-spark")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--spec-file")
    group.add_argument("--spec-json")
    parser.add_argument("--local", action="store_true", help="start a local Delta session (tests, laptops)")
    args = parser.parse_args(argv)
    try:
        text = args.spec_json if args.spec_json else open(args.spec_file, encoding="utf-8").read()
        spec = JobSpec.from_json(text)
    except (OSError, JobSpecError, ValueError) as exc:
        print(RESULT_PREFIX + json.dumps({"status": "bad_spec", "error": str(exc)}), flush=True)
        return EXIT_CODES["bad_spec"]
    if args.local:
        from airflow_delta_occ.spark.session import local_delta_session

        spark = local_delta_session("airflow-delta-occ-runner")
    else:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.getOrCreate()
    status, payload = "success", {}
    try:
        payload = run_job(spark, spec)
    except ConflictSkipped as exc:
        status, payload = "skipped", {"error": str(exc)}
    except ConflictFailure as exc:
        status, payload = "conflict", {"error": str(exc), "conflict": exc.kind.value, "attempts": exc.attempts}
    except Exception as exc:
        status, payload = "error", {"error": f"{type(exc).__name__}: {exc}"}
    print(RESULT_PREFIX + json.dumps({"status": status, **payload}, default=str), flush=True)
    return EXIT_CODES[status]


if __name__ == "__main__":
    sys.exit(main())
