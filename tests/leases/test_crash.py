"""A holder that dies without releasing: its lease expires at its TTL and the waiter behind it gets the table.

The holder runs in its own (spawned) process, heartbeats (``renew``) every ``HEARTBEAT`` seconds with a TTL
of ``TTL`` seconds, and is killed with SIGKILL, so nothing in it can clean up. The waiter, in the test
process, asks for a job that can conflict with the holder's and polls. The lease must outlive the TTL while
the heartbeat runs, and be gone at most one TTL after the last heartbeat; the dead holder's identity must then
be worthless: it can neither renew its lease nor release the waiter's.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from airflow_delta_occ.exceptions import LeaseLostError, LeaseOwnershipError
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
from airflow_delta_occ.pools.requests import AuditKind, LeaseStatus

from .workload import CRASH_WAITER_JOB, POOL, build_menu, find_item, hold_and_heartbeat, request_for

pytestmark = pytest.mark.postgres

TTL = 2.0
HEARTBEAT = 0.5
POLL = 0.05
# Polling granularity plus one store call each side of the expiry (loopback database, two cores).
SLACK = 0.5


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "postgres_url"))


def test_a_killed_holder_loses_its_lease_within_one_ttl(store_url: str, lease_tables: dict[str, str]) -> None:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    holder = ctx.Process(target=hold_and_heartbeat, args=(store_url, lease_tables, TTL, HEARTBEAT, out),
                         name="crash-holder")
    holder.start()
    try:
        started = out.get(timeout=120)
        assert "error" not in started, started.get("error")
        held_id, dead_owner = started["request_id"], started["owner"]
        with SqlLeaseStore(store_url) as store:
            waiter = store.acquire(request_for(find_item(build_menu(lease_tables), *CRASH_WAITER_JOB), "waiter",
                                               ttl=30.0))
            assert waiter.status is LeaseStatus.WAITING
            assert [b.request_id for b in waiter.blockers] == [held_id]

            # The heartbeat keeps the lease past its TTL: the waiter keeps waiting.
            alive_until = time.monotonic() + TTL + 2 * HEARTBEAT
            while time.monotonic() < alive_until:
                assert not store.poll(waiter.request_id, "waiter").granted, "granted while the holder heartbeats"
                time.sleep(POLL)
            assert holder.is_alive() and out.empty(), "the holder stopped on its own"

            assert holder.pid is not None
            os.kill(holder.pid, signal.SIGKILL)
            killed = time.monotonic()
            holder.join(timeout=30)
            state = store.poll(waiter.request_id, "waiter")
            while not state.granted:
                assert state.status is LeaseStatus.WAITING, state
                assert time.monotonic() - killed < TTL + HEARTBEAT + SLACK + 10, "the dead holder's lease never expired"
                time.sleep(POLL)
                state = store.poll(waiter.request_id, "waiter")
            waited = time.monotonic() - killed
            print(f"waiter granted {waited:.3f} s after the holder was killed (TTL {TTL} s, heartbeat {HEARTBEAT} s)")

            # The last heartbeat was at most HEARTBEAT before the kill: the lease ends within TTL of it,
            # and not before TTL - HEARTBEAT after the kill (the lease was honoured until it expired).
            assert TTL - HEARTBEAT - POLL <= waited <= TTL + HEARTBEAT + SLACK, f"granted {waited:.3f} s after the kill"

            events = store.history(pool=POOL, limit=1000)
            mine = [e for e in events if e.request_id == held_id]
            assert [e.kind for e in mine][:2] == [AuditKind.REQUEST, AuditKind.GRANT]
            assert sum(e.kind is AuditKind.RENEW for e in mine) >= TTL / HEARTBEAT, "the heartbeat was not audited"
            assert mine[-1].kind is AuditKind.EXPIRE, [e.kind for e in mine]
            grant = next(e for e in events if e.request_id == waiter.request_id and e.kind is AuditKind.GRANT)
            assert grant.event_id is not None and mine[-1].event_id is not None
            assert grant.event_id > mine[-1].event_id and grant.at >= mine[-1].at

            # The dead holder's identity is worthless now.
            with pytest.raises(LeaseLostError):
                store.renew(held_id, dead_owner)
            with pytest.raises(LeaseOwnershipError):
                store.release(waiter.request_id, dead_owner)
            assert store.poll(waiter.request_id, "waiter").granted   # the failed release changed nothing
            assert store.release(held_id, dead_owner) is False
            assert store.release(waiter.request_id, "waiter") is True
            assert store.records(pool=POOL) == []
    finally:
        if holder.is_alive():
            holder.kill()
        holder.join(timeout=30)
