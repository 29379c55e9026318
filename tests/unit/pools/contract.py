"""The lease store contract as tests, run against every store (memory, SQLite, PostgreSQL).

A test module subclasses ``LeaseStoreContract`` and provides a ``store`` fixture; each test names the
invariant of ``airflow_delta_occ.pools.leases.base`` it checks. A TTL test whose claim needs a heartbeat to come
in time (renewing, asking again) moves an injected clock (``clocked_store``), so a slow machine cannot break it.
The tests that let the store's own clock run (the database's, for SQL stores) claim only what waiting longer
cannot break: a request is gone after its TTL, never before its deadline on that clock (read from the audit).
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog, Snapshot
from airflow_delta_occ.engine.planner import TableState, plan_footprint
from airflow_delta_occ.exceptions import LeaseLostError, LeaseOwnershipError
from airflow_delta_occ.pools import arbiter, compare
from airflow_delta_occ.pools.compare import PairJudge
from airflow_delta_occ.pools.leases.base import LeaseStore
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
from airflow_delta_occ.pools.requests import AuditKind, LeaseRequest, LeaseStatus

from ..engine.logbuilder import LogBuilder, add, commit_info, metadata, protocol

Request = Callable[..., LeaseRequest]


@pytest.fixture
def table(tmp_path: Path) -> Snapshot:
    """Partitioned by (date, country): two files in each of DE, FR and IT on 2024-01-01."""
    b = LogBuilder(tmp_path / "sales")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata())
    b.commit(commit_info(), *(add(f"{c}-{i}.parquet", {"date": "2024-01-01", "country": c})
                              for c in ("DE", "FR", "IT") for i in range(2)))
    return DeltaLog.for_table(b.root).snapshot()


@pytest.fixture
def request_for(table: Snapshot) -> Request:
    def make(owner: str, operation: str, predicate: str | None = None, *, pool: str = "sales", table_key: str = "t",
             ttl: float = 30.0, max_writers: int | None = None, **planner: Any) -> LeaseRequest:
        footprint = plan_footprint(table, operation, predicate, label=owner, **planner)
        return LeaseRequest.of(pool=pool, table=table_key, owner=owner, footprint=footprint,
                               table_state=TableState.of(table), ttl=ttl, max_writers=max_writers)
    return make


def record_calls(monkeypatch: pytest.MonkeyPatch, target: object, name: str) -> list[tuple[Any, ...]]:
    """The arguments of every call of ``target.name`` from now on (the calls still run): what a cost test counts."""
    calls: list[tuple[Any, ...]] = []
    original = getattr(target, name)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return original(*args, **kwargs)
    monkeypatch.setattr(target, name, recorded)
    return calls


class Clock:
    """A store clock that tests move by hand (epoch seconds)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _at(moment: float) -> Any:
    """``moment`` on the store's clock, to the millisecond (pytest's default tolerance is relative: at
    epoch seconds it would accept half an hour)."""
    return pytest.approx(moment, abs=1e-3)


def _expecting(request: LeaseRequest, seconds: float) -> LeaseRequest:
    """``request`` with an expected hold (what the operators put in from the table's audit)."""
    return dataclasses.replace(request, expected_hold=seconds)


def _wait_until(check: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll ``check`` until it holds. The timeout only says the store did not hang: the expiry it waits for
    is due in well under a second, and a slow machine only makes the wait longer, never the outcome different."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


class LeaseStoreContract:
    """Every store must pass these; subclasses provide the ``store`` fixture, and ``clocked_store``: a store
    whose clock is the ``clock`` fixture."""

    @pytest.fixture
    def clock(self) -> Clock:
        return Clock(1_700_000_000.0)

    # -- 1: no conflicting holders; a blocked request names what it waits for --------------------
    def test_disjoint_partitions_are_granted_together(self, store: LeaseStore, request_for: Request) -> None:
        de = store.acquire(request_for("de", "UPDATE", "country = 'DE'"))
        fr = store.acquire(request_for("fr", "MERGE", "country = 'FR'",
                                       write_partitions=[{"date": "2024-01-01", "country": "FR"}]))
        assert de.granted and fr.granted
        assert {r.owner for r in store.holders(table="t")} == {"de", "fr"}

    def test_a_conflicting_request_waits_for_the_holder_and_gets_it_on_release(
            self, store: LeaseStore, request_for: Request) -> None:
        first = store.acquire(request_for("first", "UPDATE", "country = 'DE'"))
        second = store.acquire(request_for("second", "DELETE", "country = 'DE' AND id = 3"))
        assert first.granted and second.status is LeaseStatus.WAITING
        assert [b.request_id for b in second.blockers] == [first.request_id]
        assert second.blockers[0].granted and "Concurrent" not in second.blockers[0].reason[:0]
        assert store.poll(second.request_id, "second").status is LeaseStatus.WAITING
        assert store.release(first.request_id, "first")
        assert store.poll(second.request_id, "second").granted

    def test_whom_each_waiter_waits_for_is_read_without_a_heartbeat(
            self, store: LeaseStore, request_for: Request) -> None:
        held = store.acquire(request_for("held", "UPDATE", "country = 'DE'"))
        behind = store.acquire(request_for("behind", "DELETE", "country = 'DE' AND id = 3"))
        later = store.acquire(request_for("later", "OPTIMIZE"))   # conflicts with both: waits behind "behind" too
        revision = store.revision("sales")
        found = store.waiting_for(pool="sales")
        assert set(found) == {behind.request_id, later.request_id}
        assert [b.request_id for b in found[behind.request_id]] == [held.request_id]
        assert {b.request_id for b in found[later.request_id]} >= {held.request_id}
        assert all(b.reason for blockers in found.values() for b in blockers)
        assert store.revision("sales") == revision and store.waiting_for(pool="nobody") == {}

    def test_a_release_grants_the_next_waiter_in_the_same_transaction(
            self, store: LeaseStore, request_for: Request) -> None:
        first = store.acquire(request_for("first", "OPTIMIZE"))
        second = store.acquire(request_for("second", "UPDATE", "country = 'FR'"))
        store.release(first.request_id, "first")
        assert [r.owner for r in store.holders()] == ["second"]  # granted without polling
        assert second.status is LeaseStatus.WAITING

    def test_the_revision_moves_with_every_change_and_only_then(self, store: LeaseStore, request_for: Request) -> None:
        """Waiters read it between polls to see a release at once: every change must move it, and a
        read or a quiet poll must not (or every waiter would poll on every check)."""
        assert store.revision("sales") == store.revision("sales")
        seen = [store.revision("sales")]

        def moved() -> bool:
            seen.append(store.revision("sales"))
            return seen[-1] != seen[-2]

        first = store.acquire(request_for("first", "OPTIMIZE"))
        assert moved()
        second = store.acquire(request_for("second", "UPDATE", "country = 'DE'"))
        assert moved()
        store.records(), store.history(), store.poll(second.request_id, "second")   # a fresh heartbeat: quiet
        assert not moved()
        store.renew(first.request_id, "first")
        assert moved()
        store.acquire(request_for("other", "OPTIMIZE", pool="other"))
        assert not moved()   # another pool's changes are not this pool's
        store.release(first.request_id, "first")   # grants "second" in the same transaction
        assert moved() and store.holders(pool="sales")[0].owner == "second"

    def test_other_tables_and_pools_never_block(self, store: LeaseStore, request_for: Request) -> None:
        assert store.acquire(request_for("a", "OPTIMIZE")).granted
        assert store.acquire(request_for("b", "OPTIMIZE", table_key="other")).granted
        assert store.acquire(request_for("c", "OPTIMIZE", pool="finance")).granted

    def test_a_metadata_change_conflicts_with_every_writer_of_the_table(
            self, store: LeaseStore, request_for: Request) -> None:
        assert store.acquire(request_for("w", "INSERT", write_partitions=[{"date": "2024-01-02",
                                                                           "country": "ES"}])).granted
        props = store.acquire(request_for("props", "SET_PROPERTIES", properties={"team": "x"}))
        assert props.status is LeaseStatus.WAITING

    # -- 4: fairness ------------------------------------------------------------------------------
    def test_a_later_request_never_overtakes_an_earlier_one_it_conflicts_with(
            self, store: LeaseStore, request_for: Request) -> None:
        holder = store.acquire(request_for("holder", "UPDATE", "country = 'DE'"))
        compaction = store.acquire(request_for("compaction", "OPTIMIZE"))          # waits for holder
        fr = store.acquire(request_for("fr", "UPDATE", "country = 'FR'"))          # free, but conflicts with compaction
        append = store.acquire(request_for("append", "INSERT", write_partitions=[{"date": "2024-01-02",
                                                                                   "country": "ES"}]))
        assert holder.granted and not compaction.granted
        assert fr.status is LeaseStatus.WAITING
        assert [b.request_id for b in fr.blockers] == [compaction.request_id] and not fr.blockers[0].granted
        assert append.granted  # conflicts with nobody holding or waiting: granted at once
        store.release(holder.request_id, "holder")
        assert store.poll(compaction.request_id, "compaction").granted
        assert store.poll(fr.request_id, "fr").status is LeaseStatus.WAITING
        store.release(compaction.request_id, "compaction")
        assert store.poll(fr.request_id, "fr").granted

    # -- 4a: going ahead in the shadow of the holders (the arbiter's rule 2a) ---------------------
    def test_a_request_expected_to_end_before_an_earlier_one_can_start_goes_ahead_of_it(
            self, clocked_store: LeaseStore, clock: Clock, request_for: Request) -> None:
        """The unpartitioned-table chain of the headline benchmark, in small: a compaction holds, a reader of
        DE waits for it, an append into DE conflicts only with the reader. Expected to end before the
        compaction does, the append is granted beside it; the reader then waits for both, and is granted
        once both are released."""
        store, t0 = clocked_store, clock.now
        compaction = store.acquire(_expecting(request_for("compaction", "OPTIMIZE", ttl=600.0), 10.0))
        reader = store.acquire(_expecting(request_for("reader", "UPDATE", "country = 'DE'", ttl=600.0), 5.0))
        clock.now = t0 + 2.0
        append = store.acquire(_expecting(request_for("append", "INSERT", ttl=600.0, write_partitions=[
            {"date": "2024-01-01", "country": "DE"}]), 8.0))   # ends at t0 + 10: no later than the compaction
        assert compaction.granted and reader.status is LeaseStatus.WAITING and append.granted
        state = store.poll(reader.request_id, "reader")
        assert {(b.owner, b.granted) for b in state.blockers} == {("compaction", True), ("append", True)}
        store.release(compaction.request_id, "compaction")
        assert store.poll(reader.request_id, "reader").status is LeaseStatus.WAITING
        store.release(append.request_id, "append")
        assert store.poll(reader.request_id, "reader").granted

    def test_a_request_that_would_end_after_an_earlier_one_could_start_waits_behind_it(
            self, clocked_store: LeaseStore, clock: Clock, request_for: Request) -> None:
        store, t0 = clocked_store, clock.now
        store.acquire(_expecting(request_for("compaction", "OPTIMIZE", ttl=600.0), 10.0))
        reader = store.acquire(_expecting(request_for("reader", "UPDATE", "country = 'DE'", ttl=600.0), 5.0))
        de = [{"date": "2024-01-01", "country": "DE"}]
        longer = store.acquire(_expecting(request_for("longer", "INSERT", ttl=600.0, write_partitions=de), 10.5))
        clock.now = t0 + 3.0   # the compaction is expected to end in 7 s; an append of 8 s would outlast it
        late = store.acquire(_expecting(request_for("late", "INSERT", ttl=600.0, write_partitions=de), 8.0))
        assert reader.status is LeaseStatus.WAITING
        for waiting in (longer, late):
            assert waiting.status is LeaseStatus.WAITING
            assert reader.request_id in {b.request_id for b in waiting.blockers}

    def test_nobody_goes_ahead_without_every_estimate(
            self, clocked_store: LeaseStore, request_for: Request) -> None:
        """No estimate for the holder (a sensor's lease, a job of a kind not seen on the table) or for the
        newcomer: arrival order, as without rule 2a."""
        store, de = clocked_store, [{"date": "2024-01-01", "country": "DE"}]
        store.acquire(request_for("compaction", "OPTIMIZE", ttl=600.0))   # no expected_hold
        store.acquire(_expecting(request_for("reader", "UPDATE", "country = 'DE'", ttl=600.0), 5.0))
        append = store.acquire(_expecting(request_for("append", "INSERT", ttl=600.0, write_partitions=de), 1.0))
        unknown = store.acquire(request_for("unknown", "INSERT", ttl=600.0, write_partitions=de))
        assert append.status is LeaseStatus.WAITING and unknown.status is LeaseStatus.WAITING

    def test_overtaking_stops_when_the_holder_was_expected_to_end(
            self, clocked_store: LeaseStore, clock: Clock, request_for: Request) -> None:
        """The bound on overtaking: once the leases a request waits for were expected to be released, nobody
        goes ahead of it, however long they overrun, so a stream of newcomers cannot starve it."""
        store, t0, de = clocked_store, clock.now, [{"date": "2024-01-01", "country": "DE"}]
        store.acquire(_expecting(request_for("compaction", "OPTIMIZE", ttl=600.0), 10.0))
        reader = store.acquire(_expecting(request_for("reader", "UPDATE", "country = 'DE'", ttl=600.0), 5.0))
        first = store.acquire(_expecting(request_for("first", "INSERT", ttl=600.0, write_partitions=de), 9.0))
        assert first.granted   # ends at t0 + 9, before the compaction's t0 + 10
        clock.now = t0 + 9.5   # both overrun their estimates; an append of 0.4 s still fits
        second = store.acquire(_expecting(request_for("second", "INSERT", ttl=600.0, write_partitions=de), 0.4))
        assert second.granted
        clock.now = t0 + 10.5  # past every estimate of the leases the reader waits for
        third = store.acquire(_expecting(request_for("third", "INSERT", ttl=600.0, write_partitions=de), 0.01))
        assert third.status is LeaseStatus.WAITING
        assert reader.request_id in {b.request_id for b in third.blockers}

    def test_only_the_leases_that_arrived_first_cast_the_shadow(
            self, clocked_store: LeaseStore, clock: Clock, request_for: Request) -> None:
        """A compaction expected to hold 600 s ends after 2 s: the reader behind it then waits only for the append
        that went ahead of it, and no later append may go ahead in that append's shadow (the reader would
        otherwise wait as long as the compaction's estimate, not for the error of one estimate)."""
        store, t0, de = clocked_store, clock.now, [{"date": "2024-01-01", "country": "DE"}]
        compaction = store.acquire(_expecting(request_for("compaction", "OPTIMIZE", ttl=6000.0), 600.0))
        reader = store.acquire(_expecting(request_for("reader", "UPDATE", "country = 'DE'", ttl=6000.0), 5.0))
        clock.now = t0 + 1.0
        first = store.acquire(_expecting(request_for("first", "INSERT", ttl=6000.0, write_partitions=de), 500.0))
        assert first.granted and reader.status is LeaseStatus.WAITING
        clock.now = t0 + 2.0
        store.release(compaction.request_id, "compaction")
        clock.now = t0 + 50.0
        second = store.acquire(_expecting(request_for("second", "INSERT", ttl=6000.0, write_partitions=de), 10.0))
        assert second.status is LeaseStatus.WAITING
        assert reader.request_id in {b.request_id for b in second.blockers}
        store.release(first.request_id, "first")
        assert store.poll(reader.request_id, "reader").granted

    def test_a_request_kept_back_by_the_writer_limit_still_names_the_requests_it_would_go_ahead_of(
            self, clocked_store: LeaseStore, request_for: Request) -> None:
        store, de = clocked_store, [{"date": "2024-01-01", "country": "DE"}]
        store.acquire(_expecting(request_for("compaction", "OPTIMIZE", ttl=600.0, max_writers=1), 10.0))
        reader = store.acquire(_expecting(request_for("reader", "UPDATE", "country = 'DE'", ttl=600.0,
                                                      max_writers=1), 5.0))
        append = store.acquire(_expecting(request_for("append", "INSERT", ttl=600.0, write_partitions=de,
                                                      max_writers=1), 1.0))
        assert append.status is LeaseStatus.WAITING
        assert [b.request_id for b in append.blockers] == [reader.request_id, None]
        assert "writer limit of 1" in append.blockers[1].reason

    # -- decisions that stay cheap: stop at the first blocker, remember it with the request ---------
    @pytest.fixture
    def reopen(self) -> Iterator[Callable[[LeaseStore], LeaseStore]]:
        """The same store as a fresh task process sees it: nothing judged yet (a SQL store is opened anew)."""
        opened: list[LeaseStore] = []

        def make(store: LeaseStore) -> LeaseStore:
            if isinstance(store, SqlLeaseStore):
                opened.append(SqlLeaseStore(store.engine.url.render_as_string(hide_password=False)))
                return opened[-1]
            store.judge = PairJudge()
            return store
        yield make
        for store in opened:
            store.close()

    @pytest.fixture
    def judged(self, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
        """Every pair the judges of this process compare (a memo hit is not a comparison)."""
        return record_calls(monkeypatch, compare, "lease_verdict")

    def test_a_fresh_process_does_not_judge_again_the_waiters_of_a_held_lease(
            self, store: LeaseStore, request_for: Request, reopen: Callable[[LeaseStore], LeaseStore],
            judged: list[tuple[Any, ...]]) -> None:
        """Issue #23: every waiter was compared with every earlier one, and a store opened in a new task
        process paid all of those comparisons inside the pool's lock."""
        optimize = store.acquire(request_for("optimize", "OPTIMIZE"))
        waiters = [store.acquire(request_for(f"w{i}", "UPDATE", f"country = '{('DE', 'FR', 'IT')[i % 3]}'"))
                   for i in range(12)]
        assert optimize.granted and not any(w.granted for w in waiters)
        assert len(judged) <= 2 * 12, f"each waiter: the holder, then at most the request ahead of it: {judged}"
        judged.clear()
        fresh = reopen(store)
        late = fresh.acquire(request_for("late", "UPDATE", "country = 'DE'"))
        # the lease it waits for, and the request it queues directly behind (the nearest earlier one on DE)
        assert not late.granted and [b.owner for b in late.blockers] == ["optimize", "w9"]
        assert len(judged) <= 3, f"only the newcomer is judged, not the 12 waiters: {judged}"
        judged.clear()
        state = fresh.poll(waiters[7].request_id, "w7")
        assert state.status is LeaseStatus.WAITING and [b.owner for b in state.blockers] == ["optimize", "w4"]
        assert len(judged) <= 2, f"a poll explains its own request only: {judged}"

    def test_the_held_lease_a_waiter_remembers_is_forgotten_once_released(
            self, store: LeaseStore, request_for: Request, reopen: Callable[[LeaseStore], LeaseStore]) -> None:
        optimize = store.acquire(request_for("optimize", "OPTIMIZE"))
        first = store.acquire(request_for("first", "UPDATE", "country = 'DE'"))
        second = store.acquire(request_for("second", "DELETE", "country = 'DE' AND id = 3"))
        other = store.acquire(request_for("other", "UPDATE", "country = 'FR'"))
        assert not (first.granted or second.granted or other.granted)
        fresh = reopen(store)
        assert fresh.release(optimize.request_id, "optimize")
        assert fresh.poll(first.request_id, "first").granted and fresh.poll(other.request_id, "other").granted
        waiting = fresh.poll(second.request_id, "second")
        assert not waiting.granted and [b.owner for b in waiting.blockers] == ["first"]
        assert fresh.release(first.request_id, "first")
        assert fresh.poll(second.request_id, "second").granted

    def test_waiters_move_on_to_the_next_lease_they_wait_for_together(
            self, store: LeaseStore, request_for: Request) -> None:
        """A release after which several waiters still wait, each now for another lease, rewrites their rows
        in one statement (PostgreSQL once refused it: the CASE of their NULL grant times had no type)."""
        optimize = store.acquire(request_for("optimize", "OPTIMIZE"))
        append = store.acquire(request_for("append", "INSERT"))   # blind, anywhere: no conflict with compaction
        de = store.acquire(request_for("de", "UPDATE", "country = 'DE'"))
        fr = store.acquire(request_for("fr", "UPDATE", "country = 'FR'"))
        assert optimize.granted and append.granted and not (de.granted or fr.granted)
        assert [b.owner for b in de.blockers] == ["optimize", "append"]
        assert store.release(optimize.request_id, "optimize")
        for state, owner in ((de, "de"), (fr, "fr")):
            now = store.poll(state.request_id, owner)
            assert not now.granted and [b.owner for b in now.blockers] == ["append"]
        assert store.release(append.request_id, "append")
        assert store.poll(de.request_id, "de").granted and store.poll(fr.request_id, "fr").granted

    # -- many waiters polled at once (a triggerer's) ----------------------------------------------
    def test_polling_many_answers_each_request_as_its_own_poll_would(
            self, store: LeaseStore, request_for: Request) -> None:
        optimize = store.acquire(request_for("optimize", "OPTIMIZE"))
        waiting = {f"w{i}": request_for(f"w{i}", "UPDATE", f"country = '{('DE', 'FR')[i % 2]}'") for i in range(6)}
        ids = {owner: store.acquire(r).request_id for owner, r in waiting.items()}
        other = store.acquire(request_for("other", "UPDATE", "country = 'IT'", table_key="t2"))
        gone = request_for("gone", "UPDATE", "country = 'IT'", table_key="t3")
        gone_id = store.acquire(gone).request_id
        assert store.release(gone_id, "gone")
        stranger = dataclasses.replace(waiting["w0"], owner="stranger")
        answers = store.poll_many([*((ids[o], r) for o, r in waiting.items()),
                                   (other.request_id, request_for("other", "UPDATE", "country = 'IT'", table_key="t2")),
                                   (gone_id, gone)])
        for owner in waiting:
            alone = store.poll(ids[owner], owner)
            answer = answers[ids[owner]]
            assert isinstance(answer, type(alone)) and answer.status is LeaseStatus.WAITING
            assert [b.owner for b in answer.blockers] == [b.owner for b in alone.blockers]
            assert answer.blockers[0].owner == "optimize"
        assert answers[other.request_id].granted                          # t2 is another table of the pool
        asked_again = answers[gone_id]
        assert not isinstance(asked_again, Exception) and asked_again.granted and asked_again.request_id != gone_id
        assert isinstance(store.poll_many([(ids["w0"], stranger)])[ids["w0"]], LeaseOwnershipError)
        assert optimize.granted

    def test_polling_many_waiters_of_a_pool_reads_it_once(
            self, store: LeaseStore, request_for: Request, monkeypatch: pytest.MonkeyPatch) -> None:
        """Issue #23: a triggerer's waiters each polled the store; one interval's polls are one read per pool."""
        store.acquire(request_for("optimize", "OPTIMIZE"))
        waiting = [request_for(f"w{i}", "UPDATE", f"country = '{('DE', 'FR', 'IT')[i % 3]}'") for i in range(30)]
        waits = [(store.acquire(r).request_id, r) for r in waiting]
        reads = record_calls(monkeypatch, store, "_read")
        answers = store.poll_many(waits)
        assert all(not isinstance(a, Exception) and a.status is LeaseStatus.WAITING for a in answers.values())
        assert reads == [("sales",)]

    def test_polling_many_waiters_walks_the_pool_read_a_few_times_not_once_per_waiter(
            self, store: LeaseStore, request_for: Request, monkeypatch: pytest.MonkeyPatch) -> None:
        """Issue #23: each quiet answer looked its request up, and checked every row for an expiry, by walking
        the whole read: a triggerer's poll of n waiters walked n^2 rows (a thousand waiters kept two
        triggerers at 62% of a core)."""
        store.acquire(request_for("optimize", "OPTIMIZE"))
        waits = [(store.acquire(r).request_id, r) for r in (
            request_for(f"w{i}", "UPDATE", f"country = '{('DE', 'FR', 'IT')[i % 3]}'") for i in range(300))]
        walked = [0]

        class Walked(list):  # type: ignore[type-arg]
            def __iter__(self) -> Any:
                for row in super().__iter__():
                    walked[0] += 1
                    yield row

        read = store._read
        monkeypatch.setattr(store, "_read", lambda pool: (lambda rows, now: (Walked(rows), now))(*read(pool)))
        answers = store.poll_many(waits)
        assert all(not isinstance(a, Exception) and a.status is LeaseStatus.WAITING for a in answers.values())
        assert walked[0] <= 20 * len(waits), walked[0]

    def test_polling_many_waiters_of_shared_partitions_compares_each_with_a_few_earlier_ones(
            self, store: LeaseStore, request_for: Request, monkeypatch: pytest.MonkeyPatch) -> None:
        """Issue #23: the index found every earlier waiter of a request's partitions, compared them all and sorted
        them, though the answer needs only the first that conflicts: 500 waiters on three countries behind an
        OPTIMIZE cost 0.75 s of CPU per batched poll."""
        store.acquire(request_for("optimize", "OPTIMIZE"))
        waits = [(store.acquire(r).request_id, r) for r in (
            request_for(f"w{i}", "UPDATE", f"country = '{('DE', 'FR', 'IT')[i % 3]}'") for i in range(300))]
        met = record_calls(monkeypatch, arbiter, "_meets")
        answers = store.poll_many(waits)
        for i, (request_id, _) in enumerate(waits):   # the lease held, then the request ahead on its country
            answer = answers[request_id]
            assert not isinstance(answer, Exception)
            assert [b.owner for b in answer.blockers] == ["optimize", *([f"w{i - 3}"] if i >= 3 else [])]
        assert len(met) <= 4 * len(waits), len(met)

    def test_a_waiters_own_poll_names_every_held_lease_and_a_batched_poll_the_one_its_request_keeps(
            self, store: LeaseStore, request_for: Request) -> None:
        """Review: a worker that waits for its lease polls one request at a time, and its estimate of the wait
        takes the longest time left of the held leases it is told of; a poll that named only the kept one
        (the earliest held) made that estimate too short, keeping the task in its worker instead of deferring."""
        store.acquire(request_for("de", "UPDATE", "country = 'DE'"))
        store.acquire(request_for("fr", "UPDATE", "country = 'FR'"))
        store.acquire(request_for("first", "OPTIMIZE"))
        behind = request_for("behind", "OPTIMIZE")
        request_id = store.acquire(behind).request_id
        own = store.poll(request_id, "behind")
        assert [b.owner for b in own.blockers] == ["de", "fr", "first"], own.blockers
        batched = store.poll_many([(request_id, behind)])[request_id]
        assert not isinstance(batched, Exception) and [b.owner for b in batched.blockers] == ["de", "first"]

    def test_a_batched_poll_after_a_hand_over_judges_the_new_first_in_line_only(
            self, store: LeaseStore, request_for: Request, reopen: Callable[[LeaseStore], LeaseStore],
            judged: list[tuple[Any, ...]]) -> None:
        """Issue #23: a triggerer answers all its waiters each time the pool moves. With a line of waiters that
        all conflict, each answer named the holder and the first request in line, both new at every hand-over,
        so every poll after one judged a new pair per waiter (a thousand, in each triggerer). The answers now
        name the pairs that stay: the held lease the release's decision remembered, and the request directly ahead."""
        holder = store.acquire(request_for("holder", "UPDATE", "country = 'DE'"))
        waits = [(store.acquire(r).request_id, r) for r in (
            request_for(f"w{i}", "UPDATE", f"country = 'DE' AND id > {i}") for i in range(60))]
        store.poll_many(waits)   # the triggerer has answered its waiters once
        judge = store.judge
        reopen(store).release(holder.request_id, "holder")   # by the holder's own process: w0 is granted
        store.judge = judge   # (the memory store's reopen replaces the judge of the one store it has)
        judged.clear()
        answers = store.poll_many(waits)
        assert len(judged) <= 2, f"only the new first in line is judged: {len(judged)} pairs"
        assert answers[waits[0][0]].granted   # type: ignore[union-attr]
        for i, (request_id, _) in enumerate(waits[1:], start=1):
            answer = answers[request_id]
            assert not isinstance(answer, Exception)
            assert [b.owner for b in answer.blockers] == ["w0", *([f"w{i - 1}"] if i >= 2 else [])], answer

    def test_renewing_many_waiters_at_once_walks_the_pool_a_few_times_not_once_per_waiter(
            self, clocked_store: LeaseStore, clock: Clock, request_for: Request,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """Issue #23: the transaction that renews a batch of waiters found each by walking the pool's rows."""
        store, ttl = clocked_store, 60.0
        store.acquire(request_for("optimize", "OPTIMIZE", ttl=600.0))
        waits = [(store.acquire(r).request_id, r) for r in (
            request_for(f"w{i}", "UPDATE", f"country = '{('DE', 'FR', 'IT')[i % 3]}'", ttl=ttl) for i in range(300))]
        clock.now += ttl / 2   # every waiter's heartbeat is due: all are renewed in one transaction
        walks = [0]
        poll_due = store._poll_due

        class Counted:
            def __init__(self, txn: Any) -> None:
                self._txn = txn

            def __getattr__(self, name: str) -> Any:
                return getattr(self._txn, name)

            def rows(self) -> Any:
                walks[0] += 1
                return self._txn.rows()

        monkeypatch.setattr(store, "_poll_due", lambda txn, pending: poll_due(Counted(txn), pending))
        answers = store.poll_many(waits)
        assert all(not isinstance(a, Exception) and a.record is not None and a.record.expires_at == _at(clock.now + ttl)
                   for a in answers.values())
        assert walks[0] <= 10, walks[0]

    def test_polling_many_waiters_explains_each_without_comparing_it_to_every_earlier_one(
            self, store: LeaseStore, request_for: Request, monkeypatch: pytest.MonkeyPatch) -> None:
        """Review: each answer of a batched poll was explained by scanning every earlier waiter (n^2/2 per poll)."""
        store.acquire(request_for("optimize", "OPTIMIZE"))
        day = datetime.date(2024, 3, 1)
        waits = [(store.acquire(r).request_id, r) for r in (
            request_for(f"w{i}", "UPDATE", f"date = '{day + datetime.timedelta(days=i)}' AND country = 'DE'")
            for i in range(120))]
        met = record_calls(monkeypatch, arbiter, "_meets")
        answers = store.poll_many(waits)
        assert all(not isinstance(a, Exception) and [b.owner for b in a.blockers] == ["optimize"]
                   for a in answers.values())
        assert len(met) <= 4 * len(waits), "about one partition lookup per answer, not one per earlier waiter"

    def test_a_batched_poll_that_writes_renews_every_waiter_it_polled_so_their_heartbeats_fall_due_together(
            self, clocked_store: LeaseStore, clock: Clock, request_for: Request,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """Issue #23: waiters that arrived at different times had their heartbeats fall due one by one, so with
        a thousand waiters some write was due on nearly every poll, and every write made all watchers read again."""
        store, ttl, t0 = clocked_store, 60.0, clock.now
        store.acquire(request_for("holder", "UPDATE", "country = 'DE'", ttl=ttl))
        waits = []
        for i in range(6):   # one arrives every 5 s
            clock.now = t0 + 5.0 * i
            r = request_for(f"w{i}", "DELETE", f"country = 'DE' AND id = {i}", ttl=ttl)
            waits.append((store.acquire(r).request_id, r))
        clock.now = t0 + ttl / 3 + 1.0   # only w0's heartbeat (and w1's) is due
        locks = record_calls(monkeypatch, store, "_transact")
        answers = store.poll_many(waits)
        assert len(locks) == 1
        expiries = [a.record.expires_at for a in answers.values() if not isinstance(a, Exception) and a.record]
        assert expiries == [_at(clock.now + ttl)] * 6, "every polled waiter renewed with the one write"
        stored = [r.expires_at for r in store.records(pool="sales") if r.owner != "holder"]
        assert stored == [_at(clock.now + ttl)] * 6
        clock.now += ttl / 3 - 1.0   # before the next third of the TTL: nothing is due, nothing is written
        locks.clear()
        store.poll_many(waits)
        assert locks == []

    def test_polling_many_renews_every_due_waiter_in_one_transaction(
            self, clocked_store: LeaseStore, clock: Clock, request_for: Request,
            monkeypatch: pytest.MonkeyPatch) -> None:
        store, ttl, t0 = clocked_store, 60.0, clock.now
        holder = store.acquire(request_for("holder", "UPDATE", "country = 'DE'", ttl=ttl))
        waiting = [request_for(f"w{i}", "DELETE", f"country = 'DE' AND id = {i}", ttl=ttl) for i in range(8)]
        waits = [(store.acquire(r).request_id, r) for r in waiting]
        locks = record_calls(monkeypatch, store, "_transact")
        clock.now = t0 + 0.5 * ttl   # past a third of the TTL: every waiter's heartbeat is due
        answers = store.poll_many(waits)
        assert [pool for pool, _body in locks] == ["sales"]
        assert all(not isinstance(a, Exception) and a.record is not None and a.record.expires_at == _at(clock.now + ttl)
                   for a in answers.values())
        clock.now = t0 + 1.2 * ttl   # the holder stopped renewing and expired; the waiters live on that poll
        again = store.poll_many(waits)
        assert [a.request_id for a in again.values() if not isinstance(a, Exception)] == [i for i, _ in waits]
        assert [a.granted for a in again.values() if not isinstance(a, Exception)] == [True] + [False] * 7
        assert ("holder", AuditKind.EXPIRE) in [(e.owner, e.kind) for e in store.history()]
        assert holder.granted

    def test_a_poll_by_anybody_else_changes_nothing_even_when_something_is_due(
            self, clocked_store: LeaseStore, clock: Clock, request_for: Request) -> None:
        """Review: a stranger's poll that took the lock (an expiry was due) committed the expiry and a grant."""
        store = clocked_store
        store.acquire(request_for("holder", "OPTIMIZE", ttl=10.0))
        waiter = store.acquire(request_for("waiter", "UPDATE", "country = 'DE'", ttl=60.0))
        clock.now += 11.0     # the holder stopped its heartbeat: it expires at the next operation on the pool
        before, history = store.revision("sales"), store.history()
        with pytest.raises(LeaseOwnershipError):
            store.poll(waiter.request_id, "stranger")
        assert isinstance(store.poll_many([(waiter.request_id, dataclasses.replace(
            request_for("waiter", "UPDATE", "country = 'DE'"), owner="stranger"))])[waiter.request_id],
            LeaseOwnershipError)
        assert store.revision("sales") == before and store.history() == history
        assert [r.owner for r in store.holders()] == ["holder"]

    def test_polling_many_finds_a_request_its_pool_does_not_hold_as_its_own_poll_would(
            self, store: LeaseStore, request_for: Request) -> None:
        """Review: a request passed with another pool's name was taken for gone and asked for again there."""
        store.acquire(request_for("holder", "OPTIMIZE"))
        mine = request_for("w", "UPDATE", "country = 'DE'")
        request_id = store.acquire(mine).request_id
        elsewhere = dataclasses.replace(mine, pool="other")
        answer = store.poll_many([(request_id, elsewhere)])[request_id]
        assert not isinstance(answer, Exception) and answer.request_id == request_id and not answer.granted
        stranger = dataclasses.replace(elsewhere, owner="stranger")
        assert isinstance(store.poll_many([(request_id, stranger)])[request_id], LeaseOwnershipError)
        assert [r.owner for r in store.records()] == ["holder", "w"]

    def test_polling_many_looks_up_no_request_by_id(
            self, store: LeaseStore, request_for: Request, reopen: Callable[[LeaseStore], LeaseStore],
            monkeypatch: pytest.MonkeyPatch) -> None:
        """Review: a triggerer's store knew no request's pool, and looked each one up with a query of its own."""
        store.acquire(request_for("optimize", "OPTIMIZE"))
        waits = [(store.acquire(r).request_id, r) for r in
                 (request_for(f"w{i}", "UPDATE", f"country = '{('DE', 'FR')[i % 2]}'") for i in range(10))]
        fresh = reopen(store)
        looked_up: list[str] = []
        monkeypatch.setattr(fresh, "_locate", lambda request_id: looked_up.append(request_id))
        answers = fresh.poll_many(waits)
        assert looked_up == [] and all(not isinstance(a, Exception) and not a.granted for a in answers.values())

    # -- 2: writer limit --------------------------------------------------------------------------
    def test_the_writer_limit_counts_every_table_of_the_pool(self, store: LeaseStore, request_for: Request) -> None:
        a = store.acquire(request_for("a", "UPDATE", "country = 'DE'", max_writers=2))
        b = store.acquire(request_for("b", "UPDATE", "country = 'FR'", max_writers=2, table_key="t2"))
        c = store.acquire(request_for("c", "UPDATE", "country = 'IT'", max_writers=2))
        assert a.granted and b.granted and c.status is LeaseStatus.WAITING
        assert c.blockers[0].request_id is None and "writer limit of 2" in c.blockers[0].reason
        store.release(b.request_id, "b")
        assert store.poll(c.request_id, "c").granted

    # -- 7: one request per owner and table -------------------------------------------------------
    def test_acquiring_again_returns_the_same_request_and_a_replan_keeps_its_place(
            self, store: LeaseStore, request_for: Request) -> None:
        holder = store.acquire(request_for("holder", "UPDATE", "country = 'DE'"))
        waiter = store.acquire(request_for("waiter", "UPDATE", "country = 'DE'"))
        later = store.acquire(request_for("later", "DELETE", "country = 'DE'"))
        again = store.acquire(request_for("waiter", "UPDATE", "country = 'DE' AND date = '2024-01-01'"))
        assert again.request_id == waiter.request_id and again.record is not None and waiter.record is not None
        assert again.record.seq == waiter.record.seq < later.record.seq  # type: ignore[union-attr]
        assert "REPLAN" in {e.kind.name for e in store.history(table="t")}
        assert store.acquire(request_for("holder", "OPTIMIZE")).request_id == holder.request_id
        store.release(holder.request_id, "holder")
        assert store.poll(waiter.request_id, "waiter").granted  # still first in line after re-planning

    def test_a_replan_keeps_the_terms_it_asked_with(self, clocked_store: LeaseStore, clock: Clock,
                                                     request_for: Request) -> None:
        """Review: a re-plan stored the new footprint but kept the first request's TTL (and model and writer
        limit) in the columns heartbeats and expiry read, so a poll renewed the waiter by the old TTL."""
        store, t0 = clocked_store, clock.now
        store.acquire(request_for("holder", "UPDATE", "country = 'DE'", ttl=600.0))
        store.acquire(request_for("waiter", "UPDATE", "country = 'DE'", ttl=60.0))
        again = store.acquire(request_for("waiter", "UPDATE", "country = 'DE' AND date = '2024-01-01'", ttl=300.0))
        assert again.record is not None and again.record.expires_at == _at(t0 + 300.0)
        clock.now = t0 + 150.0   # past a third of the new TTL: the poll is its heartbeat
        state = store.poll(again.request_id, "waiter")
        assert state.record is not None and state.record.expires_at == _at(clock.now + 300.0)

    # -- 6: ownership, idempotent release ---------------------------------------------------------
    def test_only_the_owner_can_renew_poll_or_release(self, store: LeaseStore, request_for: Request) -> None:
        mine = store.acquire(request_for("try-1", "UPDATE", "country = 'DE'"))
        with pytest.raises(LeaseOwnershipError, match="belongs to 'try-1'"):
            store.release(mine.request_id, "try-2")
        with pytest.raises(LeaseOwnershipError):
            store.renew(mine.request_id, "try-2")
        with pytest.raises(LeaseOwnershipError):
            store.poll(mine.request_id, "try-2")
        assert [r.owner for r in store.holders()] == ["try-1"]
        assert store.release(mine.request_id, "try-1") is True
        assert store.release(mine.request_id, "try-1") is False
        assert store.poll(mine.request_id, "try-1").status is LeaseStatus.GONE
        with pytest.raises(LeaseLostError, match="gone"):
            store.renew(mine.request_id, "try-1")

    def test_a_waiting_request_cannot_be_renewed_and_cancelling_it_is_recorded(
            self, store: LeaseStore, request_for: Request) -> None:
        store.acquire(request_for("holder", "OPTIMIZE"))
        waiter = store.acquire(request_for("waiter", "OPTIMIZE"))
        with pytest.raises(LeaseLostError, match="still waiting"):
            store.renew(waiter.request_id, "waiter")
        assert store.release(waiter.request_id, "waiter")
        assert store.waiters() == []
        assert store.history()[-1].kind is AuditKind.CANCEL

    # -- 5: expiry --------------------------------------------------------------------------------
    def test_a_holder_that_stops_renewing_loses_its_lease_and_the_waiter_gets_it(
            self, store: LeaseStore, request_for: Request) -> None:
        dead = store.acquire(request_for("dead", "UPDATE", "country = 'DE'", ttl=0.5))
        waiter = store.acquire(request_for("waiter", "UPDATE", "country = 'DE'", ttl=30))
        assert dead.granted and not waiter.granted and dead.record is not None
        _wait_until(lambda: store.poll(waiter.request_id, "waiter").granted)
        kinds = [(e.owner, e.kind) for e in store.history()]
        assert ("dead", AuditKind.EXPIRE) in kinds
        # on the store's clock, not before the dead holder's deadline (its grant plus its TTL)
        expired = next(e for e in store.history() if e.owner == "dead" and e.kind is AuditKind.EXPIRE)
        granted = next(e for e in store.history() if e.owner == "waiter" and e.kind is AuditKind.GRANT)
        assert expired.at >= dead.record.expires_at - 1e-3 and granted.at >= expired.at
        with pytest.raises(LeaseLostError):
            store.renew(dead.request_id, "dead")
        assert store.release(dead.request_id, "dead") is False

    def test_renewing_keeps_the_lease_past_its_ttl(
            self, clocked_store: LeaseStore, clock: Clock, request_for: Request) -> None:
        """A holder renewing every heartbeat keeps its lease for three TTLs; once it stops, the lease ends one TTL
        after its last renewal. (On the injected clock: with real time a slow machine that delays one renewal
        past the TTL would take the lease away, as it should.)"""
        store, ttl, t0 = clocked_store, 60.0, clock.now
        held = store.acquire(request_for("held", "UPDATE", "country = 'DE'", ttl=ttl))
        waiter = store.acquire(request_for("waiter", "UPDATE", "country = 'DE'", ttl=10 * ttl))  # outlives the test
        assert held.granted and waiter.status is LeaseStatus.WAITING
        for step in range(1, 10):   # a heartbeat every third of the TTL, for three TTLs
            clock.now = t0 + step * ttl / 3
            record = store.renew(held.request_id, "held")
            assert record.status is LeaseStatus.GRANTED and record.expires_at == _at(clock.now + ttl)
            assert store.poll(waiter.request_id, "waiter").status is LeaseStatus.WAITING
        last = clock.now
        assert sum(e.kind is AuditKind.RENEW for e in store.history()) == 9
        clock.now = last + ttl - 0.01
        assert store.poll(waiter.request_id, "waiter").status is LeaseStatus.WAITING
        clock.now = last + ttl
        assert store.poll(waiter.request_id, "waiter").granted
        assert ("held", AuditKind.EXPIRE) in [(e.owner, e.kind) for e in store.history()]

    def test_a_waiter_that_stops_polling_is_abandoned_and_blocks_nobody(
            self, store: LeaseStore, request_for: Request) -> None:
        holder = store.acquire(request_for("holder", "UPDATE", "country = 'DE'"))
        gone = store.acquire(request_for("gone", "OPTIMIZE", ttl=0.4))
        fr = store.acquire(request_for("fr", "UPDATE", "country = 'FR'"))
        assert holder.granted and not fr.granted and gone.record is not None  # behind the compaction
        _wait_until(lambda: store.poll(fr.request_id, "fr").granted)
        assert ("gone", AuditKind.ABANDON) in [(e.owner, e.kind) for e in store.history()]
        # on the store's clock, not before the waiter's deadline (its request plus its TTL)
        abandoned = next(e for e in store.history() if e.owner == "gone" and e.kind is AuditKind.ABANDON)
        assert abandoned.at >= gone.record.expires_at - 1e-3
        assert store.poll(gone.request_id, "gone").status is LeaseStatus.GONE

    def test_a_waiter_that_polls_after_its_ttl_finds_its_request_gone(
            self, store: LeaseStore, request_for: Request) -> None:
        store.acquire(request_for("holder", "OPTIMIZE"))
        late = store.acquire(request_for("late", "OPTIMIZE", ttl=0.3))
        time.sleep(0.5)
        assert store.poll(late.request_id, "late").status is LeaseStatus.GONE
        again = store.acquire(request_for("late", "OPTIMIZE", ttl=0.3))
        assert again.request_id != late.request_id and again.status is LeaseStatus.WAITING

    def test_asking_again_while_waiting_is_a_heartbeat(
            self, clocked_store: LeaseStore, clock: Clock, request_for: Request) -> None:
        """Asking again every 0.4 TTL keeps a waiting request for 1.6 TTL, in its place; once it stops, it is
        abandoned one TTL after the last ask. (On the injected clock, as a slow machine could delay an ask.)"""
        store, ttl, t0 = clocked_store, 60.0, clock.now
        store.acquire(request_for("holder", "OPTIMIZE", ttl=10 * ttl))
        first = store.acquire(request_for("waiter", "OPTIMIZE", ttl=ttl))
        assert first.status is LeaseStatus.WAITING
        for step in range(1, 5):
            clock.now = t0 + step * 0.4 * ttl
            again = store.acquire(request_for("waiter", "OPTIMIZE", ttl=ttl))
            assert again.request_id == first.request_id and again.status is LeaseStatus.WAITING
        assert AuditKind.REPLAN not in {e.kind for e in store.history()}
        clock.now = t0 + 1.6 * ttl + ttl
        assert store.poll(first.request_id, "waiter").status is LeaseStatus.GONE
        assert ("waiter", AuditKind.ABANDON) in [(e.owner, e.kind) for e in store.history()]

    # -- 5: expiry on an injected clock: only the owner's heartbeat moves its deadline ------------
    def test_a_dead_waiter_granted_by_a_release_expires_one_ttl_after_its_last_heartbeat(
            self, clocked_store: LeaseStore, clock: Clock, request_for: Request) -> None:
        """A waiter that died just before the release that granted it blocks conflicting writers for its
        TTL from its last heartbeat (what the docs promise), not for a fresh TTL from the grant."""
        store, ttl, t0 = clocked_store, 60.0, clock.now
        holder = store.acquire(request_for("holder", "UPDATE", "country = 'DE'", ttl=ttl))
        dead = store.acquire(request_for("dead", "UPDATE", "country = 'DE'", ttl=ttl))  # its last heartbeat
        assert holder.granted and dead.status is LeaseStatus.WAITING
        clock.now = t0 + 0.9 * ttl
        assert store.release(holder.request_id, "holder")
        [granted] = store.holders()
        assert granted.owner == "dead" and granted.expires_at == _at(t0 + ttl)
        clock.now = t0 + ttl + 0.01
        assert store.acquire(request_for("next", "DELETE", "country = 'DE'", ttl=ttl)).granted
        assert ("dead", AuditKind.EXPIRE) in [(e.owner, e.kind) for e in store.history()]
        with pytest.raises(LeaseLostError):
            store.renew(dead.request_id, "dead")

    def test_a_live_waiter_keeps_the_lease_a_release_granted_it(
            self, clocked_store: LeaseStore, clock: Clock, request_for: Request) -> None:
        """What a waiting task does (poll every third of the TTL; once granted, renew every heartbeat)
        keeps the lease: the poll that tells it of the grant is its owner's heartbeat and renews it."""
        store, ttl, t0 = clocked_store, 60.0, clock.now
        holder = store.acquire(request_for("holder", "UPDATE", "country = 'DE'", ttl=ttl))
        waiter = store.acquire(request_for("waiter", "UPDATE", "country = 'DE'", ttl=ttl))
        clock.now = t0 + 0.3 * ttl
        assert store.poll(waiter.request_id, "waiter").status is LeaseStatus.WAITING
        clock.now = t0 + 0.6 * ttl   # due: the poll refreshes the waiter's deadline to t0 + 1.6 TTL
        assert store.poll(waiter.request_id, "waiter").status is LeaseStatus.WAITING
        clock.now = t0 + 0.9 * ttl
        assert store.renew(holder.request_id, "holder").expires_at == _at(t0 + 1.9 * ttl)
        clock.now = t0 + 1.55 * ttl  # the release grants the waiter just before its heartbeat
        assert store.release(holder.request_id, "holder")
        assert [(r.owner, r.expires_at) for r in store.holders()] == [("waiter", _at(t0 + 1.6 * ttl))]
        clock.now = t0 + 1.58 * ttl  # its next poll sees the grant, and is its heartbeat
        seen = store.poll(waiter.request_id, "waiter")
        assert seen.granted and seen.record is not None and seen.record.expires_at == _at(t0 + 2.58 * ttl)
        other = store.acquire(request_for("other", "DELETE", "country = 'DE'", ttl=ttl))
        for step in range(1, 10):    # then it renews every heartbeat (a third of the TTL at most)
            clock.now = t0 + (1.58 + step / 3) * ttl
            assert store.renew(waiter.request_id, "waiter").expires_at == _at(clock.now + ttl)
            assert store.poll(other.request_id, "other").status is LeaseStatus.WAITING
        assert [r.owner for r in store.holders()] == ["waiter"]

    def test_hostile_owner_and_table_text_is_stored_as_data(self, store: LeaseStore, request_for: Request) -> None:
        owner = "x'); DROP TABLE delta_occ_leases; --\n\u00e9\"`"
        table = "s3://lake/t'; DELETE FROM delta_occ_lease_audit; --"
        held = store.acquire(request_for(owner, "UPDATE", "country = 'DE'", table_key=table))
        other = store.acquire(request_for("other", "UPDATE", "country = 'DE'", table_key=table))
        assert held.granted and not other.granted
        assert [r.owner for r in store.holders(table=table)] == [owner]
        assert store.release(held.request_id, owner)
        assert store.poll(other.request_id, "other").granted
        assert [e.owner for e in store.history(table=table)][:2] == [owner, owner]

    # -- 8: audit ---------------------------------------------------------------------------------
    def test_the_audit_records_every_step_with_owner_table_and_summary(
            self, store: LeaseStore, request_for: Request) -> None:
        a = store.acquire(request_for("a", "UPDATE", "country = 'DE'"))
        store.renew(a.request_id, "a")
        store.release(a.request_id, "a")
        store.acquire(request_for("b", "OPTIMIZE", table_key="other"))
        events = store.history(table="t")
        assert [e.kind for e in events] == [AuditKind.REQUEST, AuditKind.GRANT, AuditKind.RENEW, AuditKind.RELEASE]
        assert all(e.owner == "a" and e.table == "t" and e.pool == "sales" for e in events)
        assert "UPDATE 'a' planned at version 1" in events[0].summary and "country=DE" in events[0].summary
        assert LeaseRequest.from_json(__import__("json").loads(events[0].detail)).owner == "a"
        assert events[1].at >= events[0].at and events[1].detail.startswith("waited ")
        assert [e.owner for e in store.history(limit=2)] == ["a", "b"][-2:] or len(store.history(limit=2)) == 2
        assert len(store.history(limit=2)) == 2 and store.history(limit=2)[-1].owner == "b"
        assert [r.owner for r in store.records(table="other")] == ["b"]

    def test_states_have_json_forms(self, store: LeaseStore, request_for: Request) -> None:
        store.acquire(request_for("a", "OPTIMIZE"))
        waiting = store.acquire(request_for("b", "OPTIMIZE"))
        doc = waiting.to_json()
        assert doc["status"] == "waiting" and doc["record"]["owner"] == "b" and doc["blockers"][0]["owner"] == "a"
        assert waiting.waited is not None and waiting.waited >= 0
