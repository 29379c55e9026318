"""The PostgreSQL write function's names and statements as text: no schema name can end the identifier."""

from __future__ import annotations

import pytest

from airflow_delta_occ.pools.leases import pg_statements


@pytest.mark.parametrize("schema", ['public', 'we"ird', 'a"; DROP TABLE delta_occ_leases; --', "x'y", "$delta_occ$"])
def test_a_schema_name_stays_one_quoted_identifier(schema: str) -> None:
    quoted = pg_statements.qualified_write_function(schema)
    head, name = quoted.rsplit(".", 1)
    assert name == f'"{pg_statements.WRITE_FUNCTION}"'
    assert head.startswith('"') and head.endswith('"')
    assert head[1:-1].replace('""', "").count('"') == 0      # every quote inside is doubled
    assert head[1:-1].replace('""', '"') == schema
    assert pg_statements.call_write(schema).startswith(f"SELECT applied, db_now FROM {quoted}(")
    assert pg_statements.create_write_function(schema).startswith(f"CREATE FUNCTION {quoted}(")


def test_the_body_is_the_statement_with_positional_parameters_only() -> None:
    """Every ``%(name)s`` became ``$n`` (no client-side interpolation reaches the function's body), and the
    body cannot end its own dollar quote."""
    body = pg_statements.WRITE_FUNCTION_BODY
    assert "%(" not in body and "$delta_occ$" not in body
    assert f"${len(pg_statements.WRITE_PARAMETERS)}" in body
    assert pg_statements.WRITE_FUNCTION_DEFINITION.endswith(f"$delta_occ${body}$delta_occ$")
