"""The throwaway PostgreSQL server of ``tests/pg.py``: reachable, writable, one isolated database per test."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa

from ..pg import PostgresServer

pytestmark = pytest.mark.postgres


def test_server_round_trip_and_isolated_databases(
    postgres_server: PostgresServer, postgres_url: str, new_postgres_url: Callable[[], str]
) -> None:
    engine = sa.create_engine(postgres_url)
    try:
        with engine.begin() as conn:
            assert conn.execute(sa.text("SELECT version()")).scalar_one().startswith("PostgreSQL ")
            assert conn.execute(sa.text("SELECT inet_server_port()")).scalar_one() == postgres_server.port
            conn.execute(sa.text("CREATE TABLE commits (version bigint PRIMARY KEY, op text NOT NULL)"))
            conn.execute(sa.text("INSERT INTO commits VALUES (:v, :op)"),
                         [{"v": 0, "op": "CREATE TABLE"}, {"v": 1, "op": "WRITE"}])
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT version, op FROM commits ORDER BY version")).all()
        assert [tuple(r) for r in rows] == [(0, "CREATE TABLE"), (1, "WRITE")]
        assert sa.inspect(engine).has_table("commits")
    finally:
        engine.dispose()

    other_url = new_postgres_url()
    assert other_url != postgres_url
    assert other_url.rsplit("/", 1)[0] == postgres_url.rsplit("/", 1)[0]  # same server, another database
    other = sa.create_engine(other_url)
    try:
        assert not sa.inspect(other).has_table("commits")
        with other.connect() as conn:
            assert conn.execute(sa.text("SELECT current_database()")).scalar_one() == other_url.rsplit("/", 1)[1]
    finally:
        other.dispose()
