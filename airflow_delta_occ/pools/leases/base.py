"""The lease store contract, and the one algorithm every store runs inside its pool lock.

Invariants every ``LeaseStore`` keeps (``tests/unit/pools/contract.py`` checks each one against every
store: memory, SQLite, PostgreSQL):

1. **No conflicting holders.** Two leases held at the same time on one table never can conflict
   (``compare.lease_verdict`` under the pool's model, either commit order).
2. **Writer limit.** A pool never has more held leases than its ``max_writers``.
3. **Atomic decisions.** Every operation that can change who holds what (acquire, poll, release,
   renew, expiry) decides on one consistent read of its pool's rows, and its changes land only if
   those rows are still the pool's rows when they are written (``LeaseStore._transact``): under the
   pool's lock (the database write lock on SQLite, a mutex in memory), or on PostgreSQL optimistically,
   with one statement that writes only if the pool's revision is still the one read (and otherwise
   decides again under the pool's row lock). No decision lands on rows that have moved.
4. **Fairness.** Waiting requests are judged in arrival order (``arbiter.decide``): a request is
   not overtaken by a later one it conflicts with, except by one expected to end before it could
   start anyway (the arbiter's rule 2a, bounded); one that conflicts with nobody is granted at once.
5. **Expiry.** A lease or a waiting request whose heartbeat (``renew`` / ``poll``) stopped for its
   TTL is gone at the next operation on its pool, and recorded as expired or abandoned. Only the
   owner's own calls move its deadline: a grant keeps the waiter's (a waiter that died just before
   the release that granted it blocks the others for one TTL from its last heartbeat, not two).
6. **Ownership.** Only the owner (one task try) can renew, poll or release a request; anybody else
   gets ``LeaseOwnershipError`` and changes nothing. Release is idempotent: releasing what is gone
   returns ``False``.
7. **One request per owner and table.** Acquiring again returns the owner's existing request;
   a waiting request takes the new footprint (re-planned after the table moved) and keeps its place.
8. **Audit.** Every request, re-plan, grant, renewal, release, cancel, expiry and abandonment is
   recorded with the store's time, owner, table and the footprint's summary; a request's and a
   re-plan's detail is the request's JSON, so any two grants can be re-judged from the audit alone.

Time is the store's clock (the database's, for SQL stores), so hosts with skewed clocks agree on
expiry.
"""

from __future__ import annotations

import functools
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from airflow_delta_occ.exceptions import LeaseError, LeaseLostError, LeaseOwnershipError

from ..arbiter import Candidate, Decision, Explainer, Remembered, decide
from ..compare import PairJudge
from ..requests import AuditEvent, AuditKind, Blocker, LeaseRecord, LeaseRequest, LeaseState, LeaseStatus

_R = TypeVar("_R")


class _Refused(Exception):
    """A locked poll that owns nothing it polled: raised to roll its transaction back."""


PREWARM_ROWS = 64   # a release in a pool this big judges what it will need before it takes the lock


@dataclass(frozen=True)
class Row:
    """One live request as stored: the record, the request's terms, and the request itself (loaded on demand).

    ``model``, ``max_writers`` and ``ttl`` are kept beside the request so that expiring, heartbeats and
    the writer limit never decode a footprint; ``load`` decodes it when it must be judged.
    """

    record: LeaseRecord
    load: Callable[[], LeaseRequest] = field(compare=False, repr=False)
    model: str
    max_writers: int | None
    ttl: float
    revision: int = 0       # bumped when a waiter re-plans; part of the judge's memo key
    remembered: Remembered | None = None   # a waiter's held blocker at the last decision (``arbiter.Remembered``)

    @classmethod
    def of(cls, record: LeaseRecord, request: LeaseRequest, revision: int = 0) -> Row:
        return cls(record, lambda: request, request.model, request.max_writers, request.ttl, revision)

    @property
    def key(self) -> tuple[str, int]:
        """The arbiter's key for the request: it changes whenever the footprint does."""
        return (self.record.request_id, self.revision)

    @functools.cached_property
    def request(self) -> LeaseRequest:
        return self.load()

    @property
    def request_id(self) -> str:
        return self.record.request_id


class PoolTransaction(Protocol):
    """The storage primitives, valid only inside a body run by ``LeaseStore._transact``."""

    now: float

    def rows(self) -> list[Row]:
        """Every live request of the pool, in arrival order."""

    def next_seq(self) -> int:
        """The pool's next arrival number."""

    def insert(self, row: Row) -> None: ...

    def update(self, row: Row) -> None:
        """Replace the row with this ``request_id``."""

    def delete(self, request_id: str) -> None: ...

    def audit(self, event: AuditEvent) -> None: ...

    def about(self, table: str | None) -> None:
        """The answer depends on ``table``'s requests (``None``: on a request this read did not find, so on a
        table unknown). A store whose write may land on a pool that moved on other tables (PostgreSQL) then
        lands it only if ``table`` did not move either: an answer is never given from an old view of its table,
        even when the write changes nothing there."""


class LeaseStore(ABC):
    """Grants leases on footprints; see the module docstring for the invariants."""

    def __init__(self, *, judge: PairJudge | None = None) -> None:
        self.judge = judge or PairJudge()
        self._pool_of: dict[str, str] = {}   # this process's requests: their pool never changes
        # and their table, also of requests found by ``_locate`` (a hint for ``_transact``: it never changes either)
        self._table_of: dict[str, str] = {}
        self._pool_sizes: dict[str, int] = {}   # live requests per pool, as this process last saw them

    def _pool(self, request_id: str) -> str | None:
        return self._pool_of.get(request_id) or self._locate(request_id)

    # -- storage, per store ----------------------------------------------------------------------
    @abstractmethod
    def _locked(self, pool: str) -> AbstractContextManager[PoolTransaction]:
        """One transaction holding ``pool``'s lock; commits on normal exit, rolls back on an exception."""

    def _transact(self, pool: str, body: Callable[[PoolTransaction], _R], *, table: str | None = None) -> _R:
        """``body`` on ``pool``'s rows, its changes landing atomically on exactly the rows it read.

        Here under the pool's lock, once. A store may instead run ``body`` optimistically, more than once,
        each time on fresher rows, and keep the one run whose rows were still current when its changes
        were written (``SqlLeaseStore`` on PostgreSQL). So a body has no effects outside ``txn`` and raises
        only for what its rows show (an exception discards its changes, like a rollback). ``table``: the
        table the operation is about, when known before the read (a store may queue the operations of one
        table; it is a hint, never what decides).
        """
        with self._locked(pool) as txn:
            return body(txn)

    @abstractmethod
    def _read(self, pool: str) -> tuple[list[Row], float]:
        """The pool's rows in arrival order and the store's clock, read without the lock (a consistent read)."""

    @abstractmethod
    def _locate(self, request_id: str) -> str | None:
        """The pool of a live request (read without the lock; re-checked under it)."""

    @abstractmethod
    def records(self, *, pool: str | None = None, table: str | None = None) -> list[LeaseRecord]:
        """Live requests (held and waiting) in arrival order, optionally of one pool or table."""

    @abstractmethod
    def history(self, *, pool: str | None = None, table: str | None = None, limit: int = 100,
                kinds: Collection[AuditKind] | None = None) -> list[AuditEvent]:
        """The newest ``limit`` audit events (of ``kinds``, when given), oldest first."""

    @abstractmethod
    def revision(self, pool: str) -> int:
        """A number that changes whenever anything in ``pool`` changes (every locked operation moves it).

        The cheapest read a store has (one row by its key): a waiter checks it often and polls for its
        state only when it moved, so a release reaches the waiters it grants within one check.
        """

    def close(self) -> None:  # noqa: B027 - a store without connections has nothing to release
        """Release connections; the store is unusable afterwards."""

    # -- the contract ----------------------------------------------------------------------------
    def acquire(self, request: LeaseRequest) -> LeaseState:
        """Queue ``request`` (or find the owner's existing one for the table) and grant it if the rule allows."""
        request.check()
        at_once = self._acquire_at_once(request)
        if at_once is not None:
            self._remember_request(at_once.request_id, request)
            return at_once

        def body(txn: PoolTransaction) -> tuple[LeaseState, list[Row]]:
            txn.about(request.table)
            live = self._expire(txn)   # an expired request of this owner is gone: it asks anew
            mine = next((r for r in live if r.record.table == request.table and r.record.owner == request.owner), None)
            if mine is None:
                record = LeaseRecord(request_id=uuid.uuid4().hex, pool=request.pool, table=request.table,
                                     owner=request.owner, seq=txn.next_seq(), status=LeaseStatus.WAITING,
                                     summary=request.summary, requested_at=txn.now, granted_at=None,
                                     expires_at=txn.now + request.ttl)
                txn.insert(Row.of(record, request))
                self._audit(txn, record, AuditKind.REQUEST, request_detail(request))
                request_id = record.request_id
            else:
                request_id = mine.request_id
                if mine.record.status is LeaseStatus.WAITING:  # asking again is a heartbeat, maybe a re-plan
                    replanned = mine.request != request   # decoded only for a request that asks again
                    record = replace(mine.record, summary=request.summary if replanned else mine.record.summary,
                                     expires_at=txn.now + request.ttl)
                    txn.update(Row.of(record, request, mine.revision + 1) if replanned
                               else replace(mine, record=record))
                    if replanned:
                        self._audit(txn, record, AuditKind.REPLAN, request_detail(request))
            return self._settle(txn, request_id)

        state, rows = self._transact(request.pool, body, table=request.table)
        self._remember_request(state.request_id, request)
        self._pool_sizes[request.pool] = len(rows)
        return self._explained(state, rows)

    def _remember_request(self, request_id: str, request: LeaseRequest) -> None:
        if len(self._pool_of) > 10_000:
            self._pool_of.clear()
            self._table_of.clear()
        self._pool_of[request_id] = request.pool
        self._table_of[request_id] = request.table

    def _acquire_at_once(self, request: LeaseRequest) -> LeaseState | None:
        """A store's shortcut for an acquire it can decide in one step without reading the pool (PostgreSQL:
        ``pg_at_once``): the granted state, or ``None`` to decide the usual way. Only a grant the rule would make
        on the pool as it is may be answered here."""
        return None

    def _release_at_once(self, pool: str, table: str | None, request_id: str, owner: str, note: str) -> bool | None:
        """A store's shortcut for a release that hands nothing over (PostgreSQL: ``pg_at_once``): ``True`` when it
        released the request, ``None`` to decide the usual way (which also tells a request gone or not owned).
        ``table``: the request's, when this process knows it."""
        return None

    def poll(self, request_id: str, owner: str) -> LeaseState:
        """The request's state now, and its owner's heartbeat. ``GONE`` when it expired or was released.

        A granted lease keeps the deadline its owner's last heartbeat gave it, so the poll that tells a
        waiter of its grant renews the lease when a third of its TTL has passed: the task then has the
        time it had before the grant to start renewing it (after a trigger's hand-over, say).

        Most polls change nothing (the waiter still waits, its heartbeat is fresh), so a poll first reads
        without the lock and answers from that read; it takes the lock only when something is due: a
        heartbeat older than a third of the TTL, an expiry, or a grant the rule would now make. Nothing
        is decided on the unlocked read: it only spares the pool's lock from the waiters' polling.

        Raises:
            LeaseOwnershipError: ``owner`` does not own the request.
        """
        pool = self._pool(request_id)
        if pool is None:
            return LeaseState(request_id, LeaseStatus.GONE, checked_at=0.0)
        answer = self._poll_pool(pool, [(request_id, owner)])[request_id]
        if isinstance(answer, LeaseOwnershipError):
            raise answer
        return answer

    def poll_or_ask_again(self, request_id: str, request: LeaseRequest) -> LeaseState:
        """One step of a wait: ``poll``; a request that is gone (released, or abandoned while nobody polled
        it) is asked for again with ``request`` (the answer's ``request_id`` then differs).

        Raises:
            LeaseOwnershipError: ``request.owner`` does not own ``request_id``.
        """
        state = self.poll(request_id, request.owner)
        if state.status is LeaseStatus.GONE:
            return self.acquire(request)
        return state

    def poll_many(self, waits: Sequence[tuple[str, LeaseRequest]]) -> dict[str, LeaseState | LeaseError]:
        """``poll_or_ask_again`` for many waiting requests at once (a triggerer's deferred waiters).

        One unlocked read per pool answers every request with nothing due, and one transaction per pool
        renews and settles the others, so a thousand waiters of one pool cost about one query per poll
        interval, not a thousand. Each request gets its own answer: its state, or the error its own poll
        would have raised (``LeaseOwnershipError``; ``LeaseStoreError`` for every request of a pool the
        store failed on). Requests that are gone are asked for again, one by one. One difference in the
        explanation: a request queued behind another names the held lease the last decision kept with it, not
        every held lease it conflicts with (``arbiter.Explainer``, ``every_held_lease``), so that a lease
        passed down a long line costs one new comparison per poll, not one per waiter.
        """
        answers: dict[str, LeaseState | LeaseError] = {}
        by_pool: dict[str, list[tuple[str, str]]] = {}
        for request_id, request in waits:   # a request's pool is its own (no lookup per request id)
            by_pool.setdefault(request.pool, []).append((request_id, request.owner))
        for pool, items in by_pool.items():
            try:
                answers.update(self._poll_pool(pool, items, every_held_lease=False))
            except LeaseError as exc:
                answers.update({request_id: exc for request_id, _ in items})
        for request_id, request in waits:
            answer = answers.get(request_id)
            if isinstance(answer, LeaseState) and answer.status is LeaseStatus.GONE:
                try:   # as its own poll would (the request found in whatever pool it is in), asking again if gone
                    answers[request_id] = self.poll_or_ask_again(request_id, request)
                except LeaseError as exc:
                    answers[request_id] = exc
        return answers

    def revisions(self, pools: Collection[str]) -> dict[str, int]:
        """``revision`` of each pool (SQL stores read them in one query)."""
        return {pool: self.revision(pool) for pool in pools}

    def _poll_pool(self, pool: str, items: Sequence[tuple[str, str]], *, every_held_lease: bool = True
                   ) -> dict[str, LeaseState | LeaseOwnershipError]:
        """Poll ``items`` (request id, owner) of one pool: answered from one unlocked read where nothing is
        due, the rest in one locked transaction (see ``poll``); explained as ``arbiter.Explainer`` says with
        ``every_held_lease`` (False: a triggerer's batched poll, ``poll_many``)."""
        read = _PoolRead.of(*self._read(pool))
        answers: dict[str, LeaseState | LeaseOwnershipError] = {}
        pending: list[tuple[str, str]] = []
        decided: list[Decision] = []   # one decision per read at most, shared by the quiet answers
        explaining = _Explaining(read.rows, self.judge, every_held_lease=every_held_lease)
        for request_id, owner in items:
            try:
                quiet = self._quiet_state(read, request_id, owner, decided, explaining)
            except LeaseOwnershipError as exc:
                answers[request_id] = exc
                continue
            if quiet is None:
                pending.append((request_id, owner))
            else:
                answers[request_id] = quiet
        if not pending:
            return answers
        # The pool is written anyway: every request answered quietly renews its heartbeat in the same write, so
        # a poller's heartbeats fall due together and its waiters cost the pool one write per third of a TTL,
        # not one whenever any of them is due (each write moves the revision, and every watcher reads again).
        pending += [(request_id, owner) for request_id, owner in items
                    if isinstance(answers.get(request_id), LeaseState)]
        try:
            tables = {found.record.table if (found := read.by_id.get(request_id)) is not None
                      else self._table_of.get(request_id) for request_id, _ in pending}
            states, refused, after = self._transact(pool, lambda txn: self._poll_due(txn, pending),
                                                    table=tables.pop() if len(tables) == 1 else None)
        except _Refused as refusal:   # nobody here owns what it polled: nothing is changed (invariant 6)
            answers.update(refusal.args[0])
            return answers
        answers.update(refused)
        explaining = _Explaining(after, self.judge, every_held_lease=every_held_lease)
        answers.update({request_id: explaining(state) for request_id, state in states.items()})
        return answers

    def _poll_due(self, txn: PoolTransaction, pending: Sequence[tuple[str, str]]
                  ) -> tuple[dict[str, LeaseState], dict[str, LeaseOwnershipError], list[Row]]:
        """The transaction of ``_poll_pool``: each owner's heartbeat, then one decision; each owned request's
        state, the refusals, and the rows after it.

        Raises:
            _Refused: no request polled here belongs to its poller (nothing is written); its argument holds
                the refusals.
        """
        # A waiter that polls after its TTL was abandoned, whoever noticed first. The rows are indexed once: a
        # batch renews up to every waiter of the pool.
        live = {r.request_id: r for r in self._expire(txn)}
        owned: dict[str, Row | None] = {}
        refused: dict[str, LeaseOwnershipError] = {}
        states: dict[str, LeaseState] = {}
        for request_id, owner in pending:
            found = live.get(request_id)
            txn.about(None if found is None else found.record.table)
            try:
                owned[request_id] = _owned(found, owner)
            except LeaseOwnershipError as exc:
                refused[request_id] = exc
        if not owned:
            raise _Refused(refused)
        for row in owned.values():
            if row is not None and row.record.status is LeaseStatus.WAITING:
                txn.update(replace(row, record=replace(row.record, expires_at=txn.now + row.ttl)))
        decision, by_id = self._grant(txn)
        for request_id, row in owned.items():
            state = _state_of(decision, by_id, request_id, txn.now)
            if state.granted and _heartbeat_due(state.record, row, txn.now):
                state = replace(state, record=self._extend(txn, request_id))
            states[request_id] = state
        return states, refused, txn.rows()

    def _quiet_state(self, read: _PoolRead, request_id: str, owner: str, decided: list[Decision],
                     explaining: _Explaining) -> LeaseState | None:
        """The answer to a poll when nothing is due, from an unlocked read; ``None`` when the lock is needed.
        ``decided`` holds the read's decision once one answer needed it."""
        rows, now = read.rows, read.now
        mine = read.by_id.get(request_id)
        if mine is None or read.expiring:
            return None
        _check_owner(mine, owner)
        if _heartbeat_due(mine.record, mine, now):
            return None
        if mine.record.status is LeaseStatus.GRANTED:
            return LeaseState(request_id, LeaseStatus.GRANTED, now, mine.record)
        state = LeaseState(request_id, LeaseStatus.WAITING, now, mine.record)
        if _remembered_holder(mine, read.by_id) is not None:   # it waits for a lease still held: no decision needed
            return explaining(state)
        if not decided:
            decided.append(_decide(rows, self.judge, now))
        if decided[0].granted:
            return None   # a grant is due (a release that granted nothing, a limit raised): make it under the lock
        return explaining(replace(state, blockers=decided[0].blockers.get(request_id, ())))

    def _explained(self, state: LeaseState, rows: Sequence[Row]) -> LeaseState:
        """``state`` explained on ``rows`` (``_Explaining``), for one answer."""
        return _Explaining(rows, self.judge)(state)

    def renew(self, request_id: str, owner: str) -> LeaseRecord:
        """Extend a held lease by its TTL (the holder's heartbeat).

        Raises:
            LeaseLostError: the lease expired or was released (the job no longer has the pool's protection).
            LeaseOwnershipError: ``owner`` does not own it.
        """
        pool = self._pool(request_id)

        def body(txn: PoolTransaction) -> tuple[LeaseRecord | None, int]:
            size = len(self._expire(txn))   # the holder learns how busy its pool is
            row = self._own(txn, request_id, owner)
            if row is not None and row.record.status is LeaseStatus.GRANTED:
                return self._extend(txn, request_id), size
            if row is not None:
                raise LeaseLostError(f"request {request_id} of {owner!r} is still waiting; only a granted "
                                     "lease can be renewed")
            return None, size

        if pool is not None:
            renewed, self._pool_sizes[pool] = self._transact(pool, body, table=self._table_of.get(request_id))
            if renewed is not None:
                return renewed
        raise LeaseLostError(f"lease {request_id} of {owner!r} is gone: it was released, or expired because its "
                             "heartbeat stopped for longer than its TTL")

    def release(self, request_id: str, owner: str, *, note: str = "") -> bool:
        """Give up a lease or a waiting request; ``False`` when it was already gone (idempotent). ``note``
        is added to the audit line (what happened while the lease was held, such as an early abort).

        Raises:
            LeaseOwnershipError: ``owner`` does not own it (nothing is changed).
        """
        pool = self._pool(request_id)
        self._pool_of.pop(request_id, None)
        table = self._table_of.pop(request_id, None)
        if pool is None:
            return False
        if self._release_at_once(pool, table, request_id, owner, note[:500]):
            return True
        if self._pool_sizes.get(pool, 0) >= PREWARM_ROWS:
            self._prewarm(pool, request_id)

        def body(txn: PoolTransaction) -> list[Row] | None:
            row = self._own(txn, request_id, owner)
            if row is None:
                return None
            txn.delete(request_id)
            held = row.record.status is LeaseStatus.GRANTED
            detail = f"held {txn.now - (row.record.granted_at or txn.now):.3f} s" if held else ""
            self._audit(txn, row.record, AuditKind.RELEASE if held else AuditKind.CANCEL,
                        "; ".join(part for part in (detail, note[:500]) if part))
            return self._settle(txn, None)[1]

        rows = self._transact(pool, body, table=table)
        if rows is None:
            return False
        self._pool_sizes[pool] = len(rows)
        return True

    def _prewarm(self, pool: str, leaving: str) -> None:
        """Before a release takes a big pool's lock: decide once on an unlocked read without ``leaving``, so
        the comparisons the release will need (each waiter of the lease with its next blocker) are judged
        outside the lock; the decision under the lock then finds them in the judge's memo. Nothing is
        decided here, and a failure only means they are judged under the lock."""
        try:
            rows, now = self._read(pool)
        except LeaseError:
            return
        live = [r for r in rows if r.request_id != leaving and r.record.expires_at > now]
        _decide(live, self.judge, now)

    def holders(self, *, pool: str | None = None, table: str | None = None) -> list[LeaseRecord]:
        return [r for r in self.records(pool=pool, table=table) if r.status is LeaseStatus.GRANTED]

    def waiting_for(self, *, pool: str) -> dict[str, tuple[Blocker, ...]]:
        """Whom each waiting request of ``pool`` waits for and why (every held lease it conflicts with, the
        request directly ahead of it, or the writer limit), by request id: what its own poll would answer,
        decided on one unlocked read. A read only: nobody's heartbeat is given, nothing is granted."""
        read = _PoolRead.of(*self._read(pool))
        decision = _decide(read.rows, self.judge, read.now)
        explaining = _Explaining(read.rows, self.judge)
        return {row.request_id: explaining(LeaseState(row.request_id, LeaseStatus.WAITING, read.now, row.record,
                                                      decision.blockers.get(row.request_id, ()))).blockers
                for row in read.rows if row.record.status is LeaseStatus.WAITING}

    def waiters(self, *, pool: str | None = None, table: str | None = None) -> list[LeaseRecord]:
        return [r for r in self.records(pool=pool, table=table) if r.status is LeaseStatus.WAITING]

    def __enter__(self) -> LeaseStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the one algorithm ----------------------------------------------------------------------
    def _own(self, txn: PoolTransaction, request_id: str, owner: str) -> Row | None:
        found = next((r for r in txn.rows() if r.request_id == request_id), None)
        txn.about(None if found is None else found.record.table)
        return _owned(found, owner)

    def _extend(self, txn: PoolTransaction, request_id: str) -> LeaseRecord:
        """The owner's heartbeat on its granted lease: it lives one TTL from now (recorded as a renewal)."""
        row = next(r for r in txn.rows() if r.request_id == request_id)
        record = replace(row.record, expires_at=txn.now + row.ttl)
        txn.update(replace(row, record=record))
        self._audit(txn, record, AuditKind.RENEW)
        return record

    def _expire(self, txn: PoolTransaction) -> list[Row]:
        live = []
        for row in txn.rows():
            if row.record.expires_at <= txn.now:
                txn.delete(row.request_id)
                held = row.record.status is LeaseStatus.GRANTED
                self._audit(txn, row.record, AuditKind.EXPIRE if held else AuditKind.ABANDON,
                            f"no heartbeat since {row.record.expires_at - row.ttl:.3f}")
            else:
                live.append(row)
        return live

    def _settle(self, txn: PoolTransaction, request_id: str | None) -> tuple[LeaseState, list[Row]]:
        """Expire, grant what the rule allows, and report ``request_id``'s state and the pool's rows after it."""
        decision, by_id = self._grant(txn)
        rows = list(by_id.values())
        if request_id is None:
            return LeaseState("", LeaseStatus.GONE, txn.now), rows
        return _state_of(decision, by_id, request_id, txn.now), rows

    def _grant(self, txn: PoolTransaction) -> tuple[Decision, dict[str, Row]]:
        """Expire, then grant what the rule allows (remembering each waiter's held blocker); the live rows after."""
        live = self._expire(txn)
        decision = _decide(live, self.judge, txn.now)
        by_id = {r.request_id: r for r in live}
        for waiter_id, remembered in decision.remember.items():
            row = by_id[waiter_id]
            if row.remembered != remembered:
                by_id[waiter_id] = replace(row, remembered=remembered)
                txn.update(by_id[waiter_id])
        for granted_id in decision.granted:
            row = by_id[granted_id]
            # The deadline stays the waiter's own: only its owner's heartbeat moves it (a dead waiter
            # granted here must not block the pool for a fresh TTL).
            record = replace(row.record, status=LeaseStatus.GRANTED, granted_at=txn.now)
            by_id[granted_id] = replace(row, record=record, remembered=None)
            txn.update(by_id[granted_id])
            self._audit(txn, record, AuditKind.GRANT, f"waited {txn.now - record.requested_at:.3f} s")
        return decision, by_id

    @staticmethod
    def _audit(txn: PoolTransaction, record: LeaseRecord, kind: AuditKind, detail: str = "") -> None:
        txn.audit(AuditEvent(at=txn.now, pool=record.pool, table=record.table, request_id=record.request_id,
                             owner=record.owner, kind=kind, summary=record.summary, detail=detail))


def _check_owner(row: Row, owner: str) -> None:
    if row.record.owner != owner:
        raise LeaseOwnershipError(f"request {row.request_id} belongs to {row.record.owner!r}, not {owner!r}; "
                                  "nothing was changed")


def _heartbeat_due(record: LeaseRecord | None, row: Row | None, now: float) -> bool:
    """Whether a third of the TTL passed since the owner's last heartbeat (a poll then renews it)."""
    return record is not None and row is not None and record.expires_at - now < row.ttl * 2 / 3


def request_detail(request: LeaseRequest) -> str:
    """The request's JSON (its footprint per partition): enough to re-judge any two grants from the audit alone."""
    return request.json_text


class _Explaining:
    """The answers given from one read of a pool, each with the held leases it waits for and the request
    directly ahead of it (``arbiter.Explainer``, ``every_held_lease`` as there; the pool is indexed once,
    however many answers), outside the pool's lock. A writer-limit blocker the decision named is kept."""

    def __init__(self, rows: Sequence[Row], judge: PairJudge, *, every_held_lease: bool = True) -> None:
        self._rows, self._judge, self._every_held_lease = rows, judge, every_held_lease
        self._explainer: Explainer | None = None
        self._candidates: dict[str, Candidate] = {}

    def __call__(self, state: LeaseState) -> LeaseState:
        if state.status is not LeaseStatus.WAITING:
            return state
        if self._explainer is None:
            self._candidates = {r.request_id: _candidate(r) for r in self._rows}
            self._explainer = Explainer(
                [self._candidates[r.request_id] for r in self._rows if r.record.status is LeaseStatus.GRANTED],
                sorted((self._candidates[r.request_id] for r in self._rows if r.record.status is LeaseStatus.WAITING),
                       key=lambda c: c.seq), self._judge, every_held_lease=self._every_held_lease)
        mine = self._candidates.get(state.request_id)
        if mine is None:
            return state
        limit = tuple(b for b in state.blockers if b.request_id is None)   # the writer limit, as decided
        return replace(state, blockers=(*self._explainer.explain(mine), *limit) or state.blockers)


def _state_of(decision: Decision, by_id: Mapping[str, Row], request_id: str, now: float) -> LeaseState:
    found = by_id.get(request_id)
    if found is None:
        return LeaseState(request_id, LeaseStatus.GONE, now)
    return LeaseState(request_id, found.record.status, now, found.record, decision.blockers.get(request_id, ()))


def _owned(row: Row | None, owner: str) -> Row | None:
    """``row`` (``None``: gone), once it is known to be ``owner``'s.

    Raises:
        LeaseOwnershipError: it is another owner's.
    """
    if row is not None:
        _check_owner(row, owner)
    return row


@dataclass(frozen=True)
class _PoolRead:
    """One unlocked read of a pool, indexed once for all the answers given from it (a triggerer answers a
    thousand waiters from one read: a walk of the rows per answer would make that n^2)."""

    rows: Sequence[Row]
    now: float
    by_id: Mapping[str, Row]
    expiring: bool   # some row's deadline passed: the poll must take the lock to expire it

    @classmethod
    def of(cls, rows: Sequence[Row], now: float) -> _PoolRead:
        return cls(rows, now, {r.request_id: r for r in rows}, any(r.record.expires_at <= now for r in rows))


def _remembered_holder(row: Row, by_id: Mapping[str, Row]) -> Blocker | None:
    """The held lease a waiting ``row`` was last found to conflict with, if it is still held as judged."""
    remembered = row.remembered
    if remembered is None or remembered.waiter_key != row.key:
        return None
    holder = by_id.get(remembered.request_id)
    if holder is None or holder.record.status is not LeaseStatus.GRANTED or holder.key != remembered.key:
        return None
    return Blocker(remembered.reason, holder.request_id, holder.record.owner, True)


def _decide(rows: Sequence[Row], judge: PairJudge, now: float) -> Decision:
    """``arbiter.decide`` on a pool's live rows (in arrival order): its holders, then its waiters."""
    return decide([_candidate(r) for r in rows if r.record.status is LeaseStatus.GRANTED],
                  [_candidate(r) for r in rows if r.record.status is LeaseStatus.WAITING], judge, now=now)


def _candidate(row: Row) -> Candidate:
    return Candidate(request_id=row.request_id, key=row.key, table=row.record.table,
                     owner=row.record.owner, load=lambda: row.request.planned, model=row.model,
                     max_writers=row.max_writers, granted_at=row.record.granted_at, seq=row.record.seq,
                     hold=lambda: row.request.expected_hold, span=lambda: row.request.reach,
                     remembered=row.remembered if row.record.status is LeaseStatus.WAITING else None)


def newest(events: Sequence[AuditEvent], limit: int) -> list[AuditEvent]:
    """The last ``limit`` events, oldest first (what ``history`` returns)."""
    return list(events[-limit:]) if limit > 0 else []


def only(records: Iterator[LeaseRecord] | Sequence[LeaseRecord], pool: str | None, table: str | None
         ) -> list[LeaseRecord]:
    return [r for r in records if (pool is None or r.pool == pool) and (table is None or r.table == table)]
