"""Fixtures of the multi-process lease store tier: a real PostgreSQL, a SQLite file, and three small Delta tables.

The PostgreSQL fixtures are the ``postgres`` tier's own (``tests/postgres/conftest.py``), imported so this folder
runs alone; pytest then keys the session server to this folder, so running both folders in one session starts
two servers (a second or two), never shares a database between tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..postgres.conftest import new_postgres_url, postgres_server, postgres_url  # noqa: F401 - re-exported fixtures
from .workload import build_tables


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """SQLAlchemy URL of a new SQLite file that every process of the test opens (one host, WAL journal)."""
    return f"sqlite:///{tmp_path / 'leases.db'}"


@pytest.fixture
def lease_tables(tmp_path: Path) -> dict[str, str]:
    """The workload's three hand-written Delta tables: table key -> path (workers re-read them by path)."""
    return build_tables(tmp_path / "tables")
