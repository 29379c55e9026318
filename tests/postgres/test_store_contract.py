"""The lease store contract on a real PostgreSQL (started by the fixture on 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_delta_occ.pools.leases.base import LeaseStore
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore

from ..unit.pools.contract import Clock, LeaseStoreContract, request_for, table  # noqa: F401 - fixtures of the contract

pytestmark = pytest.mark.postgres


class TestPostgresStore(LeaseStoreContract):
    @pytest.fixture
    def store(self, postgres_url: str) -> Iterator[LeaseStore]:
        with SqlLeaseStore(postgres_url) as store:
            yield store

    @pytest.fixture
    def clocked_store(self, postgres_url: str, clock: Clock) -> Iterator[LeaseStore]:
        with SqlLeaseStore(postgres_url, clock=clock) as store:
            yield store
