"""Partition predicate injection: ``partitions={"date": "2024-01-01", "country": ["DE", "FR"]}`` to SQL.

Delta's conflict check only looks at the partition part of what a transaction read, so a MERGE
whose ON clause does not name its partitions reads (for the check) the whole table. Writing the
partitions out as literals, typed by the table's own schema, makes concurrent jobs on different
partitions disjoint. Values never reach SQL as text from the DAG: each is parsed as the column's
type first and rendered back by the engine's literal renderer, so a quote or a comment in a value
is data, not syntax.

Conditions from the DAG (``where=``, ``merge_condition=``, clause conditions, ``set`` values) never
reach SQL as text either: ``parse_expression`` parses them completely and the statement is rendered
from the tree, so the injected partition predicate is always a top-level conjunct.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_delta_occ.engine.errors import InvalidLiteralError, PredicateError
from airflow_delta_occ.engine.expressions import Expr, and_
from airflow_delta_occ.engine.schema import DataType, StructType
from airflow_delta_occ.engine.sql_parser import (
    MAX_RENDERED_LENGTH,
    parse_predicate,
    render_identifier,
    render_literal,
    to_sql,
)
from airflow_delta_occ.engine.values import coerce_literal, format_partition_value
from airflow_delta_occ.exceptions import JobSpecError, PartitionSpecError, UnsafeExpressionError

from .text import refuse_substitution


class _NullPartition:
    """The explicit request for the NULL partition of a column (see ``NULL_PARTITION``)."""

    _instance: _NullPartition | None = None

    def __new__(cls) -> _NullPartition:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NULL_PARTITION"

    def __reduce__(self) -> str:
        return "NULL_PARTITION"


NULL_PARTITION = _NullPartition()
"""``partitions={"country": NULL_PARTITION}`` targets the rows whose ``country`` is NULL.

A plain ``None`` is refused: it is what a template renders when a value is missing
(``{{ dag_run.conf.get('country') }}`` with native rendering), and it would silently target the
NULL partition instead of the one the author meant.
"""

# What a template renders when its value is missing; never taken as a partition value.
_EMPTY_RENDERINGS = frozenset({"", "none", "null"})
MAX_PARTITION_VALUES = 10_000


@dataclass(frozen=True)
class PartitionFilter:
    """Typed partition values by logical column name; ``None`` in a tuple means NULL."""

    values: tuple[tuple[str, tuple[Any, ...]], ...]
    types: tuple[tuple[str, DataType], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.values)

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.values)

    def type_of(self, name: str) -> DataType | None:
        return dict(self.types).get(name)

    def to_sql(self, alias: str | None = None) -> str:
        """``t.`date` = DATE'2024-01-01' AND t.`country` IN ('DE', 'FR')`` (empty when unconstrained)."""
        prefix = f"{render_identifier(alias)}." if alias else ""
        return self.over({name: prefix + render_identifier(name) for name, _ in self.values})

    def to_expr(self, alias: str | None = None) -> Expr | None:
        """The filter as a parse tree (``None`` when unconstrained); it renders back to ``to_sql``."""
        text = self.to_sql(alias)
        return canonical_tree(parse_predicate(text, max_length=MAX_RENDERED_LENGTH), "partitions") if text else None

    def serialized(self) -> dict[str, tuple[str | None, ...]]:
        """The values as Delta serializes partition values (``None``: NULL), for ``JobSpec.partitions``."""
        types = dict(self.types)
        return {name: tuple(None if v is None else format_partition_value(v, types[name], name) for v in options)
                for name, options in self.values}

    def over(self, operands: Mapping[str, str], null_operands: Mapping[str, str] | None = None) -> str:
        """The filter with each column replaced by an SQL operand (a source column, an insert value).

        ``null_operands`` are tested by ``IS NULL`` instead (the value before a ``TRY_CAST``, so a
        value that does not convert is not taken for a NULL partition value).
        """
        parts = []
        types = dict(self.types)
        for name, options in self.values:
            column = operands[name]
            null_column = (null_operands or operands)[name]
            data_type = types.get(name)
            non_null = [o for o in options if o is not None]
            terms = []
            if len(non_null) == 1:
                terms.append(f"{column} = {render_literal(non_null[0], data_type)}")
            elif non_null:
                terms.append(f"{column} IN ({', '.join(render_literal(o, data_type) for o in non_null)})")
            if len(non_null) != len(options):
                terms.append(f"{null_column} IS NULL")
            parts.append(terms[0] if len(terms) == 1 else "(" + " OR ".join(terms) + ")")
        return " AND ".join(parts)


def partitions_mapping(partitions: Any, *, rendered: bool = True) -> Mapping[str, Any] | None:
    """``partitions=`` as a mapping, checked for shape and for values that rendered to nothing.

    Before rendering (``rendered=False``, at DAG parse time) a Jinja string is accepted as is and
    string values holding a template are not judged yet.

    Raises:
        PartitionSpecError: not a mapping (nor a JSON object string), a key that is not a name, a
            value that is empty, missing (``None``, ``''``, ``'None'``) or not a scalar or list.
    """
    if partitions is None:
        return None
    if isinstance(partitions, str):
        if not rendered and "{{" in partitions:
            return None
        try:
            partitions = json.loads(partitions)
        except (ValueError, RecursionError) as exc:
            raise PartitionSpecError(f"partitions must be a mapping or a JSON object; got the text "
                                     f"{_short(partitions)}") from exc
    if not isinstance(partitions, Mapping):
        raise PartitionSpecError(f"partitions must be a mapping of partition column to value(s), got "
                                 f"{type(partitions).__name__} {_short(partitions)}")
    if not partitions:
        raise PartitionSpecError("partitions is empty: it would confine the job to nothing, so it would touch every "
                                 "partition (leave partitions= out to mean the whole table)")
    for key, raw in partitions.items():
        if not isinstance(key, str) or not key.strip():
            raise PartitionSpecError(f"partitions keys must be column names, got {key!r}")
        refuse_substitution(key, "a partitions key", rendered=rendered)
        options = list(raw) if isinstance(raw, list | tuple | set | frozenset) else [raw]
        if not options:
            raise PartitionSpecError(f"partitions[{key!r}] is an empty list: the job would touch nothing")
        if len(options) > MAX_PARTITION_VALUES:
            raise PartitionSpecError(f"partitions[{key!r}] lists {len(options)} values; at most "
                                     f"{MAX_PARTITION_VALUES} are accepted")
        for value in options:
            _check_value(key, value, rendered)
    return partitions


def _check_value(key: str, value: Any, rendered: bool) -> None:
    if value is NULL_PARTITION:
        return
    if value is None:
        raise PartitionSpecError(
            f"partitions[{key!r}] is None: a template whose value is missing renders to None, which would target "
            "the NULL partition. Pass airflow_delta_occ.jobs.partitions.NULL_PARTITION to mean the NULL partition.")
    if isinstance(value, Mapping | list | tuple | set | frozenset):
        raise PartitionSpecError(f"partitions[{key!r}] holds a {type(value).__name__}; give a value or a flat list")
    if isinstance(value, bytes | bytearray) and not value:
        raise PartitionSpecError(f"partitions[{key!r}] is empty bytes, which Delta stores as NULL; pass NULL_PARTITION "
                                 "to mean the NULL partition")
    if isinstance(value, str):
        refuse_substitution(value, f"partitions[{key!r}]", rendered=rendered)
        if not rendered and "{{" in value:
            return
        if value.strip().lower() in _EMPTY_RENDERINGS:
            raise PartitionSpecError(
                f"partitions[{key!r}] rendered to {value!r}, which is what a missing template value gives "
                "(Delta stores an empty partition value as NULL); refusing to guess the partition. Pass "
                "airflow_delta_occ.jobs.partitions.NULL_PARTITION to mean the NULL partition.")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def build_partition_filter(schema: StructType, partition_columns: Sequence[str],
                           partitions: Any) -> PartitionFilter:
    """Validate ``partitions`` against the table and type every value.

    Raises:
        PartitionSpecError: a column that is not a partition column, an empty list of values, a
            value that rendered to nothing, or a value that is not a valid value of the column's type.
    """
    mapping = partitions_mapping(partitions)
    if mapping is None:
        return PartitionFilter(())
    by_lower = {c.lower(): c for c in partition_columns}
    out: dict[str, tuple[Any, ...]] = {}
    types: dict[str, DataType] = {}
    for key, raw in mapping.items():
        name = by_lower.get(str(key).lower())
        if name is None and not partition_columns:
            raise PartitionSpecError(f"partitions names {key!r}, but this table is not partitioned: confine the job "
                                     "with where= (merge_condition= for a MERGE) instead")
        if name is None:
            kind = "a column of the table but not a partition column" if schema.find(str(key)) else "not a column"
            available = ", ".join(partition_columns) or "none"
            raise PartitionSpecError(f"partitions names {key!r}, which is {kind}; partition columns: {available}")
        if name in out:
            raise PartitionSpecError(f"partitions names {name!r} twice (keys are case-insensitive)")
        field = schema.find(name)
        assert field is not None
        options = list(raw) if isinstance(raw, list | tuple | set | frozenset) else [raw]
        typed: list[Any] = []
        for value in options:
            if value is NULL_PARTITION:
                typed.append(None)
                continue
            try:
                typed.append(coerce_literal(value, field.type, name))
            except InvalidLiteralError as exc:
                raise PartitionSpecError(f"partitions[{key!r}]: {exc}") from exc
        out[name] = tuple(dict.fromkeys(typed))
        types[name] = field.type
    return PartitionFilter(tuple(out.items()), tuple(types.items()))


def canonical_tree(tree: Expr, what: str) -> Expr:
    """The tree the parser gives for the SQL rendered from ``tree``, which must render back unchanged.

    The runner executes the rendering; the footprint is planned from the returned tree, so both
    describe one statement. Opaque parts (function calls the engine does not model) that would change
    the statement's shape when rendered, or text that does not parse, are refused.

    Raises:
        JobSpecError: naming ``what``.
    """
    try:
        text = to_sql(tree)
        reparsed = parse_predicate(text, max_length=MAX_RENDERED_LENGTH)
        same = to_sql(reparsed) == text
    except (PredicateError, RecursionError, ValueError) as exc:
        raise JobSpecError(f"{what} does not render to SQL that parses back: {exc}") from exc
    if not same:
        raise JobSpecError(f"{what} does not render to SQL that parses back to the same statement")
    return reparsed


def parse_expression(text: Any, what: str) -> Expr:
    """Parse a condition or expression from the DAG completely; the statement is rendered from the tree.

    Text enters the provider here: the tree returned is the canonical one (``canonical_tree``), the
    tree of exactly the SQL that will run, so the footprint planned from it and the statement agree.

    Raises:
        UnsafeExpressionError: naming ``what`` (``merge condition``, ``set[v]``...) and the position.
    """
    if not isinstance(text, str) or not text.strip():
        raise UnsafeExpressionError(f"{what} must be a non-empty SQL expression, got {_short(text)}")
    try:
        tree = parse_predicate(text)
    except PredicateError as exc:
        raise UnsafeExpressionError(f"{what} is not accepted: {exc}") from exc
    refuse_substitution(to_sql(tree), what)  # '\u0024{' or '$' '{' spell the marker in the rendered text
    return canonical_tree(tree, what)


def conjoin_exprs(*conditions: Expr | None) -> Expr | None:
    """AND the given parse trees (``None`` when there are none): each stays a top-level conjunct."""
    present = [c for c in conditions if c is not None]
    return and_(*present) if present else None


def conjoin(*conditions: str | None) -> str | None:
    """AND the non-empty conditions, each in parentheses (each is provider-rendered SQL)."""
    present = [c for c in conditions if c]
    if not present:
        return None
    return present[0] if len(present) == 1 else " AND ".join(f"({c})" for c in present)
