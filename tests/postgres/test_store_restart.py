"""The lease store across a PostgreSQL crash and restart (its own server: the crash must not touch the
session's). Every process keeps pooled connections; after a restart they are all dead. A read that
decides nothing (what a triggerer's poll and the CLI do first) must not fail for that: it runs again on
a new connection. Writes are not retried (a failed COMMIT may have landed); they fail once with the
typed error, and the next one works without any manual step."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
from airflow_delta_occ.pools.requests import AuditKind, LeaseStatus

from ..pg import PostgresServer
from ..unit.pools.contract import Request, request_for, table  # noqa: F401 - fixtures of the contract

pytestmark = pytest.mark.postgres


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    # Commits wait for the write-ahead log (the test servers' default does not), so a crash keeps them.
    with PostgresServer(settings={"synchronous_commit": "on"}) as started:
        yield started


def test_reads_survive_a_server_restart_and_writes_recover(server: PostgresServer, request_for: Request,  # noqa: F811
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_delta_occ.pools.leases import sql

    monkeypatch.setattr(sql, "IDLE_PING_SECONDS", 1e9)   # no connection is idle long enough to be checked
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
        # A write on a dead connection is tried again: the pool read anew shows it did not land (an
        # optimistic write lands only on the revision it read), so the release is decided again and lands.
        assert writer.release(held.request_id, owner="a") is True
        assert writer.poll(waiting.request_id, owner="b").status is LeaseStatus.GRANTED
        kinds = [e.kind for e in reader.history(pool="sales", limit=10)]
        assert kinds.count(AuditKind.RELEASE) == 1 and kinds.count(AuditKind.GRANT) == 2


def test_a_holder_idle_through_a_restart_releases_at_once(server: PostgresServer, request_for: Request,  # noqa: F811
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder that did nothing while the server restarted (its job ran in Spark) releases on the first
    try: its idle connection is checked before use. Otherwise the next writer would wait a whole TTL."""
    from airflow_delta_occ.pools.leases import sql

    with SqlLeaseStore(server.url) as holder, SqlLeaseStore(server.url) as waiter:
        held = holder.acquire(request_for("a", "UPDATE", "country = 'DE'"))
        waiting = waiter.acquire(request_for("b", "UPDATE", "country = 'DE'"))
        server.crash()
        server.restart()
        monkeypatch.setattr(sql, "IDLE_PING_SECONDS", 0.0)   # as if idle for longer than the threshold
        holder.release(held.request_id, owner="a")
        assert waiter.poll(waiting.request_id, owner="b").status is LeaseStatus.GRANTED


def test_one_step_calls_go_on_after_the_server_was_down(server: PostgresServer, request_for: Request,  # noqa: F811
                                                        ) -> None:
    """Review: calls that cannot reach the server are no refusals of it; three of them in a row must not turn the
    one-step calls off for the rest of the process's life."""
    from airflow_delta_occ.exceptions import LeaseStoreError

    with SqlLeaseStore(server.url) as store:
        store.acquire(request_for("first", "UPDATE", "country = 'FR'"))
        server.crash()
        for owner in ("a", "b", "c", "d"):
            with pytest.raises(LeaseStoreError):
                store.acquire(request_for(owner, "UPDATE", "country = 'DE'"))
        server.restart()
        assert store.at_once is not None
        assert store.acquire(request_for("e", "UPDATE", "country = 'DE'")).granted
        assert store.writes["at_once"] == 1
