"""A holder that dies without releasing: its lease expires at its TTL and the waiter behind it gets the table.

The holder runs in its own (spawned) process, heartbeats (``renew``) every ``HEARTBEAT`` seconds with a TTL
of ``TTL`` seconds, and is killed with SIGKILL, so nothing in it can clean up. The waiter, in the test
process, asks for a job that can conflict with the holder's and polls. The lease must outlive the TTL while
the heartbeat runs, and be gone at most one TTL after the last heartbeat; the dead holder's identity must then
be worthless: it can neither renew its lease nor release the waiter's.

Every time is read on the store's clock (the audit's times and each poll's ``checked_at``), so a slow machine
moves when things happen but cannot break what is asserted: a poll that found the waiter still waiting came
before the dead holder's deadline, the one that granted it after. The one thing left to the machine is that the
holder, while alive, renews within its TTL: it has ``TTL - HEARTBEAT`` seconds of slack for that.
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

TTL = 4.0
HEARTBEAT = 0.5
POLL = 0.05
# Times on the store's clock are compared to the millisecond (SQLite's clock has no finer resolution).
EPS = 1e-3
# Only "nothing hung": how long the test waits in real time for what is due within about one TTL.
HANG = 120.0


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

            # The heartbeat keeps the lease past its TTL: the waiter keeps waiting until the store's clock is two
            # heartbeats past the holder's first TTL.
            [held] = [r for r in store.records(pool=POOL) if r.request_id == held_id]
            assert held.granted_at is not None
            alive_until = held.granted_at + TTL + 2 * HEARTBEAT
            started_polling = time.monotonic()
            while True:
                state = store.poll(waiter.request_id, "waiter")
                assert not state.granted, "granted while the holder heartbeats"
                if state.checked_at >= alive_until:
                    last_refused = state.checked_at
                    break
                assert time.monotonic() - started_polling < HANG, "the store's clock did not move"
                time.sleep(POLL)
            assert holder.is_alive() and out.empty(), "the holder stopped on its own"

            assert holder.pid is not None
            os.kill(holder.pid, signal.SIGKILL)
            killed = time.monotonic()
            holder.join(timeout=30)
            still_waiting = []   # the store's clock at each poll that found the waiter still waiting
            state = store.poll(waiter.request_id, "waiter")
            while not state.granted:
                assert state.status is LeaseStatus.WAITING, state
                still_waiting.append(state.checked_at)
                assert time.monotonic() - killed < HANG, "the dead holder's lease never expired"
                time.sleep(POLL)
                state = store.poll(waiter.request_id, "waiter")
            waited = time.monotonic() - killed
            print(f"waiter granted {waited:.3f} s after the holder was killed (TTL {TTL} s, heartbeat {HEARTBEAT} s)")

            events = store.history(pool=POOL, limit=1000)
            mine = [e for e in events if e.request_id == held_id]
            assert [e.kind for e in mine][:2] == [AuditKind.REQUEST, AuditKind.GRANT]
            assert mine[-1].kind is AuditKind.EXPIRE, [e.kind for e in mine]
            # The renewals were audited, and one of them is what kept the lease when the waiter was last refused
            # (two heartbeats past the first TTL, on the store's clock): a heartbeat less than one TTL before.
            renewals = [e.at for e in mine if e.kind is AuditKind.RENEW]
            assert renewals, "the heartbeat was not audited"
            assert any(at <= last_refused + EPS and last_refused < at + TTL + EPS for at in renewals), \
                (last_refused, renewals)
            # The lease ended one TTL after the last heartbeat on the store's clock: honoured until then (every
            # poll that found the waiter waiting came before it), and no longer (the next poll granted it).
            deadline = max(renewals) + TTL
            assert all(at < deadline + EPS for at in still_waiting), (deadline, still_waiting[-3:])
            assert state.checked_at >= deadline - EPS and mine[-1].at >= deadline - EPS, (deadline, state, mine[-1])
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
