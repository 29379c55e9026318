"""The lease store across a PostgreSQL crash and restart (its own server: the crash must not touch the
session's). Every process keeps pooled connections; after a restart they are all dead. A read that
decides nothing (what a triggerer's poll and the CLI do first) must not fail for that: it runs again on
a new connection. Writes are not retried (a failed COMMIT may have landed); they fail once with the
typed error, and the next one works without any manual step."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_delta_occ.exceptions import LeaseStoreError
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
from airflow_delta_occ.pools.requests import LeaseStatus

from ..pg import PostgresServer
from ..unit.pools.contract import Request, request_for, table  # noqa: F401 - fixtures of the contract

pytestmark = pytest.mark.postgres


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    # Commits wait for the write-ahead log (the test servers' default does not), so a crash keeps them.
    with PostgresServer(settings={"synchronous_commit": "on"}) as started:
        yield started


def test_reads_survive_a_server_restart_and_writes_recover(server: PostgresServer,
                                                           request_for: Request) -> None:  # noqa: F811
    with SqlLeaseStore(server.url) as store:
        held = store.acquire(request_for("a", "UPDATE", "country = 'DE'"))
        waiting = store.acquire(request_for("b", "UPDATE", "country = 'DE'"))
        assert (held.status, waiting.status) == (LeaseStatus.GRANTED, LeaseStatus.WAITING)
        # Several pooled connections, as a busy triggerer has.
        with store.engine.connect() as one, store.engine.connect() as two:
            one.exec_driver_sql("SELECT 1")
            two.exec_driver_sql("SELECT 1")
        server.crash()
        server.restart()
        assert [r.owner for r in store.records(pool="sales")] == ["a", "b"]
        assert store.revisions(["sales"])["sales"] > 0
        assert store.history(pool="sales", limit=5)
        assert store.poll(waiting.request_id, owner="b").status is LeaseStatus.WAITING
        # The store works on: a release grants the waiter.
        try:
            store.release(held.request_id, owner="a")
        except LeaseStoreError:
            store.release(held.request_id, owner="a")
        assert store.poll(waiting.request_id, owner="b").status is LeaseStatus.GRANTED
