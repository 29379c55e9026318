"""Checks of a Delta job's arguments that need no Spark: their shape, the SQL text in them, and the
columns they name, with the table's snapshot where one is needed.

The operators call the shape checks in their constructors, so a mistake is a DAG import error, and
the snapshot checks when they build the job, before Spark starts. Every failure is a
``JobSpecError`` (never retried).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_delta_occ.engine.errors import PredicateSyntaxError
from airflow_delta_occ.engine.sql_parser import tokenize
from airflow_delta_occ.exceptions import JobSpecError

from .operations import ClauseKind
from .partitions import PartitionFilter, parse_expression
from .queries import check_source_query
from .text import refuse_substitution

if TYPE_CHECKING:  # reading a table loads pyarrow; the checks themselves do not need it
    from airflow_delta_occ.engine.snapshot import Snapshot

CLAUSE_FIELDS = frozenset({"kind", "condition", "set"})


JINJA_MARKERS = ("{{", "{%", "{#")   # an expression, a statement, a comment


def templated(value: Any) -> bool:
    """Whether a value still holds a Jinja template (any of its markers): it is checked once rendered, not at
    parse time."""
    return isinstance(value, str) and any(marker in value for marker in JINJA_MARKERS)


SQL_FILE_SUFFIX = ".sql"


def sql_file(value: Any) -> bool:
    """Whether the value of a SQL text field names a ``.sql`` file (read and rendered at run time).

    Only a value with no whitespace counts: ``t.id = s.sql`` is an expression, ``sql/on.sql`` a file.
    """
    return isinstance(value, str) and value.endswith(SQL_FILE_SUFFIX) and not any(c.isspace() for c in value)


def check_one_source(owner: str, source: Any, source_table: Any, source_query: Any) -> None:
    """Exactly one source, as non-empty text; a query that holds no template must be a query."""
    given = [name for name, value in (("source", source), ("source_table", source_table),
                                      ("source_query", source_query)) if value is not None]
    if len(given) != 1:
        raise JobSpecError(f"{owner} needs exactly one of source=, source_table= or source_query=; "
                           f"got {', '.join(given) or 'none'}")
    for name, value in (("source", source), ("source_table", source_table), ("source_query", source_query)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise JobSpecError(f"{name} must be a non-empty string, got {value!r}")
        if name != "source_query":  # a query is tokenized, which refuses the marker with its position
            refuse_substitution(value, name, rendered=False)
    if source_query is not None and not templated(source_query) and not sql_file(source_query):
        check_source_query(source_query)


def check_clauses(clauses: Any) -> list[dict[str, Any]]:
    """MERGE clauses as a list of ``{"kind", "condition", "set"}`` mappings, checked for shape.

    Raises:
        JobSpecError: not a list of mappings, an unknown kind or field, a missing or forbidden ``set``.
    """
    if isinstance(clauses, str | bytes) or not isinstance(clauses, Sequence):
        raise JobSpecError(f"clauses must be a list of mappings, got {type(clauses).__name__}")
    if not clauses:
        raise JobSpecError("clauses is empty: a MERGE needs at least one WHEN clause")
    out = []
    for i, clause in enumerate(clauses):
        if not isinstance(clause, Mapping):
            raise JobSpecError(f"clauses[{i}] must be a mapping with a kind, got {type(clause).__name__}")
        unknown = set(clause) - CLAUSE_FIELDS
        if unknown:
            raise JobSpecError(f"clauses[{i}] has unknown field(s) {sorted(map(str, unknown))}; "
                               f"expected {sorted(CLAUSE_FIELDS)}")
        try:
            kind = ClauseKind(str(clause.get("kind")))
        except ValueError:
            raise JobSpecError(f"clauses[{i}]: unknown merge clause kind {clause.get('kind')!r}; expected one of "
                               f"{', '.join(ClauseKind)}") from None
        values = clause.get("set")
        if values is not None and not isinstance(values, Mapping):
            raise JobSpecError(f"clauses[{i}].set must be a mapping of column to SQL expression")
        if kind.takes_set and not values:
            raise JobSpecError(f"clauses[{i}]: {kind} needs a non-empty set mapping")
        if not kind.takes_set and values:
            raise JobSpecError(f"clauses[{i}]: {kind} takes no set mapping")
        condition = clause.get("condition")
        if condition is not None:
            check_sql_text(condition, f"clauses[{i}].condition")
        for key, value in (values or {}).items():
            refuse_substitution(key, f"clauses[{i}].set key", rendered=False)
            check_sql_text(value, f"clauses[{i}].set[{key}]")
        out.append(dict(clause))
    return out


def check_sql_text(value: Any, what: str) -> None:
    """An expression from the DAG is SQL text; when it holds no template it must parse now.

    A number or ``None`` is refused rather than turned into text (``None`` would become a column).
    """
    if not isinstance(value, str):
        raise JobSpecError(f"{what} must be SQL text, got {type(value).__name__} {value!r}; write a number or a "
                           "string literal as SQL (\"1.5\", \"'closed'\")")
    if not templated(value):
        parse_expression(value, what)


def column_name(snapshot: Snapshot, key: Any, what: str) -> str:
    """The table's own spelling of a column named by the DAG (Spark resolves names case-insensitively)."""
    field = snapshot.schema.find(key) if isinstance(key, str) else None
    if field is None:
        raise JobSpecError(f"{what} names {key!r}, which is not a column of the table; columns: "
                           f"{', '.join(snapshot.schema.field_names)}")
    return field.name


def is_partition_column(snapshot: Snapshot, name: str) -> bool:
    return name.lower() in {c.lower() for c in snapshot.partition_columns}


def refuse_moving_rows(snapshot: Snapshot, name: str, what: str) -> None:
    """Refuse setting a column that decides a row's partition: the partition column itself, or a
    column a generated partition column is computed from (Delta recomputes it on UPDATE and MERGE)."""
    if is_partition_column(snapshot, name):
        raise JobSpecError(f"{what} sets partition column {name!r}: it would move rows out of the partitions the "
                           "job is confined to")
    for column in snapshot.partition_columns:
        field = snapshot.schema.find(column)
        expression = field.metadata.get(GENERATION_EXPRESSION) if field is not None else None
        if isinstance(expression, str) and name.lower() in names_in(expression):
            raise JobSpecError(f"{what} sets {name!r}, from which partition column {column!r} is generated "
                               f"({expression}): it would move rows out of the partitions the job is confined to")


GENERATION_EXPRESSION = "delta.generationExpression"


def names_in(expression: str) -> set[str]:
    """Every name in a generation expression, lower-cased (a superset of the columns it reads)."""
    try:
        return {str(t.value).lower() for t in tokenize(expression) if t.kind in ("ident", "qident")}
    except PredicateSyntaxError:  # cannot read it: every column may feed it
        return {"*"} | {w.lower() for w in expression.replace("`", " ").split()}


def typed_operands(operands: Mapping[str, str], pfilter: PartitionFilter) -> dict[str, str]:
    """Each written value cast to its partition column's type, as Delta casts it when writing.

    A source ``hour INT`` of 7 equals the string partition ``'07'`` when Spark compares them, but
    is written as ``'7'``: the check must compare what will be written.
    """
    out = {}
    for name, operand in operands.items():
        data_type = pfilter.type_of(name)
        out[name] = f"TRY_CAST({operand} AS {data_type.simple_string()})" if data_type is not None else operand
    return out
