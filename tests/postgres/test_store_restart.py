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
    with SqlLeaseStore(server.url) as reader, SqlLeaseStore(server.url) as writer:
        held = writer.acquire(request_for("a", "UPDATE", "country = 'DE'"))
        waiting = writer.acquire(request_for("b", "UPDATE", "country = 'DE'"))
        assert (held.status, waiting.status) == (LeaseStatus.GRANTED, LeaseStatus.WAITING)
        assert reader.records(pool="sales")   # both stores hold pooled connections now
        server.crash()
        server.restart()
        # A read that decides nothing runs again on a new connection.
        assert [r.owner for r in reader.records(pool="sales")] == ["a", "b"]
        assert reader.revisions(["sales"])["sales"] > 0
        assert reader.history(pool="sales", limit=5)
        # A write on a dead connection fails once with the typed error (it is not repeated: a COMMIT cut
        # off may have landed), and the next operation works without any manual step.
        with pytest.raises(LeaseStoreError, match="could not lock pool 'sales'"):
            writer.release(held.request_id, owner="a")
        writer.release(held.request_id, owner="a")
        assert writer.poll(waiting.request_id, owner="b").status is LeaseStatus.GRANTED
