"""The ``postgres`` tier: one real PostgreSQL server per test session, a fresh database per test.

The server is started and stopped by the ``postgres_server`` fixture itself (``tests/pg.py``), on its own
loopback port in a temporary directory; a PostgreSQL service already running on the machine is never used.
Missing PostgreSQL binaries fail the tier loudly: a skipped real-database test proves nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ..pg import PostgresServer

HERE = Path(__file__).resolve().parent
_database_numbers = itertools.count(1)


@pytest.hookimpl(tryfirst=True)  # before tests/conftest.py checks that every test has its tier
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under this folder is in the ``postgres`` tier (``make test-postgres``: ``pytest tests -m
    postgres``)."""
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A started ``PostgresServer``: ``.url`` (database ``delta_occ_test``), ``.port``, ``.create_database()``."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def new_postgres_url(postgres_server: PostgresServer) -> Callable[[], str]:
    """A function that creates another new, empty database on each call and returns its SQLAlchemy URL."""
    return lambda: postgres_server.create_database(f"t{next(_database_numbers):04d}")


@pytest.fixture
def postgres_url(new_postgres_url: Callable[[], str]) -> str:
    """SQLAlchemy URL of a new, empty database that no other test uses."""
    return new_postgres_url()
