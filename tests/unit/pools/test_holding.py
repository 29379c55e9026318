"""``pools.holding``: a holder that stops waiting keeps no place in line, even when the store half works."""

from __future__ import annotations

import logging
import threading

import pytest

from airflow_delta_occ.exceptions import JobKilledError, LeaseStoreError, PoolConfigError
from airflow_delta_occ.pools import holding
from airflow_delta_occ.pools.config import Pool
from airflow_delta_occ.pools.holding import WaitWhere
from airflow_delta_occ.pools.leases.memory import MemoryLeaseStore
from airflow_delta_occ.pools.requests import AuditEvent, AuditKind, Blocker, LeaseRecord, LeaseState, LeaseStatus

from .contract import Clock, Request

pytestmark = pytest.mark.unit
LOG = logging.getLogger("test_holding")


class _CannotList(MemoryLeaseStore):
    """A store whose records cannot be listed (its release still works)."""

    def records(self, *, pool: str | None = None, table: str | None = None) -> list[LeaseRecord]:
        raise LeaseStoreError("listing failed")


def test_a_cancel_releases_what_it_knows_first_and_never_raises(request_for: Request) -> None:
    store = _CannotList()
    holder = store.acquire(request_for("holder", "UPDATE", "country = 'DE'"))
    waiting = store.acquire(request_for("waiter", "DELETE", "country = 'DE'"))
    assert holder.granted and waiting.status is LeaseStatus.WAITING
    released = holding.cancel_requests(store, "waiter", [waiting.request_id], table="t", log=LOG)
    assert released == {waiting.request_id}
    assert not store.release(waiting.request_id, "waiter")   # gone already


def test_a_worker_wait_killed_while_the_store_cannot_list_still_gives_its_place_back(request_for: Request) -> None:
    store = _CannotList()
    store.acquire(request_for("holder", "UPDATE", "country = 'DE'"))
    request = request_for("waiter", "DELETE", "country = 'DE'")
    waiting = store.acquire(request)
    killed = threading.Event()
    killed.set()
    with pytest.raises(JobKilledError):   # the kill, not the listing failure, is what the task reports
        holding.wait_in_worker(store, request, waiting, 0.01, LOG, killed)
    assert not store.release(waiting.request_id, "waiter")   # its place was given back


# -- where a waiter waits ------------------------------------------------------------------------------
def _pool(max_writers: int | None = None) -> Pool:
    return Pool(name="sales", tables=("t",), max_writers=max_writers)


def test_the_wait_rule_follows_the_task_then_airflow_then_adapts() -> None:
    rule = holding.WaitRule.of
    assert rule(True, _pool()).where is WaitWhere.DEFERRED
    assert rule(False, _pool()).where is WaitWhere.WORKER
    assert rule(None, _pool(), default_deferrable=True).where is WaitWhere.DEFERRED
    assert rule(None, _pool(), default_deferrable=False).where is WaitWhere.WORKER
    assert rule(False, _pool(), default_deferrable=True).where is WaitWhere.WORKER   # the task's own choice wins
    adaptive = rule(None, _pool(), worker_wait=20.0)
    assert (adaptive.where, adaptive.worker_wait, adaptive.comes_back) == (WaitWhere.ADAPTIVE, 20.0, 5.0)
    assert rule(None, _pool(), worker_wait=0.0).where is WaitWhere.DEFERRED   # worker_wait = 0: always deferred
    # A pool that limits writers: waiters in the worker would hold the slots granted writers need.
    assert rule(None, _pool(max_writers=2)).where is WaitWhere.DEFERRED
    assert rule(None, _pool(max_writers=2)).comes_back is None
    for forced in ((False, None), (None, False)):
        with pytest.raises(PoolConfigError, match="limits writers"):
            rule(forced[0], _pool(max_writers=2), default_deferrable=forced[1])


def test_an_adaptive_wait_defers_when_the_expected_wait_is_long_or_it_waited_long() -> None:
    adaptive = holding.WaitRule(WaitWhere.ADAPTIVE, worker_wait=30.0)
    assert not adaptive.defers(29.0, 0.0) and adaptive.defers(31.0, 0.0)
    assert not adaptive.defers(None, 29.0) and adaptive.defers(None, 30.0)   # unknown: bounded by time
    assert not holding.WaitRule(WaitWhere.WORKER).defers(1e9, 1e9)
    assert holding.WaitRule(WaitWhere.DEFERRED).defers(0.0, 0.0)


def _event(at: float, request_id: str, kind: AuditKind, summary: str = "") -> AuditEvent:
    return AuditEvent(at=at, pool="sales", table="t", request_id=request_id, owner=request_id, kind=kind,
                      summary=summary)


def test_the_typical_hold_is_the_median_of_the_tables_completed_holds() -> None:
    events = [_event(0, "a", AuditKind.GRANT), _event(4, "a", AuditKind.RELEASE),
              _event(1, "b", AuditKind.GRANT), _event(2, "b", AuditKind.RENEW), _event(11, "b", AuditKind.RELEASE),
              _event(5, "c", AuditKind.GRANT), _event(8, "c", AuditKind.RELEASE),
              _event(9, "d", AuditKind.GRANT), _event(20, "d", AuditKind.EXPIRE),   # no release: not a hold
              _event(12, "e", AuditKind.RELEASE)]                                   # its grant was not read
    estimate = holding.WaitEstimate.from_history(events)
    assert (estimate.typical_hold, estimate.holds_seen) == (4.0, 3)
    assert holding.WaitEstimate.from_history([]).typical_hold is None


def test_each_kind_of_job_has_its_own_typical_hold() -> None:
    """What a request expects to hold comes from holds of its own kind: a table's appends say nothing about
    its compactions (an OPTIMIZE that claimed an append's estimate could overtake and then hold for minutes)."""
    def hold(request_id: str, start: float, end: float, operation: str) -> list[AuditEvent]:
        summary = f"{operation} '{request_id}' planned at version 3; writes anywhere"
        return [_event(start, request_id, AuditKind.GRANT, summary),
                _event(end, request_id, AuditKind.RELEASE, summary)]

    events = [*hold("a1", 0, 2, "INSERT"), *hold("o1", 2, 62, "OPTIMIZE"), *hold("a2", 62, 66, "INSERT"),
              *hold("a3", 66, 69, "INSERT")]
    estimate = holding.WaitEstimate.from_history(events)
    assert estimate.hold_of("INSERT") == 3.0 and estimate.hold_of("OPTIMIZE") == 60.0
    assert estimate.hold_of("MERGE") is None
    assert estimate.typical_hold == 3.5


def _blocked(now: float, *blockers: Blocker) -> LeaseState:
    return LeaseState("w", LeaseStatus.WAITING, now, None, blockers)


def test_the_expected_wait_is_the_holders_remaining_hold_plus_a_hold_per_request_ahead() -> None:
    estimate = holding.WaitEstimate(typical_hold=10.0)
    holder = Blocker("conflicts", "h", "h", granted=True)
    ahead = Blocker("conflicts", "a", "a", granted=False)
    assert estimate.expected(_blocked(100.0, holder), {"h": 97.0}) == pytest.approx(7.0)
    assert estimate.expected(_blocked(100.0, holder, ahead), {"h": 97.0, "a": None}) == pytest.approx(17.0)
    assert estimate.expected(_blocked(100.0, holder), {"h": 85.0}) is None   # held longer than usual: unknown
    assert estimate.expected(_blocked(100.0, Blocker("the pool's writer limit")), {}) is None
    assert holding.WaitEstimate(None).expected(_blocked(100.0, holder), {"h": 99.0}) is None
    assert estimate.expected(LeaseState("w", LeaseStatus.GRANTED, 100.0), {}) == 0.0


def test_an_adaptive_worker_wait_hands_a_long_wait_to_the_triggerer_keeping_its_place(request_for: Request) -> None:
    clock = Clock(1_700_000_000.0)
    store = MemoryLeaseStore(clock=clock)
    for owner in ("old1", "old2"):   # this table's leases were held 100 s each
        done = store.acquire(request_for(owner, "OPTIMIZE"))
        clock.now += 100.0
        store.release(done.request_id, owner)
    holder = store.acquire(request_for("holder", "OPTIMIZE"))
    request = request_for("waiter", "UPDATE", "country = 'DE'")
    waiting = store.acquire(request)
    estimate = holding.WaitEstimate.read(store, "t")
    assert estimate.typical_hold == 100.0
    warmed: list[str] = []
    ended = holding.wait_in_worker(store, request, waiting, 0.01, LOG, threading.Event(),
                                   rule=holding.WaitRule(WaitWhere.ADAPTIVE), estimate=estimate,
                                   staying=lambda: warmed.append("warm"))
    assert not ended.granted and ended.expected == pytest.approx(100.0)
    assert warmed == []   # deferring at once: no Spark session started for nothing
    assert ended.state.request_id == waiting.request_id   # still in line, for the trigger to take over
    assert [r.owner for r in store.waiters()] == ["waiter"] and store.holders()[0].request_id == holder.request_id


def test_a_worker_wait_sees_a_release_long_before_its_next_full_poll(request_for: Request) -> None:
    """The full poll is due every 30 s here (a TTL of 600 s does not shorten it); the pool's revision,
    read every 50 ms, brings the grant."""
    import time

    store = MemoryLeaseStore()
    holder = store.acquire(request_for("holder", "OPTIMIZE"))
    request = request_for("waiter", "UPDATE", "country = 'DE'", ttl=600.0)
    waiting = store.acquire(request)
    polls = 0
    poll = store.poll

    def counted(request_id: str, owner: str) -> LeaseState:
        nonlocal polls
        polls += 1
        return poll(request_id, owner)

    store.poll = counted  # type: ignore[method-assign]
    timer = threading.Timer(0.3, store.release, (holder.request_id, "holder"))
    started = time.monotonic()
    timer.start()
    warmed: list[str] = []
    ended = holding.wait_in_worker(store, request, waiting, 30.0, LOG, threading.Event(),
                                   staying=lambda: warmed.append("warm"))
    timer.join()
    assert warmed == ["warm"]   # once, while it waited
    assert ended.granted and time.monotonic() - started < 10.0   # the full poll was 30 s away
    assert polls == 2   # the first, at once; then the one the release's revision called for


def test_a_blocker_first_seen_waiting_is_timed_from_its_grant(request_for: Request) -> None:
    """The estimate must learn when a blocker it first saw waiting was granted, or it would count that
    blocker's whole typical hold as still to come however long it has held."""
    clock = Clock(1_700_000_000.0)
    store = MemoryLeaseStore(clock=clock)
    first = store.acquire(request_for("first", "OPTIMIZE"))
    second = store.acquire(request_for("second", "OPTIMIZE"))
    request = request_for("waiter", "UPDATE", "country = 'DE'")
    waiting = store.acquire(request)
    wait = holding.LeaseWait(request, waiting.request_id, 1.0, LOG)
    estimate = holding.WaitEstimate(typical_hold=10.0)
    seen = wait.poll(store).state
    assert seen is not None and {b.owner for b in seen.blockers} == {"first", "second"}
    assert wait.expected(store, seen, estimate) == pytest.approx(20.0)   # first holds (just granted), second waits
    store.release(first.request_id, "first")   # second is granted now
    clock.now += 6.0
    later = wait.poll(store).state
    assert later is not None and [b.owner for b in later.blockers] == ["second"] and later.blockers[0].granted
    assert wait.expected(store, later, estimate) == pytest.approx(4.0)   # 10 s typical, held 6 s already
    assert second.request_id == later.blockers[0].request_id


def test_a_waiter_behind_another_logs_again_only_when_the_requests_ahead_change() -> None:
    """Issue #23: in a line that passes a lease down, the held lease each waiter names changes at every
    hand-over, and every waiter of a triggerer logged a line each time (a thousand per hand-over)."""
    seen = holding.BlockersSeen()

    def held(name: str) -> Blocker:
        return Blocker(f"{name} holds", name, name, True)

    ahead = Blocker("w1 is ahead", "w1", "w1", False)
    assert seen.update([held("h1"), ahead]) == [held("h1"), ahead]   # first seen: logged
    assert seen.update([held("h2"), ahead]) == []                    # a new holder, the same request ahead
    assert seen.update([held("w1")]) == [held("w1")]                 # first in line now: logged
    assert seen.update([held("w0")]) == [held("w0")]                 # first in line, a new holder: logged
    assert [b["owner"] for b in seen.seen()] == ["h1", "w1", "h2", "w0"]   # everyone is still accounted for
    limit = Blocker("the pool's writer limit of 2 is reached")               # no request: not somebody ahead
    assert seen.update([held("w0"), limit]) == [held("w0"), limit]
    assert seen.update([held("w2"), limit]) == [held("w2"), limit]           # a new holder: logged
