"""The SQL text a job runs, rendered from the spec's trees (pure: no Spark).

The one place a job's statement text is made: names are quoted here, once, and every expression is
rendered from its parse tree (``to_sql``), so the partition predicate is a top-level conjunct of
every condition. Keeping the builders apart from the runner lets them be tested, and read, without
Spark.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_delta_occ.engine.expressions import Expr
from airflow_delta_occ.engine.sql_parser import render_identifier, to_sql

from .spec import JobSpec


def table_name_sql(name: str) -> str:
    """A (multi-part) catalog table name, each part backtick-quoted (``db.t`` as two quoted parts)."""
    return ".".join(render_identifier(part) for part in name.split("."))


def target_sql(spec: JobSpec) -> str:
    """The target as Spark SQL: ``delta.`path``` or a backtick-quoted (multi-part) table name."""
    if spec.target.path is not None:
        return f"delta.{render_identifier(spec.target.path)}"
    return table_name_sql(str(spec.target.name))


def _assignments(values: Mapping[str, Expr]) -> str:
    return ", ".join(f"{render_identifier(k)} = {to_sql(v)}" for k, v in values.items())


def source_check_sql(spec: JobSpec) -> str | None:
    """The condition a source row (under the source's alias) meets when it writes inside the partitions."""
    return to_sql(spec.source_check) if spec.source_check is not None else None


def source_values_sql(spec: JobSpec) -> dict[str, str]:
    """The partition values a source row writes, by partition column (shown for rows outside)."""
    return {name: to_sql(tree) for name, tree in spec.source_values.items()}


def merge_sql(spec: JobSpec, source: str) -> str:
    """``MERGE INTO`` for the spec, reading ``source`` (SQL text already rendered: a quoted view name,
    or a quoted path); expressions were checked by the operator, names are quoted here."""
    parts = [f"MERGE INTO {target_sql(spec)} AS {render_identifier(spec.target_alias)} "
             f"USING {source} AS {render_identifier(spec.source_alias)} "
             f"ON {spec.condition_sql}"]
    for clause in spec.clauses:
        when = clause.kind.scope.when
        if clause.condition is not None:
            when += f" AND ({to_sql(clause.condition)})"
        action = clause.kind.action
        if action == "update":
            parts.append(f"{when} THEN UPDATE SET {_assignments(clause.set)}")
        elif action == "update_all":
            parts.append(f"{when} THEN UPDATE SET *")
        elif action == "delete":
            parts.append(f"{when} THEN DELETE")
        elif action == "insert":
            columns = ", ".join(render_identifier(k) for k in clause.set)
            values = ", ".join(to_sql(v) for v in clause.set.values())
            parts.append(f"{when} THEN INSERT ({columns}) VALUES ({values})")
        else:
            parts.append(f"{when} THEN INSERT *")
    return "\n".join(parts)


def statement_sql(spec: JobSpec, source_view: str | None, *, source: str | None = None) -> str | None:
    """The SQL statement a DML or OPTIMIZE job runs (``None`` for DataFrame writes).

    A MERGE reads the view ``source_view`` (a name, quoted here), or ``source``: SQL text naming the
    source, already rendered (what lineage reports instead of the job's private view).
    """
    op, target = spec.operation, target_sql(spec)
    if op == "merge":
        return merge_sql(spec, source if source is not None else render_identifier(str(source_view)))
    if op == "update":
        where = f" WHERE {spec.condition_sql}" if spec.condition is not None else ""
        return f"UPDATE {target} SET {_assignments(spec.set)}{where}"
    if op == "delete":
        return f"DELETE FROM {target}" + (f" WHERE {spec.condition_sql}" if spec.condition is not None else "")
    if op == "optimize":
        where = f" WHERE {spec.partition_filter_sql}" if spec.partition_filter is not None else ""
        sql = f"OPTIMIZE {target}{where}"
        if spec.zorder_by:
            sql += " ZORDER BY (" + ", ".join(render_identifier(c) for c in spec.zorder_by) + ")"
        return sql
    return None


def matching_row_sql(spec: JobSpec, version: int) -> str:
    """A query that returns one row when a row of the target at ``version`` meets the UPDATE's or DELETE's
    condition (``jobs.footprint.CommitCertainty.IF_A_ROW_MATCHES``): the statement's own condition text, read
    as the statement reads the target, so both mean the same rows."""
    where = f" WHERE {spec.condition_sql}" if spec.condition is not None else ""
    return f"SELECT 1 FROM {target_sql(spec)} VERSION AS OF {int(version)}{where} LIMIT 1"
