"""The lease store contract on the in-memory store and on SQLite (one process; the multi-process proof is in
``tests/leases``). PostgreSQL runs the same suite in ``tests/postgres/test_store_contract.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_delta_occ.pools.leases.base import LeaseStore
from airflow_delta_occ.pools.leases.memory import MemoryLeaseStore
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore

from .contract import Clock, LeaseStoreContract, request_for, table  # noqa: F401 - fixtures used by the contract

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
