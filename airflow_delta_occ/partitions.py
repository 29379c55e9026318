"""Partition predicate injection: ``partitions={"date": "2024-01-01", "country": ["DE", "FR"]}`` to SQL.

Delta's conflict check only looks at the partition part of what a transaction read, so a MERGE
whose ON clause does not name its partitions reads (for the check) the whole table. Writing the
partitions out as literals, typed by the table's own schema, makes concurrent jobs on different
partitions disjoint. Values never reach SQL as text from the DAG: each is parsed as the column's
type first and rendered back by the engine's literal renderer, so a quote or a comment in a value
is data, not syntax.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_delta_occ.engine.errors import InvalidLiteralError, PredicateError
from airflow_delta_occ.engine.schema import StructType
from airflow_delta_occ.engine.sql_parser import parse_predicate, render_identifier, render_literal
from airflow_delta_occ.engine.values import coerce_literal

from .exceptions import PartitionSpecError, UnsafeExpressionError


@dataclass(frozen=True)
class PartitionFilter:
    """Typed partition values by logical column name; ``None`` in a tuple means NULL."""

    values: tuple[tuple[str, tuple[Any, ...]], ...]

    def __bool__(self) -> bool:
        return bool(self.values)

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.values)

    def to_sql(self, alias: str | None = None) -> str:
        """``t.`date` = DATE'2024-01-01' AND t.`country` IN ('DE', 'FR')`` (empty when unconstrained)."""
        parts = []
        for name, options in self.values:
            column = (f"{render_identifier(alias)}." if alias else "") + render_identifier(name)
            non_null = [o for o in options if o is not None]
            terms = []
            if len(non_null) == 1:
                terms.append(f"{column} = {render_literal(non_null[0])}")
            elif non_null:
                terms.append(f"{column} IN ({', '.join(render_literal(o) for o in non_null)})")
            if len(non_null) != len(options):
                terms.append(f"{column} IS NULL")
            parts.append(terms[0] if len(terms) == 1 else "(" + " OR ".join(terms) + ")")
        return " AND ".join(parts)


def build_partition_filter(schema: StructType, partition_columns: Sequence[str],
                           partitions: Mapping[str, Any] | None) -> PartitionFilter:
    """Validate ``partitions`` against the table and type every value.

    Raises:
        PartitionSpecError: a column that is not a partition column, an empty list of values, or a
            value that is not a valid value of the column's type.
    """
    if not partitions:
        return PartitionFilter(())
    by_lower = {c.lower(): c for c in partition_columns}
    out = []
    for key, raw in partitions.items():
        name = by_lower.get(str(key).lower())
        if name is None:
            kind = "a column of the table but not a partition column" if schema.find(str(key)) else "not a column"
            available = ", ".join(partition_columns) or "none"
            raise PartitionSpecError(f"partitions names {key!r}, which is {kind}; partition columns: {available}")
        field = schema.find(name)
        assert field is not None
        options = list(raw) if isinstance(raw, list | tuple | set | frozenset) else [raw]
        if not options:
            raise PartitionSpecError(f"partitions[{key!r}] is an empty list: the job would touch nothing")
        typed = []
        for value in options:
            try:
                typed.append(coerce_literal(value, field.type, name))
            except InvalidLiteralError as exc:
                raise PartitionSpecError(f"partitions[{key!r}]: {exc}") from exc
        out.append((name, tuple(dict.fromkeys(typed))))
    return PartitionFilter(tuple(out))


def checked_sql(text: str, what: str) -> str:
    """Accept a condition or expression only if it parses as one SQL expression without comments or ``;``.

    Raises:
        UnsafeExpressionError: naming ``what`` (``merge condition``, ``set[v]``...) and the position.
    """
    if not isinstance(text, str) or not text.strip():
        raise UnsafeExpressionError(f"{what} must be a non-empty SQL expression, got {text!r}")
    try:
        parse_predicate(text)
    except PredicateError as exc:
        raise UnsafeExpressionError(f"{what} is not accepted: {exc}") from exc
    return text.strip()


def conjoin(*conditions: str | None) -> str | None:
    """AND the non-empty conditions, each in parentheses."""
    present = [c for c in conditions if c]
    if not present:
        return None
    return present[0] if len(present) == 1 else " AND ".join(f"({c})" for c in present)
