"""A lease store in one process's memory: the contract without a database, for unit tests and demos.

It runs the same algorithm as the SQL store (``base.LeaseStore``) under a mutex, and its clock can
be injected so tests move time instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from ..compare import PairJudge
from ..requests import AuditEvent, AuditKind, LeaseRecord
from .base import LeaseStore, PoolTransaction, Row, newest, only


@dataclass
class _Pool:
    rows: dict[str, Row] = field(default_factory=dict)   # insertion order is arrival order
    next_seq: int = 1
    revision: int = 0   # moved by every transaction that ends well


class _Transaction:
    def __init__(self, pool: _Pool, first_event_id: int, now: float) -> None:
        self._pool, self.now = pool, now
        self._first_event_id = first_event_id
        self.events: list[AuditEvent] = []   # appended to the store's history only when the transaction ends well

    def rows(self) -> list[Row]:
        return sorted(self._pool.rows.values(), key=lambda r: r.record.seq)

    def next_seq(self) -> int:
        seq = self._pool.next_seq
        self._pool.next_seq += 1
        return seq

    def insert(self, row: Row) -> None:
        self._pool.rows[row.request_id] = row

    def update(self, row: Row) -> None:
        self._pool.rows[row.request_id] = row

    def delete(self, request_id: str) -> None:
        self._pool.rows.pop(request_id, None)

    def audit(self, event: AuditEvent) -> None:
        self.events.append(replace(event, event_id=self._first_event_id + len(self.events)))

    def about(self, table: str | None) -> None:
        """Nothing to do: a transaction here always runs on the pool as it is."""


class MemoryLeaseStore(LeaseStore):
    """All pools in a dict behind one lock; ``clock`` returns epoch seconds (``time.time`` by default)."""

    def __init__(self, *, clock: Callable[[], float] = time.time, judge: PairJudge | None = None) -> None:
        super().__init__(judge=judge)
        self.clock = clock
        self._lock = threading.RLock()
        self._pools: dict[str, _Pool] = {}
        self._events: list[AuditEvent] = []

    @contextmanager
    def _locked(self, pool: str) -> Iterator[PoolTransaction]:
        with self._lock:
            state = self._pools.setdefault(pool, _Pool())
            # work on a copy so an exception leaves the pool as it was (a rolled-back transaction)
            draft = _Pool(dict(state.rows), state.next_seq, state.revision + 1)
            txn = _Transaction(draft, len(self._events) + 1, self.clock())
            yield txn
            self._pools[pool] = draft
            self._events.extend(txn.events)

    def _read(self, pool: str) -> tuple[list[Row], float]:
        with self._lock:
            state = self._pools.get(pool)
            rows = sorted(state.rows.values(), key=lambda r: r.record.seq) if state else []
            return rows, self.clock()

    def revision(self, pool: str) -> int:
        with self._lock:
            state = self._pools.get(pool)
            return 0 if state is None else state.revision

    def _locate(self, request_id: str) -> str | None:
        with self._lock:
            return next((name for name, p in self._pools.items() if request_id in p.rows), None)

    def records(self, *, pool: str | None = None, table: str | None = None) -> list[LeaseRecord]:
        with self._lock:
            rows = [r for p in self._pools.values() for r in p.rows.values()]
        return only(sorted((r.record for r in rows), key=lambda r: (r.pool, r.seq)), pool, table)

    def history(self, *, pool: str | None = None, table: str | None = None, limit: int = 100,
                kinds: Collection[AuditKind] | None = None) -> list[AuditEvent]:
        with self._lock:
            events = [e for e in self._events
                      if (pool is None or e.pool == pool) and (table is None or e.table == table)
                      and (kinds is None or e.kind in kinds)]
        return newest(events, limit)
