"""The lease store contract on the in-memory store and on SQLite (one process; the multi-process proof is in
``tests/leases``). PostgreSQL runs the same suite in ``tests/postgres/test_store_contract.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_delta_occ.pools.leases.base import LeaseStore
from airflow_delta_occ.pools.leases.memory import MemoryLeaseStore
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore

from .contract import Clock, LeaseStoreContract, Request, request_for, table  # noqa: F401 - fixtures used by the contract

pytestmark = pytest.mark.unit


class TestMemoryStore(LeaseStoreContract):
    @pytest.fixture
    def store(self) -> Iterator[LeaseStore]:
        with MemoryLeaseStore() as store:
            yield store

    @pytest.fixture
    def clocked_store(self, clock: Clock) -> Iterator[LeaseStore]:
        with MemoryLeaseStore(clock=clock) as store:
            yield store


class TestSqliteStore(LeaseStoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[LeaseStore]:
        with SqlLeaseStore(f"sqlite:///{tmp_path / 'leases.db'}") as store:
            yield store

    @pytest.fixture
    def clocked_store(self, tmp_path: Path, clock: Clock) -> Iterator[LeaseStore]:
        with SqlLeaseStore(f"sqlite:///{tmp_path / 'clocked.db'}", clock=clock) as store:
            yield store


@pytest.mark.parametrize("stored", [
    "not json", "[]", '{"key": 5}', '{"key": ["x", 0], "request_id": "y", "reason": "r", "waiter": ["w", 0]}',
    '{"key": [["deep"]], "request_id": "x", "reason": "r", "waiter": [1, 2]}', "[" * 100_000,
])
def test_a_tampered_remembered_blocker_neither_grants_nor_wedges_a_waiter(
        tmp_path: Path, request_for: Request, stored: str) -> None:  # noqa: F811 - the fixture
    """The ``blocker`` column is read back from the database: whatever it holds, a waiter still waits for the
    lease it conflicts with, and is granted once that lease is released."""
    import sqlalchemy as sa

    from airflow_delta_occ.pools.leases.sql import leases_table

    url = f"sqlite:///{tmp_path / 'leases.db'}"
    with SqlLeaseStore(url) as store:
        holder = store.acquire(request_for("holder", "UPDATE", "country = 'DE'"))
        waiter = store.acquire(request_for("waiter", "DELETE", "country = 'DE' AND id = 3"))
        with store.engine.begin() as conn:
            conn.execute(sa.update(leases_table).where(leases_table.c.request_id == waiter.request_id)
                         .values(blocker=stored))
    with SqlLeaseStore(url) as fresh:
        state = fresh.poll(waiter.request_id, "waiter")
        assert not state.granted and [b.owner for b in state.blockers] == ["holder"]
        assert fresh.release(holder.request_id, "holder")
        assert fresh.poll(waiter.request_id, "waiter").granted
