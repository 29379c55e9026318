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
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

from airflow_delta_occ.engine.sql_parser import render_identifier
from airflow_delta_occ.exceptions import (
    ConflictSkipped,
    JobSpecError,
    SourceNotFoundError,
    SourceOutsidePartitionsError,
)
from airflow_delta_occ.jobspec import JobSpec
from airflow_delta_occ.retry import (
    DEFAULT_POLICIES,
    OPTIMIZE_POLICIES,
    ConflictFailure,
    RetryOutcome,
    resolve_policies,
    run_with_policies,
)
from airflow_delta_occ.spark.session import INHERITED_CONNECT_ENV

RESULT_PREFIX = "DELTA_OCC_RESULT "
EXIT_CODES = {"success": 0, "error": 1, "conflict": 75, "skipped": 76, "bad_spec": 64, "rejected": 65}
# Refusals of the job's input: the caller rebuilds the same class by name (never retried).
REJECTIONS = (JobSpecError, SourceNotFoundError)
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
SESSION_TIME_ZONE_CONF = "spark.sql.session.timeZone"
TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
# Each task run writes at most once per app id; version 0 is enough because the id is per run.
TXN_VERSION = 0


def target_sql(spec: JobSpec) -> str:
    """The target as Spark SQL: ``delta.`path``` or a backtick-quoted (multi-part) table name."""
    if spec.target.path is not None:
        return f"delta.{render_identifier(spec.target.path)}"
    return ".".join(render_identifier(part) for part in str(spec.target.name).split("."))


def _check_target(session: Any, spec: JobSpec) -> int:
    """The target's current version; a typed error when it is not a Delta table."""
    try:
        return int(session.sql(f"DESCRIBE HISTORY {target_sql(spec)} LIMIT 1").collect()[0]["version"])
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
        else:  # Spark's parser accepts only a query inside FROM ( ... ), whatever the text says
            df = session.sql(f"SELECT * FROM ({src.query}) AS {render_identifier('delta_occ_query')}")
        with _active(session):
            return df.localCheckpoint(eager=True)
    except Exception as exc:
        label = src.path or src.table or "query"
        raise SourceNotFoundError(f"cannot read source {label!r}: {str(exc).splitlines()[0]}") from exc


SAMPLE_ROWS = 5


def confine_source(session: Any, spec: JobSpec, source: Any, source_view: str) -> tuple[Any, int]:
    """Refuse (or drop) source rows that would be written outside the job's partitions.

    Runs on the materialised source before anything is written, so a refusal leaves the table as
    it was. Returns the source to use and how many rows were dropped.

    Raises:
        SourceOutsidePartitionsError: with the number of such rows and a few of their partition values.
    """
    if not spec.source_check:
        return source, 0
    alias = render_identifier(spec.source_alias)
    columns = {c.lower() for c in source.columns}
    for name, operand in spec.source_values.items():
        # A written value read from the source column of that name must be a top-level column: Spark
        # would otherwise resolve `s`.`date` to a field of a struct column named like the alias.
        if operand == f"{alias}.{render_identifier(name)}" and name.lower() not in columns:
            raise SourceOutsidePartitionsError(
                f"the source has no column {name!r}, so its rows cannot be checked against the partitions "
                f"{spec.partition_filter}; nothing was written")
    inside = f"coalesce(({spec.source_check}), false)"
    outside = session.sql(f"SELECT count(*) AS n FROM {render_identifier(source_view)} AS {alias} "
                          f"WHERE NOT {inside}").collect()[0]["n"]
    if not outside:
        return source, 0
    if spec.source_outside == "drop":
        kept = session.sql(f"SELECT {alias}.* FROM {render_identifier(source_view)} AS {alias} WHERE {inside}")
        kept.createOrReplaceTempView(source_view)
        return kept, int(outside)
    shown = ", ".join(f"{expr} AS {render_identifier(name)}" for name, expr in spec.source_values.items())
    samples = tuple(row.asDict() for row in session.sql(
        f"SELECT DISTINCT {shown} FROM {render_identifier(source_view)} AS {alias} WHERE NOT {inside} "
        f"LIMIT {SAMPLE_ROWS}").collect()) if shown else ()
    raise SourceOutsidePartitionsError(
        f"{outside} source row(s) would be written outside the partitions {spec.partition_filter} of "
        f"{spec.target.label}, for example {', '.join(map(_plain_values, samples)) or 'see the source'}; nothing "
        "was written. Fix the source, or pass source_outside_partitions='drop' to leave such rows out.",
        count=int(outside), samples=samples)


def _plain_values(values: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={v!s}" for k, v in values.items()) + "}"


def _assignments(values: dict[str, str]) -> str:
    return ", ".join(f"{render_identifier(k)} = {v}" for k, v in values.items())


def merge_sql(spec: JobSpec, source_view: str) -> str:
    """``MERGE INTO`` for the spec; expressions were checked by the operator, names are quoted here."""
    parts = [f"MERGE INTO {target_sql(spec)} AS {render_identifier(spec.target_alias)} "
             f"USING {render_identifier(source_view)} AS {render_identifier(spec.source_alias)} ON {spec.condition}"]
    for clause in spec.clauses:
        scope = _clause_scope(clause.kind)
        when = {"matched": "WHEN MATCHED", "not_matched": "WHEN NOT MATCHED",
                "not_matched_by_source": "WHEN NOT MATCHED BY SOURCE"}[scope]
        if clause.condition:
            when += f" AND ({clause.condition})"
        action = clause.kind[len(scope) + 1:]
        if action == "update":
            parts.append(f"{when} THEN UPDATE SET {_assignments(dict(clause.set))}")
        elif action == "update_all":
            parts.append(f"{when} THEN UPDATE SET *")
        elif action == "delete":
            parts.append(f"{when} THEN DELETE")
        elif action == "insert":
            columns = ", ".join(render_identifier(k) for k in clause.set)
            parts.append(f"{when} THEN INSERT ({columns}) VALUES ({', '.join(clause.set.values())})")
        else:
            parts.append(f"{when} THEN INSERT *")
    return "\n".join(parts)


def _clause_scope(kind: str) -> str:
    for scope in ("not_matched_by_source", "not_matched", "matched"):
        if kind.startswith(scope + "_"):
            return scope
    raise JobSpecError(f"unknown merge clause {kind!r}")


def statement_sql(spec: JobSpec, source_view: str | None) -> str | None:
    """The SQL statement a DML or OPTIMIZE job runs (``None`` for DataFrame writes)."""
    op, target = spec.operation, target_sql(spec)
    if op == "merge":
        return merge_sql(spec, str(source_view))
    if op == "update":
        where = f" WHERE {spec.condition}" if spec.condition else ""
        return f"UPDATE {target} SET {_assignments(dict(spec.set))}{where}"
    if op == "delete":
        return f"DELETE FROM {target}" + (f" WHERE {spec.condition}" if spec.condition else "")
    if op == "optimize":
        sql = f"OPTIMIZE {target}" + (f" WHERE {spec.partition_filter}" if spec.partition_filter else "")
        if spec.zorder_by:
            sql += " ZORDER BY (" + ", ".join(render_identifier(c) for c in spec.zorder_by) + ")"
        return sql
    return None


def _execute_once(session: Any, spec: JobSpec, source: Any, source_view: str | None) -> None:
    sql = statement_sql(spec, source_view)
    if sql is not None:
        session.sql(sql).collect()
        return
    writer = source.write.format("delta").option("userMetadata", spec.run.user_metadata())
    if spec.idempotent:
        writer = writer.option("txnAppId", spec.run.app_id).option("txnVersion", TXN_VERSION)
    if spec.operation == "append":
        writer = writer.mode("append")
    else:
        writer = writer.mode("overwrite").option("replaceWhere", spec.partition_filter)
    if spec.target.path is not None:
        writer.save(spec.target.path)
    else:
        writer.saveAsTable(spec.target.name)


def find_commit(session: Any, spec: JobSpec, after_version: int) -> dict[str, Any] | None:
    """The newest commit of this task run (any try) in the table's history, if there is one."""
    for row in session.sql(f"DESCRIBE HISTORY {target_sql(spec)} LIMIT 100").collect():
        if spec.run.tagged(row["userMetadata"]):
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
    session = _private_session(spark)
    # The operator rendered timestamp literals and typed partition values in UTC: the job reads them
    # in UTC in every mode (a Connect server or a cluster may default to another zone).
    session.conf.set(SESSION_TIME_ZONE_CONF, "UTC")
    session.conf.set(USER_METADATA_CONF, spec.run.user_metadata())
    if spec.idempotent and spec.operation in ("merge", "update", "delete"):
        session.conf.set(TXN_APP_ID_CONF, spec.run.app_id)
        session.conf.set(TXN_VERSION_CONF, str(TXN_VERSION))
    started = time.monotonic()
    before = _check_target(session, spec)
    source = read_source(session, spec)
    source_view = None
    dropped = 0
    if source is not None:
        source_view = f"delta_occ_source_{uuid.uuid4().hex}"
        source.createOrReplaceTempView(source_view)
        source, dropped = confine_source(session, spec, source, source_view)
    base = OPTIMIZE_POLICIES if spec.operation == "optimize" else DEFAULT_POLICIES
    policies = resolve_policies(base, spec.retry_policies)
    outcome = RetryOutcome()
    result: dict[str, Any] = {"table": spec.target.label, "operation": spec.operation,
                              "condition": spec.condition, "partition_filter": spec.partition_filter,
                              "dropped_source_rows": dropped}
    try:
        run_with_policies(lambda attempt: _execute_once(session, spec, source, source_view), policies,
                          outcome=outcome, sleep=sleep)
    finally:
        result.update(attempts=outcome.attempts, conflicts=[vars(c) for c in outcome.conflicts],
                      run_seconds=round(time.monotonic() - started, 3),
                      wait_seconds=round(sum(c.delay for c in outcome.conflicts if c.action == "retry"), 3))
    commit = find_commit(session, spec, int(before))
    result["version"] = commit["version"] if commit else None
    result["metrics"] = commit["metrics"] if commit else {}
    result["already_committed"] = bool(commit and not commit["new"])
    if source_view is not None:
        session.catalog.dropTempView(source_view)
    return result


def _private_session(spark: Any) -> Any:
    """A session whose confs (userMetadata, txnAppId) stay private to this job.

    Spark Connect sessions cannot spawn siblings, but each Connect client session is already
    private (the hook creates one per job).
    """
    return spark if _is_connect(spark) else spark.newSession()


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

        _forget_inherited_connect_client()
        spark = SparkSession.builder.getOrCreate()
    status, payload = "success", {}
    try:
        payload = run_job(spark, spec)
    except ConflictSkipped as exc:
        status, payload = "skipped", {"error": str(exc)}
    except ConflictFailure as exc:
        status, payload = "conflict", {"error": str(exc), "conflict": exc.kind.value, "attempts": exc.attempts}
    except REJECTIONS as exc:
        status, payload = "rejected", {"error": str(exc), "error_type": type(exc).__name__}
    except Exception as exc:
        status, payload = "error", {"error": f"{type(exc).__name__}: {exc}"}
    print(RESULT_PREFIX + json.dumps({"status": status, **payload}, default=str), flush=True)
    return EXIT_CODES[status]


if __name__ == "__main__":
    sys.exit(main())
