"""The SQL statements a job runs, built from the spec (pure: no Spark).

Names are quoted here, once; expressions in the spec were parsed and rendered from their parse
trees by the operator, so the partition predicate is a top-level conjunct of every condition.
Keeping the builders apart from the runner lets them be tested, and read, without Spark.
"""

from __future__ import annotations

from airflow_delta_occ.engine.sql_parser import render_identifier

from .spec import JobSpec


def target_sql(spec: JobSpec) -> str:
    """The target as Spark SQL: ``delta.`path``` or a backtick-quoted (multi-part) table name."""
    if spec.target.path is not None:
        return f"delta.{render_identifier(spec.target.path)}"
    return ".".join(render_identifier(part) for part in str(spec.target.name).split("."))


def _assignments(values: dict[str, str]) -> str:
    return ", ".join(f"{render_identifier(k)} = {v}" for k, v in values.items())


def merge_sql(spec: JobSpec, source: str) -> str:
    """``MERGE INTO`` for the spec, reading ``source`` (SQL text already rendered: a quoted view name,
    or a quoted path); expressions were checked by the operator, names are quoted here."""
    parts = [f"MERGE INTO {target_sql(spec)} AS {render_identifier(spec.target_alias)} "
             f"USING {source} AS {render_identifier(spec.source_alias)} "
             f"ON {spec.condition_sql}"]
    for clause in spec.clauses:
        when = clause.kind.scope.when
        if clause.condition:
            when += f" AND ({clause.condition})"
        action = clause.kind.action
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
        return f"UPDATE {target} SET {_assignments(dict(spec.set))}{where}"
    if op == "delete":
        return f"DELETE FROM {target}" + (f" WHERE {spec.condition_sql}" if spec.condition is not None else "")
    if op == "optimize":
        where = f" WHERE {spec.partition_filter_sql}" if spec.partition_filter is not None else ""
        sql = f"OPTIMIZE {target}{where}"
        if spec.zorder_by:
            sql += " ZORDER BY (" + ", ".join(render_identifier(c) for c in spec.zorder_by) + ")"
        return sql
    return None
