"""The lease store on a SQL database through SQLAlchemy: SQLite (one host) or PostgreSQL (many hosts).

Atomicity comes from the database:

* PostgreSQL: optimistic. An operation decides on the pool as this process last saw it (or reads it), then
  writes with one statement that lands only if the pool row's revision is still the one its decision read,
  or if the pool moved on other tables only (``pg_statements``); otherwise nothing lands, and the operation
  decides again on a fresh read. One round trip per operation while nobody else changes its tables in
  between, and no lock is held while a client decides on a view it remembers. A process whose write missed
  reads the pool before each decision on it (two round trips) until nobody else wrote the pool between two
  of its operations; an operation whose table is known makes that read in the table's queue, which orders
  the deciders of one table (``_transact_queued``), and the write then ends the queue's turn. A write that
  keeps missing is decided under the pool row's lock (``SELECT ... FOR UPDATE``), so every operation ends.
  Pools never block each other.
* SQLite: ``BEGIN IMMEDIATE`` takes the database's write lock before anything is read (WAL journal,
  so listings still read while a decision is made). One host only: SQLite's locks do not work on
  network file systems.

Times come from the database's clock, so workers with skewed clocks agree on expiry. The module takes
a SQLAlchemy URL and imports no Airflow; the Airflow layer resolves a connection to the URL.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from types import SimpleNamespace
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, DisconnectionError, SQLAlchemyError

from airflow_delta_occ.exceptions import LeaseStoreError

from ..arbiter import Remembered
from ..compare import PairJudge
from ..requests import AuditEvent, AuditKind, LeaseRecord, LeaseRequest, LeaseRequestError, LeaseState, LeaseStatus
from . import pg_at_once, pg_statements
from .base import LeaseStore, PoolTransaction, Row, newest, request_detail
from .urls import masked_url, parse_url

_T = TypeVar("_T")

log = logging.getLogger(__name__)

#: Whether PostgreSQL operations start optimistic (off: every operation takes its pool's lock; tests prove
#: that path with the whole contract).
OPTIMISTIC = True

SCHEMA_LOCK_KEY = 0x44454C54414F4343  # "DELTAOCC": the advisory lock that serializes schema creation

#: Whether operations whose table is known read their pool in the table's queue (``_transact_queued``). Off, they
#: decide as the release before did (a benchmark compares both in one run, ``benchmarks/leases.py``).
QUEUED = True

#: Whether PostgreSQL acquires and releases the server can decide alone are made in one call (``pg_at_once``). Off,
#: every operation reads the pool first, as the release before did (a benchmark compares both in one run).
AT_ONCE = True

#: One-step calls the server refuses in a row (for another reason than a lost connection or a queue not let in)
#: before a store stops making them.
AT_ONCE_FAILURES = 3

#: How many times an operation decides in its table's queue (``_transact_queued``) before it takes the pool's lock.
QUEUED_TRIES = 3

#: A transaction that holds a table's queue or a pool's lock and sits idle this long has its session ended by the
#: server (``pg_statements.LOCK``): a decision takes milliseconds (under a second with a thousand waiters), so
#: only a stalled client gets there, and the others of its table wait for it this long at most, not for hours.
STALLED_TRANSACTION_MS = 30_000

#: How long an operation waits to enter its table's queue before it decides without it: the queue's turns are
#: decisions of milliseconds, so only a lock on the queue's key held by somebody else (any role may take advisory
#: locks) waits this long, and it then delays operations, never stops them.
QUEUE_WAIT_MS = 10_000

#: How long a process decides without a table's queue after it was not let in (``_queue_open``).
QUEUE_SKIP_SECONDS = 60.0

metadata = sa.MetaData()
pools_table = sa.Table(
    "delta_occ_lease_pools", metadata,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("next_seq", sa.BigInteger, nullable=False),
    sa.Column("changed_at", sa.Float(53), nullable=True),   # the time of its last write (PostgreSQL)
    sa.Column("write_token", sa.String(32), nullable=True),   # the token of its last write (PostgreSQL)
    # PostgreSQL, a pool of many tables (``pg_statements``): per table, the revision of the last write that
    # changed its requests; the revision after the last write that recorded its tables; a writer limit seen.
    sa.Column("table_revs", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=True),
    sa.Column("tracked_seq", sa.BigInteger, nullable=True),
    sa.Column("limited", sa.Boolean, nullable=True),
    sa.Column("recent_tokens", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=True),   # revision -> token
)
leases_table = sa.Table(
    "delta_occ_leases", metadata,
    sa.Column("request_id", sa.String(32), primary_key=True),
    sa.Column("pool", sa.String(200), nullable=False),
    sa.Column("table_key", sa.String(2048), nullable=False),
    sa.Column("owner", sa.String(512), nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("revision", sa.Integer, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("summary", sa.Text, nullable=False),
    sa.Column("model", sa.String(16), nullable=False),
    sa.Column("max_writers", sa.Integer, nullable=True),
    sa.Column("ttl", sa.Float(53), nullable=False),
    sa.Column("request", sa.Text, nullable=False),
    sa.Column("requested_at", sa.Float(53), nullable=False),
    sa.Column("granted_at", sa.Float(53), nullable=True),
    sa.Column("expires_at", sa.Float(53), nullable=False),
    sa.Column("blocker", sa.Text, nullable=True),   # a waiter's remembered blocker (arbiter.Remembered), JSON
    # its partitions as the server compares them (``pg_at_once.reach_of``)
    sa.Column("reach", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=True),
    sa.Index("ix_delta_occ_leases_pool_seq", "pool", "seq"),
    sa.Index("ix_delta_occ_leases_table", "table_key"),
)
audit_table = sa.Table(
    "delta_occ_lease_audit", metadata,
    sa.Column("event_id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("at", sa.Float(53), nullable=False),
    sa.Column("pool", sa.String(200), nullable=False),
    sa.Column("table_key", sa.String(2048), nullable=False),
    sa.Column("request_id", sa.String(32), nullable=False),
    sa.Column("owner", sa.String(512), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("summary", sa.Text, nullable=False),
    sa.Column("detail", sa.Text, nullable=False),
    sa.Index("ix_delta_occ_lease_audit_table", "table_key", "event_id"),
    sa.Index("ix_delta_occ_lease_audit_pool", "pool", "event_id"),
)


class SqlLeaseStore(LeaseStore):
    """Leases in a SQL database; ``url`` is a SQLAlchemy URL (``sqlite:////path/leases.db``,
    ``postgresql+psycopg2://user:pass@host:5432/db``). Tables are created on first use.

    One instance per process: SQLAlchemy engines must not cross ``fork``. ``clock`` replaces the
    database's clock (epoch seconds) so that tests can move time instead of sleeping; in production
    leave it unset, so that workers on hosts with skewed clocks agree on expiry.

    Raises:
        LeaseStoreError: the database cannot be reached, or is neither SQLite nor PostgreSQL.
    """

    def __init__(self, url: str, *, judge: PairJudge | None = None, engine_options: dict[str, Any] | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(judge=judge)
        self.clock = clock
        try:
            self.engine: Engine = _engine(url, engine_options or {})
        except (SQLAlchemyError, ImportError, ValueError) as exc:
            raise LeaseStoreError(f"cannot open the lease store at {_safe(url)}: {exc}") from exc
        self.dialect = self.engine.dialect.name
        if self.dialect not in ("sqlite", "postgresql"):
            raise LeaseStoreError(f"the lease store supports SQLite and PostgreSQL, not {self.dialect}")
        self._requests: OrderedDict[tuple[str, int], LeaseRequest] = OrderedDict()
        database = self.engine.url.database if self.dialect == "sqlite" else None
        self._queue_path = f"{database}.lock" if database and database != ":memory:" else None
        self._known_pools: set[str] = set()
        self._snapshots: dict[str, _Snapshot] = {}   # each pool as this process last saw it (PostgreSQL)
        self._decoded: dict[str, dict[tuple[Any, ...], Row]] = {}   # its rows as read, decoded (``_decoded_rows``)
        self._busy: set[str] = set()   # pools other processes write too: operations on them read first
        self._queue_closed: dict[tuple[str, str], float] = {}   # (pool, table) -> when its queue is tried again
        self._written: dict[str, int] = {}   # each pool's revision after this process's last write to it
        self._clock_offset = 0.0   # the database's clock minus this host's, at the last statement
        #: How this process's writes went on PostgreSQL: ``landed`` and ``missed`` optimistic writes (``landed_moved``:
        #: landed past other tables' writes), reads made in a table's ``queued`` (``queue_timed_out``: not let in),
        #: operations that fell back to the ``locked`` path (what a benchmark reports; nothing decides on it).
        self.writes: Counter[str] = Counter()
        #: PostgreSQL's conditional write as sent: through its server-side function (``pg_statements``), or
        #: as the plain statement where the function could not be made.
        self.write_statement = pg_statements.WRITE
        #: PostgreSQL's one-step acquire and release (``pg_at_once``) as called, or ``None`` where their functions
        #: could not be made (or ``AT_ONCE`` is off): every operation then goes the usual way.
        self.at_once: tuple[str, str] | None = None
        self._at_once_failures = 0   # one-step calls the server refused in a row (``_call_at_once``)
        with self._errors("create the lease tables"), self._transaction_block() as conn:
            if self.dialect == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(SCHEMA_LOCK_KEY)))
            metadata.create_all(conn)
            _add_missing_columns(conn, self.dialect)
            schema = _ensure_write_function(conn) if self.dialect == "postgresql" else None
            if schema is not None:
                self.write_statement = pg_statements.call_write(schema)
            schema = _ensure_at_once_functions(conn) if self.dialect == "postgresql" else None
            if schema is not None:
                self.at_once = (pg_at_once.call_acquire(schema), pg_at_once.call_release(schema))

    def _acquire_at_once(self, request: LeaseRequest) -> LeaseState | None:
        """``LeaseStore._acquire_at_once`` on PostgreSQL: a request whose reach has tokens (``pg_at_once.reach_of``)
        and no writer limit is offered to the acquire function, which grants it when every live request of its
        table is apart from it; otherwise (or when the call fails) the usual way decides."""
        if (self.at_once is None or not AT_ONCE or not OPTIMISTIC or request.max_writers is not None
                or not self._queue_open(request.pool, request.table)):
            return None
        reach = pg_at_once.reach_of(request, 0)
        if reach is None:
            return None
        request_id = uuid.uuid4().hex
        row = json.dumps({"request_id": request_id, "summary": request.summary, "model": request.model,
                          "ttl": request.ttl, "request": request.json_text, "reach": reach})
        params = {"pool": request.pool, "table": request.table, "owner": request.owner, "row": row,
                  "detail": request_detail(request)}
        answer = self._call_at_once(0, request.pool, request.table, params)
        if answer is None or answer.applied is None:
            return None
        at = float(answer.decided_at)
        record = LeaseRecord(request_id=request_id, pool=request.pool, table=request.table, owner=request.owner,
                             seq=int(answer.applied) - 1, status=LeaseStatus.GRANTED, summary=request.summary,
                             requested_at=at, granted_at=at, expires_at=float(answer.decided_at + Decimal(
                                 repr(request.ttl))))
        return LeaseState(request_id, LeaseStatus.GRANTED, at, record)

    def _landed_quietly(self, pool: str, token: str) -> bool:
        """``_landed``, ``False`` when the database cannot tell now (the usual way then decides, and fails, again)."""
        try:
            return self._landed(pool, token)
        except LeaseStoreError:
            return False

    def _release_at_once(self, pool: str, table: str | None, request_id: str, owner: str, note: str) -> bool | None:
        """``LeaseStore._release_at_once`` on PostgreSQL: the release function, when nobody waits on the table."""
        if self.at_once is None or not AT_ONCE or not OPTIMISTIC or table is None or not self._queue_open(pool, table):
            return None
        answer = self._call_at_once(1, pool, table, {"pool": pool, "table": table, "request_id": request_id,
                                                     "owner": owner, "note": note})
        if answer is None or answer.applied is None:
            return None
        return True

    def _call_at_once(self, which: int, pool: str, table: str, params: dict[str, Any]) -> Any:
        """One call of a one-step function (0: acquire, 1: release); its answer, or ``None`` when the usual way must
        decide: the server refused the call (its one statement rolled back: the function gone, not called again by
        this store; the table's queue not let in; any other refusal, three in a row stop the calls), could not be
        reached, or the connection died (an acquire that landed is then found by the usual way, which finds the
        owner's request there; a release that landed is told by its token, and answered as released).

        Raises:
            LeaseStoreError: SQLAlchemy failed before the database was asked (no connection could be made).
        """
        assert self.at_once is not None
        token = uuid.uuid4().hex
        params = {**params, "token": token, "now": None if self.clock is None else float(self.clock()),
                  "queue_class": pg_statements.QUEUE_CLASS, "queue_key": _queue_key(pool, table),
                  "wait_ms": int(QUEUE_WAIT_MS)}
        try:
            with self.engine.connect() as conn:   # autocommit (``_engine``): the call commits itself
                answer = conn.exec_driver_sql(self.at_once[which], params).one()
        except DBAPIError as exc:
            self._snapshots.pop(pool, None)
            if exc.connection_invalidated:   # a release that landed is told by its token: it released the lease
                landed = which == 1 and self._landed_quietly(pool, token)
                return SimpleNamespace(applied=-1) if landed else None
            if getattr(exc.orig, "pgcode", None) == pg_statements.LOCK_NOT_AVAILABLE:   # nothing ran: as the queue
                self.writes["queue_timed_out"] += 1
                self._queue_closed[(pool, table)] = time.monotonic() + QUEUE_SKIP_SECONDS
                return None
            if _function_refused(exc, pg_at_once.ACQUIRE_FUNCTION if which == 0 else pg_at_once.RELEASE_FUNCTION):
                log.warning("the lease store's one-step function is gone or may no longer be run (%s); this store "
                            "decides every operation the usual way from now on", _first_line(exc))
                self.at_once = None
                return None
            if getattr(exc.orig, "pgcode", None) is None:   # no answer from the server (it is down, say)
                return None   # the usual way decides, and reports what it finds
            # Anything else the server refused (a timeout of the role, a value it cannot take) rolled the call's
            # one statement back: the usual way decides, and after a few such failures in a row this store
            # stops calling.
            self._at_once_failures += 1
            log.warning("the lease store's one-step call failed (%s); the operation is decided the usual way%s",
                        _first_line(exc), "" if self._at_once_failures < AT_ONCE_FAILURES else
                        ", as every operation of this store is from now on")
            if self._at_once_failures >= AT_ONCE_FAILURES:
                self.at_once = None
            return None
        except SQLAlchemyError as exc:
            raise self._failed(f"change pool {pool!r}", exc) from exc
        self._at_once_failures = 0
        self._clock_offset = float(answer.db_now) - time.time()
        self.writes["at_once" if answer.applied is not None else "at_once_declined"] += 1
        return answer

    def close(self) -> None:
        self.engine.dispose()

    @property
    def _write_and_commit(self) -> str:
        """``write_statement`` ending the locked path's transaction in the same round trip."""
        return f"{self.write_statement};\nCOMMIT"

    @property
    def _write_commit_and_tell(self) -> str:
        """``write_statement`` ending a table queue's transaction, and its outcome, in the same round trip."""
        return f"{self.write_statement};\nCOMMIT;\n{pg_statements.OUTCOME}"

    @contextmanager
    def _transaction_block(self) -> Iterator[Connection]:
        """A connection inside a transaction that commits at the end, for statements that must land together
        (the schema and its lock). PostgreSQL connections are autocommit (``_engine``), so this one is switched
        to a transaction for its use only."""
        if self.dialect != "postgresql":
            with self.engine.begin() as conn:
                yield conn
            return
        with self.engine.connect().execution_options(isolation_level="READ COMMITTED") as conn, conn.begin():
            yield conn

    # -- storage primitives ---------------------------------------------------------------------
    def _transact(self, pool: str, body: Callable[[PoolTransaction], _T], *, table: str | None = None) -> _T:
        """``LeaseStore._transact``; on PostgreSQL optimistic while the pool is quiet (see the module docstring).

        A decision made on the pool as this process last saw it lands only through the conditional write.
        An outcome that writes nothing (a refusal, a lease already gone) is kept only when its rows were read
        during this call: a remembered pool may be behind, so such an outcome is decided again on a read.
        A write that misses means other processes are writing the same tables of the pool: this process
        then decides again on a fresh read, and reads before it decides on that pool (``_busy``) until it
        finds nobody else wrote it between two of its own operations. Only a write decided on a fresh read
        that misses again takes the pool's lock (``_transact_locked``), for that operation: the lock stops
        every writer of the pool while this client decides, so it is the last resort, not the busy mode. An
        operation whose table is known (``table``) makes its reads in the table's queue instead
        (``_transact_queued``), and takes the pool's lock only after misses there.
        """
        if self.dialect != "postgresql":
            return super()._transact(pool, body)
        try:
            return self._transact_on_postgres(pool, body, table)
        except LeaseStoreError as exc:
            if self.write_statement == pg_statements.WRITE or not _write_function_refused(exc):
                raise
            reason = _first_line(exc.__cause__)
        # The write function was dropped, or this role's EXECUTE on it revoked, under this store: the call
        # failed before anything ran (a locked operation's transaction was rolled back), so the operation is
        # decided again, sent as text.
        log.warning("the lease store's write function %s is gone or may no longer be run (%s); this store "
                    "sends the plain statement from now on", pg_statements.WRITE_FUNCTION, reason)
        self.write_statement = pg_statements.WRITE
        self._snapshots.pop(pool, None)
        return self._transact_on_postgres(pool, body, table)

    def _transact_on_postgres(self, pool: str, body: Callable[[PoolTransaction], _T], table: str | None) -> _T:
        """``_transact`` on PostgreSQL, with the write statement this process uses."""
        if not OPTIMISTIC:
            return self._transact_locked(pool, body)
        queue = table if QUEUED and self._queue_open(pool, table) else None
        if queue is not None and (pool in self._busy or pool not in self._snapshots):
            try:
                return self._transact_queued(pool, queue, body)   # a read is due: made in the table's queue
            except _QueueTimedOut:
                queue = None   # decided without the queue, on a fresh read
                self._busy.add(pool)
        snapshot = None if pool in self._busy else self._snapshots.get(pool)
        fresh = snapshot is None
        if snapshot is None:
            snapshot = self._snapshot(pool)
            if self._written.get(pool) == snapshot.revision:
                self._busy.discard(pool)   # nobody else wrote it since this process did
        while True:
            txn = self._transaction(pool, snapshot, fresh)
            try:
                result = body(txn)
            except Exception:
                if fresh:
                    raise
                snapshot, fresh = self._snapshot(pool), True   # decided on an old view: decide again on a read
                continue
            if not txn.changes():
                if fresh:
                    return result
                snapshot, fresh = self._snapshot(pool), True
                continue
            if self._write_if_current(txn, snapshot):
                self.writes["landed"] += 1
                return result
            self.writes["missed"] += 1
            self._busy.add(pool)
            if queue is not None:
                try:
                    return self._transact_queued(pool, queue, body)
                except _QueueTimedOut:
                    queue = None
            if fresh:
                break
            snapshot, fresh = self._snapshot(pool), True
        self.writes["locked"] += 1
        return self._transact_locked(pool, body)

    def _transact_queued(self, pool: str, table: str, body: Callable[[PoolTransaction], _T]) -> _T:
        """``body`` in its table's queue (``pg_statements.QUEUE``): how an operation whose table is known reads its
        pool when it must (it has no view of the pool that is still current, or other processes write it).

        Processes that decide on one table at once miss each other's writes, and each miss costs a read, a
        decision and a write again; on a pool shared by many tables the old way out, the pool's lock, stopped
        every table while one client decided. In the queue the processes of one table decide one after the
        other, each on a read made after the last one's write committed, while the other tables go on. The
        queue decides nothing: the write is the optimistic one, conditional as ever. Two round trips, as a read
        and a write were: the queue with the read; the write with its commit and its outcome. A write that
        misses anyway (a process outside the queue wrote the table) queues again, up to ``QUEUED_TRIES`` times;
        then the operation is decided under the pool's lock.

        Raises:
            _QueueTimedOut: the queue's lock did not come within ``QUEUE_WAIT_MS`` (nothing was decided).
        """
        queue = {"queue_class": pg_statements.QUEUE_CLASS, "queue_key": _queue_key(pool, table),
                 "queue_wait_ms": int(QUEUE_WAIT_MS)}
        with self._errors(f"queue for table {table!r} of pool {pool!r}"):
            for attempt in range(QUEUED_TRIES):
                conn = self.engine.connect()   # autocommit (``_engine``): the BEGIN in QUEUE is the server's
                ended = False
                try:
                    known = self._snapshots.get(pool)
                    try:
                        rows = list(conn.exec_driver_sql(pg_statements.QUEUE, {**_read_params(pool, known), **queue}))
                    except DBAPIError as exc:
                        if attempt == 0 and exc.connection_invalidated:
                            continue   # a pooled connection the server had dropped: one more try on a new one
                        if getattr(exc.orig, "pgcode", None) == pg_statements.LOCK_NOT_AVAILABLE:
                            self.writes["queue_timed_out"] += 1
                            self._queue_closed[(pool, table)] = time.monotonic() + QUEUE_SKIP_SECONDS
                            raise _QueueTimedOut() from exc   # (``finally`` rolls the transaction back)
                        raise
                    self.writes["queued"] += 1
                    snapshot = self._snapshot_of(pool, rows, known)
                    if self._written.get(pool) == snapshot.revision:
                        self._busy.discard(pool)   # nobody else wrote it since this process did
                    txn = self._transaction(pool, snapshot, True)
                    result = body(txn)
                    if not txn.changes():
                        return result
                    revision, token, params = self._write_params(txn, snapshot, checked=self.clock is None,
                                                                 per_table=True)
                    try:
                        answer = conn.exec_driver_sql(self._write_commit_and_tell, params).one()
                    except DBAPIError as exc:
                        if not exc.connection_invalidated and not _transaction_ended(conn):
                            raise   # the write failed: its transaction is rolled back in ``finally``
                        # The server ended the session (a restart; or this client stalled in the queue, which
                        # the server does not wait for: ``STALLED_TRANSACTION_MS``), or the outcome failed after
                        # the commit: committed, or not. A live connection asks itself (no second one is taken).
                        ended = True
                        if self._landed(pool, token, None if exc.connection_invalidated else conn):
                            return result
                        continue
                    ended = True
                    if self._took(txn, revision, token, answer):
                        self.writes["landed"] += 1
                        return result
                    self.writes["missed"] += 1
                finally:
                    if not ended:
                        _roll_back(conn)   # leaves the queue
                    conn.close()
        self.writes["locked"] += 1
        return self._transact_locked(pool, body)

    def _transaction(self, pool: str, snapshot: _Snapshot, fresh: bool) -> _Transaction:
        return _Transaction(None, pool, self._decision_time(snapshot, fresh), max(snapshot.revision, 1), self,
                            _rows={r.request_id: r for r in snapshot.rows})

    def _transact_locked(self, pool: str, body: Callable[[PoolTransaction], _T]) -> _T:
        """``body`` with the pool's row held locked from its read to its write: two round trips, whoever else
        is writing the pool (``BEGIN``, the lock and the read in one; the write and ``COMMIT`` in the other).

        The transaction is the server's (``BEGIN`` sent on an autocommit connection), so every way out that
        did not commit sends ``ROLLBACK`` itself, and a connection that cannot is thrown away: none goes back
        to the pool inside a transaction, holding the pool's lock. A pooled connection the server had dropped
        fails before anything ran: one more try on a new one.
        """
        with self._errors(f"lock pool {pool!r}"):
            for attempt in (1, 2):
                conn = self.engine.connect()   # autocommit (``_engine``): the BEGIN below is the server's
                ended = False
                try:
                    known = self._snapshots.get(pool)
                    try:
                        rows = list(conn.exec_driver_sql(pg_statements.LOCK, _read_params(pool, known)))
                    except DBAPIError as exc:
                        if attempt == 1 and exc.connection_invalidated:
                            continue
                        raise
                    snapshot = self._snapshot_of(pool, rows, known)
                    txn = self._transaction(pool, snapshot, True)
                    result = body(txn)
                    if txn.changes():
                        # Its time is the database's, read under the lock: no clock check to miss on.
                        revision, token, params = self._write_params(txn, snapshot, checked=False, per_table=False)
                        try:
                            conn.exec_driver_sql(self._write_and_commit, params)
                        except DBAPIError as exc:
                            if exc.connection_invalidated:
                                ended = True   # the server ended the transaction: committed, or not
                                if self._landed(pool, token):
                                    return result
                            raise
                        ended = True
                        self._remember_written(pool, _Snapshot(revision, txn.rows(), txn.now, txn.now, token))
                    return result
                finally:
                    if not ended:
                        _roll_back(conn)
                    conn.close()
        raise AssertionError("unreachable")

    def _snapshot(self, pool: str, conn: Connection | None = None) -> _Snapshot:
        """The pool now, in one statement (remembered for this process's next operation on it). Its rows
        travel only when the pool moved since this process last saw it."""
        known = self._snapshots.get(pool)

        def read(c: Connection) -> _Snapshot:
            return self._snapshot_of(pool, list(c.exec_driver_sql(pg_statements.SNAPSHOT, _read_params(pool, known))),
                                     known)
        return read(conn) if conn is not None else self._reads(f"read pool {pool!r}", read)

    def _snapshot_of(self, pool: str, result: list[Any], known: _Snapshot | None) -> _Snapshot:
        """The snapshot ``result`` (of ``SNAPSHOT`` or ``LOCK``, sent with ``known``) gives: ``known``'s rows
        when neither the revision nor its write's token moved (the statement then sent none), else the rows it
        read."""
        head = result[0]
        self._clock_offset = float(head.db_now) - time.time()
        revision = int(head.seen_seq or 0)
        rows = (known.rows if known is not None and (known.revision, known.token) == (revision, head.seen_token)
                else self._decoded_rows(pool, [r for r in result if r.request_id]))
        snapshot = _Snapshot(revision=revision, rows=rows,
                             now=float(head.db_now) if self.clock is None else float(self.clock()),
                             changed_at=float(head.seen_at or 0.0), token=head.seen_token)
        self._remember(pool, snapshot)
        return snapshot

    def _decoded_rows(self, pool: str, result: list[Any]) -> list[Row]:
        """``result``'s rows (of ``SNAPSHOT``), each decoded once: a row read again with every column the same
        is the ``Row`` decoded from it before. A triggerer reads a pool of a thousand waiters again each time
        it moves, and decoding every row each time was a quarter of its CPU; one move changes a few rows.

        The key leaves out the request's text (kilobytes, hashed per row per read): the request is decoded by
        its id and revision (``request_of``), which the key holds, so its text never changes what a row gives."""
        if not result:
            return []
        head, text = len(pg_statements.SNAPSHOT_HEAD), len(pg_statements.SNAPSHOT_HEAD) + _REQUEST_COLUMN
        assert tuple(result[0]._fields[:head]) == pg_statements.SNAPSHOT_HEAD
        assert result[0]._fields[text] == "request"
        previous, current = self._decoded.get(pool, {}), {}
        rows = []
        for r in result:
            stored = tuple(r)
            key = stored[head:text] + stored[text + 1:]
            row = previous.get(key) or self._row(r)
            current[key] = row
            rows.append(row)
        self._decoded[pool] = current
        return rows

    def _remember(self, pool: str, snapshot: _Snapshot) -> None:
        if len(self._snapshots) > 1_000 and pool not in self._snapshots:
            self._snapshots.clear()
            self._written.clear()
            self._decoded.clear()
        self._snapshots[pool] = snapshot

    def _remember_written(self, pool: str, snapshot: _Snapshot) -> None:
        """The pool after this process's own write (``_transact_locked`` tells a quiet pool by it)."""
        self._remember(pool, snapshot)
        self._written[pool] = snapshot.revision

    def _decision_time(self, snapshot: _Snapshot, fresh: bool) -> float:
        """The time a decision is made at: the injected clock; else the database's clock as read with
        ``snapshot``, or estimated from this host's clock for a remembered one. An estimate is never before
        the pool's last write (its times stay ordered) and is checked against the database's clock by the
        write, which misses when it would run ahead of it (an expiry must never come early)."""
        if self.clock is not None:
            return float(self.clock())
        if fresh:
            return snapshot.now
        return max(time.time() + self._clock_offset, snapshot.changed_at)

    def _write_if_current(self, txn: _Transaction, snapshot: _Snapshot) -> bool:
        """Write ``txn``'s changes if the pool is still at ``snapshot``'s revision (and ``txn``'s time is not
        ahead of the database's clock); whether they landed (then the pool after them is remembered).

        A write whose connection turned out dead (a database restart) is safe to decide again, unlike a plain
        transaction whose COMMIT may have landed unseen: the pool, read anew, carries the token of the last
        write that landed, so this one is known to have landed, or not to have.
        """
        revision, token, params = self._write_params(txn, snapshot, checked=self.clock is None, per_table=True)
        try:
            with self.engine.connect() as conn:   # autocommit (``_engine``): the statement commits itself
                answer = conn.exec_driver_sql(self.write_statement, params).one()
        except DBAPIError as exc:
            self._snapshots.pop(txn.pool, None)
            if not exc.connection_invalidated:
                raise self._failed(f"change pool {txn.pool!r}", exc) from exc
            return self._landed(txn.pool, token)
        except SQLAlchemyError as exc:
            self._snapshots.pop(txn.pool, None)
            raise self._failed(f"change pool {txn.pool!r}", exc) from exc
        return self._took(txn, revision, token, answer)

    def _took(self, txn: _Transaction, revision: int, token: str, answer: Any) -> bool:
        """Whether the write of ``txn`` (made as ``revision`` with ``token``) landed, from its answer (``applied``,
        ``db_now``); the pool after it is remembered when nothing else landed in between."""
        self._clock_offset = float(answer.db_now) - time.time()
        if answer.applied is None:
            return False
        if int(answer.applied) != revision:   # landed after writes on other tables: this view lacks them
            self.writes["landed_moved"] += 1
            self._snapshots.pop(txn.pool, None)
            self._written[txn.pool] = int(answer.applied)
            return True
        self._remember_written(txn.pool, _Snapshot(revision, txn.rows(), txn.now, txn.now, token))
        return True

    @staticmethod
    def _write_params(txn: _Transaction, snapshot: _Snapshot, *, checked: bool,
                      per_table: bool) -> tuple[int, str, dict[str, Any]]:
        """The revision ``txn``'s write makes on ``snapshot``'s, its new token, and ``pg_statements.WRITE``'s
        parameters. ``per_table``: the write may land on a pool that moved on other tables only, which is sound
        only when no request read or written has a writer limit (the limit counts every table's holders)."""
        revision, token = txn.revision_after(snapshot.revision), uuid.uuid4().hex
        limited = any(r.max_writers is not None for r in (*snapshot.rows, *txn.written()))
        return revision, token, {"pool": txn.pool, "expected": snapshot.revision, "next_seq": revision, "now": txn.now,
                "token": token, "unchecked": not checked, "per_table": per_table and not limited and not txn.blind,
                "seen_token": snapshot.token,
                "limited": limited, **txn.changes_as_json()}

    def _landed(self, pool: str, token: str, conn: Connection | None = None) -> bool:
        """Whether the write with ``token`` landed, its answer lost with the connection (``pg_statements.OUTCOME``:
        the pool keeps its last 64 revisions' tokens, so later writes, on other tables too, do not hide it; one
        that 64 writes followed counts as not landed, and is decided again: a release then finds its lease gone,
        a renewal renews once more)."""
        self._snapshots.pop(pool, None)

        def read(c: Connection) -> Any:
            return c.exec_driver_sql(pg_statements.OUTCOME, {"pool": pool, "token": token}).one()
        answer = read(conn) if conn is not None else self._reads(f"read pool {pool!r}", read)
        return answer.applied is not None

    def _queue_open(self, pool: str, table: str | None) -> bool:
        """Whether operations on ``table`` use its queue: not for ``QUEUE_SKIP_SECONDS`` after one was not let
        in (somebody holds its key, or a client stalled in it), so that each operation is not delayed again."""
        if table is None:
            return False
        until = self._queue_closed.get((pool, table))
        if until is None:
            return True
        if until > time.monotonic():
            return False
        del self._queue_closed[(pool, table)]
        return True

    @contextmanager
    def _locked(self, pool: str) -> Iterator[PoolTransaction]:
        """SQLite's transaction (``BEGIN IMMEDIATE``: the database's write lock); PostgreSQL has ``_transact``."""
        assert self.dialect == "sqlite", "PostgreSQL operations run through _transact"
        with self._writer_queue(), self._errors(f"lock pool {pool!r}"), self.engine.begin() as conn:
            next_seq, now = self._lock_pool(conn, pool)
            txn = _Transaction(conn, pool, now, next_seq, self)
            txn.reserved_until = next_seq + 1   # the lock statement reserved one arrival number
            yield txn
            txn.flush()

    @contextmanager
    def _writer_queue(self) -> Iterator[None]:
        """On SQLite, wait for the write lock in the kernel (``flock`` on ``<db>.lock``), not in SQLite's busy loop.

        SQLite makes a blocked writer sleep and retry with growing pauses (up to 100 ms each), so under
        many processes one unlucky writer, such as a holder renewing its lease, can wait for seconds
        and lose its lease. A blocking ``flock`` wakes the next writer as soon as the lock is free. It
        only queues writers: ``BEGIN IMMEDIATE`` still provides the atomicity.
        """
        if self._queue_path is None:
            yield
            return
        import fcntl

        with open(self._queue_path, "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _lock_pool(self, conn: Connection, pool: str) -> tuple[int, float]:
        """Reserve one arrival number and read the clock in one statement, inside SQLite's write lock (``BEGIN
        IMMEDIATE`` holds it); gaps in the numbers are harmless, order is what counts.
        """
        bump = (pools_table.update().where(pools_table.c.name == pool)
                .values(next_seq=pools_table.c.next_seq + 1)
                .returning(pools_table.c.next_seq, self._now()))
        found = conn.execute(bump).first()
        if found is None:
            conn.execute(pools_table.insert().values(name=pool, next_seq=1))
            found = conn.execute(bump).first()
            assert found is not None
        return int(found[0]) - 1, float(found[1])

    def _read(self, pool: str) -> tuple[list[Row], float]:
        if self.dialect == "postgresql":   # the same read an optimistic operation starts from: remembered
            snapshot = self._snapshot(pool)
            return snapshot.rows, snapshot.now

        def read(conn: Connection) -> tuple[list[Row], float]:
            query = sa.select(*_ROW_COLUMNS, self._now().label("now")).where(
                leases_table.c.pool == pool).order_by(leases_table.c.seq)
            result = list(conn.execute(query))
            if not result:
                return [], float(conn.execute(sa.select(self._now())).scalar_one())
            return [self._row(r) for r in result], float(result[0].now)
        return self._reads(f"read pool {pool!r}", read)

    def revision(self, pool: str) -> int:
        """The pool row's ``next_seq``: every write bumps it (PostgreSQL: ``pg_statements.WRITE``; SQLite: every
        locked operation, ``_lock_pool``), so it moves on every change, and reading it takes no lock."""
        found = self._reads(f"read pool {pool!r}", lambda conn: conn.execute(
            sa.select(pools_table.c.next_seq).where(pools_table.c.name == pool)).scalar())
        return 0 if found is None else int(found)

    def revisions(self, pools: Collection[str]) -> dict[str, int]:
        """``revision`` of each pool in one query (a triggerer watching many waiters checks them all at once)."""
        if not pools:
            return {}
        found = self._reads("read pools", lambda conn: {str(name): int(seq) for name, seq in conn.execute(
            sa.select(pools_table.c.name, pools_table.c.next_seq).where(pools_table.c.name.in_(sorted(pools))))})
        return {pool: int(found.get(pool, 0)) for pool in pools}

    def _now(self) -> Any:
        """The clock as a SQL expression: the database's, or the injected ``clock``'s reading now."""
        if self.clock is None:
            return _now_sql(self.dialect)
        return sa.literal(float(self.clock()), sa.Float(53))

    def _row(self, r: Any) -> Row:
        """A stored row; its request is decoded (once per revision) only if it must be judged."""
        request_id, revision, text = r.request_id, int(r.revision), r.request
        return Row(_record(r), lambda: self.request_of(request_id, revision, text), str(r.model),
                   None if r.max_writers is None else int(r.max_writers), float(r.ttl), revision,
                   _remembered(r.blocker))

    def _locate(self, request_id: str) -> str | None:
        """The request's pool; its table is kept as ``_transact``'s hint (a waiter resumed in another process)."""
        found = self._reads("find a request", lambda conn: conn.execute(
            sa.select(leases_table.c.pool, leases_table.c.table_key)
            .where(leases_table.c.request_id == request_id)).one_or_none())
        if found is None:
            return None
        if len(self._table_of) > 10_000:
            self._table_of.clear()
        self._table_of[request_id] = str(found.table_key)
        return str(found.pool)

    def records(self, *, pool: str | None = None, table: str | None = None) -> list[LeaseRecord]:
        query = sa.select(*_RECORD_COLUMNS).order_by(leases_table.c.pool, leases_table.c.seq)
        if pool is not None:
            query = query.where(leases_table.c.pool == pool)
        if table is not None:
            query = query.where(leases_table.c.table_key == table)
        return self._reads("list leases", lambda conn: [_record(r) for r in conn.execute(query)])

    def history(self, *, pool: str | None = None, table: str | None = None, limit: int = 100,
                kinds: Collection[AuditKind] | None = None) -> list[AuditEvent]:
        query = sa.select(audit_table).order_by(audit_table.c.event_id.desc()).limit(max(0, limit))
        if kinds is not None:
            query = query.where(audit_table.c.kind.in_(sorted(k.value for k in kinds)))
        if pool is not None:
            query = query.where(audit_table.c.pool == pool)
        if table is not None:
            query = query.where(audit_table.c.table_key == table)
        rows = self._reads("read the audit", lambda conn: list(conn.execute(query)))
        return newest([_event(r) for r in reversed(rows)], limit)

    def _reads(self, action: str, read: Callable[[Connection], _T]) -> _T:
        """``read`` on a connection for reads that decide nothing (on SQLite a deferred transaction, not the
        write lock), run once more on a new connection when the server had dropped the pooled one.

        After a database restart or failover every pooled connection is dead; SQLAlchemy notices on the
        first use and discards the whole pool (connections idle for ``IDLE_PING_SECONDS`` are checked
        before use instead). A read is safe to repeat, so a triggerer's poll or the CLI does not fail for a
        restart that is already over. Writes are not repeated: a COMMIT cut off may have landed, so they
        fail with LeaseStoreError and the caller's next operation starts afresh.
        """
        for attempt in (1, 2):
            try:
                with self.engine.connect().execution_options(delta_occ_read_only=True) as conn:
                    return read(conn)
            except DBAPIError as exc:
                if attempt == 1 and exc.connection_invalidated:
                    continue
                raise self._failed(action, exc) from exc
            except SQLAlchemyError as exc:
                raise self._failed(action, exc) from exc
        raise AssertionError("unreachable")

    def prune_history(self, before: float) -> int:
        """Delete audit events older than ``before`` (epoch seconds); returns how many (run it on a schedule)."""
        with self._errors("prune the audit"), self._transaction_block() as conn:
            return int(conn.execute(audit_table.delete().where(audit_table.c.at < before)).rowcount or 0)

    def request_of(self, request_id: str, revision: int, text: str) -> LeaseRequest:
        """A stored request, parsed once per revision (footprints are compared on every pass)."""
        key = (request_id, revision)
        found = self._requests.get(key)
        if found is None:
            try:
                found = LeaseRequest.from_json_text(text)
            except LeaseRequestError as exc:
                raise LeaseStoreError(f"request {request_id} in the lease store cannot be read: {exc}") from exc
            self._requests[key] = found
            if len(self._requests) > 10_000:
                self._requests.popitem(last=False)
        return found

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except SQLAlchemyError as exc:
            raise self._failed(action, exc) from exc

    def _failed(self, action: str, exc: SQLAlchemyError) -> LeaseStoreError:
        """The typed error, with the driver's own message where there is one (not the statement's text)."""
        cause = str(exc.orig).strip() if isinstance(exc, DBAPIError) and exc.orig is not None else str(exc)
        return LeaseStoreError(f"lease store ({self.dialect if hasattr(self, 'dialect') else 'sql'}) could not "
                               f"{action}: {cause}")


_RECORD_COLUMNS = (leases_table.c.request_id, leases_table.c.pool, leases_table.c.table_key, leases_table.c.owner,
                   leases_table.c.seq, leases_table.c.status, leases_table.c.summary, leases_table.c.requested_at,
                   leases_table.c.granted_at, leases_table.c.expires_at)


_REQUEST_COLUMN = pg_statements.ROW_COLUMNS.index("request")   # its place among ``SNAPSHOT``'s row columns
_ROW_COLUMNS = (*_RECORD_COLUMNS, leases_table.c.revision, leases_table.c.model, leases_table.c.max_writers,
                leases_table.c.ttl, leases_table.c.request, leases_table.c.blocker)


#: Columns added since the tables were first created: (table, column, SQL type).
_ADDED_COLUMNS = (("delta_occ_leases", "blocker", "TEXT"), ("delta_occ_lease_pools", "changed_at", "DOUBLE PRECISION"),
                  ("delta_occ_lease_pools", "write_token", "VARCHAR(32)"),
                  ("delta_occ_lease_pools", "table_revs", "JSONB"), ("delta_occ_lease_pools", "tracked_seq", "BIGINT"),
                  ("delta_occ_lease_pools", "limited", "BOOLEAN"), ("delta_occ_lease_pools", "recent_tokens", "JSONB"),
                  ("delta_occ_leases", "reach", "JSONB"))


def _ensure_write_function(conn: Connection) -> str | None:
    """Make ``pg_statements``' write function if the database lacks it; the schema to call it in
    (``pg_statements.call_write``), or ``None`` when this store must send the plain statement (the same write,
    parsed and planned every time). See ``_ensure_function``."""
    return _ensure_function(conn, pg_statements.WRITE_FUNCTION, pg_statements.WRITE_FUNCTION_TYPES,
                            pg_statements.WRITE_FUNCTION_BODY, pg_statements.WRITE_FUNCTION_DEFINITION,
                            "write function",
                            "it sends the plain statement, which the server parses and plans on every write")


def _ensure_at_once_functions(conn: Connection) -> str | None:
    """Make ``pg_at_once``'s acquire and release functions if the database lacks them; the schema to call them
    in, or ``None`` when either cannot be used (every operation then goes the usual way)."""
    schema = None
    for name, types, body, definition in (
            (pg_at_once.ACQUIRE_FUNCTION, pg_at_once.ACQUIRE_FUNCTION_TYPES, pg_at_once.ACQUIRE_BODY,
             pg_at_once.ACQUIRE_DEFINITION),
            (pg_at_once.RELEASE_FUNCTION, pg_at_once.RELEASE_FUNCTION_TYPES, pg_at_once.RELEASE_BODY,
             pg_at_once.RELEASE_DEFINITION)):
        schema = _ensure_function(conn, name, types, body, definition, "one-step function",
                                  "every acquire and release reads the pool before it decides")
        if schema is None:
            return None
    return schema


def _ensure_function(conn: Connection, function: str, types: str, body: str, definition: str, label: str,
                     otherwise: str) -> str | None:
    """Make the store's server-side function ``function`` if the database lacks it; the schema to call it in, or
    ``None`` when it must not be called (``otherwise`` says what the store does then).

    Runs under the schema lock, so processes starting together make it once, in the schema of the store's
    tables, and call it by that schema. A function of that name another role made, or with another body,
    is never called: its name is known from the released source. Nor is one this role may not run; and a
    role that may not create functions there (tables an administrator made for it) does without.
    Why is logged each time a store opens.
    """
    state = conn.exec_driver_sql(pg_statements.WRITE_FUNCTION_STATE,
                                 {"name": function, "types": types, "body": body}).one_or_none()
    if state is None:   # the tables are not where this role's search_path finds them: nowhere to make it
        log.warning("the lease store cannot find the schema of its tables; %s", otherwise)
        return None
    name = pg_at_once.qualified(state.schema, function)
    if state.present:
        refusal = ("another role made it" if not state.trusted else
                   "its source is not this release's" if not state.same_body else
                   f"this role may not execute it (GRANT EXECUTE ON FUNCTION {name} to use it)"
                   if not state.usable else None)
        if refusal is not None:
            log.warning("the lease store does not call its %s %s: %s; %s", label, name, refusal, otherwise)
            return None
        return str(state.schema)
    try:
        with conn.begin_nested():
            conn.exec_driver_sql(f"CREATE FUNCTION {name}{definition}")
    except DBAPIError as exc:
        log.warning("the lease store cannot create its %s %s (%s); %s", label, name, _first_line(exc), otherwise)
        return None
    return str(state.schema)


def _write_function_refused(exc: BaseException) -> bool:
    """Whether ``exc`` (a ``LeaseStoreError``) comes from a call of the write function that the database
    refused before running it: the function does not exist, or this role may not execute it."""
    return _function_refused(exc.__cause__, pg_statements.WRITE_FUNCTION)


def _function_refused(cause: BaseException | None, function: str) -> bool:
    """Whether ``cause`` is the database refusing a call of ``function`` before running it."""
    orig = getattr(cause, "orig", None)
    code = getattr(orig, "pgcode", None)
    message = getattr(getattr(orig, "diag", None), "message_primary", None) or ""
    return (isinstance(cause, DBAPIError) and code in (pg_statements.UNDEFINED_FUNCTION,
                                                       pg_statements.INSUFFICIENT_PRIVILEGE)
            and function in message)


def _first_line(exc: BaseException | None) -> str:
    """The first line of a database error's message (the driver's, without SQLAlchemy's statement dump)."""
    text = str(getattr(exc, "orig", None) or exc or "").strip()
    return (text.splitlines() or [""])[0]


def _add_missing_columns(conn: Connection, dialect: str) -> None:
    """Columns added since the tables were first created (``create_all`` adds tables, not columns)."""
    for table_name, column, sql_type in _ADDED_COLUMNS:
        if column in {c["name"] for c in sa.inspect(conn).get_columns(table_name)}:
            continue
        exists = " IF NOT EXISTS" if dialect == "postgresql" else ""
        try:
            conn.exec_driver_sql(f"ALTER TABLE {table_name} ADD COLUMN{exists} {column} {sql_type}")
        except SQLAlchemyError:   # SQLite: another process added it first (no IF NOT EXISTS there)
            if column not in {c["name"] for c in sa.inspect(conn).get_columns(table_name)}:
                raise


def _remembered_text(remembered: Remembered | None) -> str | None:
    if remembered is None:
        return None
    return json.dumps({"key": list(remembered.key), "request_id": remembered.request_id,  # type: ignore[call-overload]
                       "reason": remembered.reason, "waiter": list(remembered.waiter_key)},  # type: ignore[call-overload]
                      separators=(",", ":"))


def _remembered(text: str | None) -> Remembered | None:
    """A stored ``Remembered``; anything unreadable is forgotten (the pair is then judged again)."""
    if not text:
        return None
    try:
        data = json.loads(text)
        request_id, revision = data["key"]
        waiter_id, waiter_revision = data["waiter"]
        if not (isinstance(request_id, str) and isinstance(revision, int) and request_id == data["request_id"]
                and isinstance(waiter_id, str) and isinstance(waiter_revision, int)):
            return None
        return Remembered((request_id, revision), request_id, str(data["reason"]), (waiter_id, waiter_revision))
    except (ValueError, TypeError, KeyError, RecursionError):
        return None


def _record(row: Any) -> LeaseRecord:
    return LeaseRecord(request_id=row.request_id, pool=row.pool, table=row.table_key, owner=row.owner,
                       seq=int(row.seq), status=LeaseStatus(row.status), summary=row.summary,
                       requested_at=float(row.requested_at),
                       granted_at=None if row.granted_at is None else float(row.granted_at),
                       expires_at=float(row.expires_at))


def _event(row: Any) -> AuditEvent:
    return AuditEvent(at=float(row.at), pool=row.pool, table=row.table_key, request_id=row.request_id,
                      owner=row.owner, kind=AuditKind(row.kind), summary=row.summary, detail=row.detail,
                      event_id=int(row.event_id))


@dataclass(frozen=True)
class _Snapshot:
    """A pool as one statement read it: its revision (``next_seq``; 0 before its first request), live rows in
    arrival order, the database's clock then, and the time and token of its last write."""

    revision: int
    rows: list[Row]
    now: float
    changed_at: float
    token: str | None = None   # the last write's (``pg_statements.WRITE``): tells whether a write landed


@dataclass
class _Transaction:
    """The pool's rows, read once (under the lock, or given from a snapshot); changes are buffered and written
    at the end in few statements (SQLite, under its lock) or in one (PostgreSQL, ``changes_as_json``).

    Statements are round trips, and a pool's lock is held for all of them: an acquire writes one
    INSERT of the request in its final state and one multi-row INSERT of its audit events.
    """

    conn: Connection | None
    pool: str
    now: float
    _next_seq: int
    store: SqlLeaseStore
    _rows: dict[str, Row] | None = None
    _inserted: set[str] = field(default_factory=set)
    _changed: dict[str, Row] = field(default_factory=dict)
    _deleted: set[str] = field(default_factory=set)
    _events: list[AuditEvent] = field(default_factory=list)
    _loaded_revisions: dict[str, int] = field(default_factory=dict)
    _deleted_tables: set[str] = field(default_factory=set)
    _about: set[str] = field(default_factory=set)   # tables an answer depends on (``PoolTransaction.about``)
    blind: bool = False   # a change or an answer whose table is unknown: no landing on a pool that moved

    def __post_init__(self) -> None:
        self.reserved_until = self._next_seq   # arrival numbers below this one are already taken
        if self._rows is not None:
            self._loaded_revisions = {i: row.revision for i, row in self._rows.items()}

    def rows(self) -> list[Row]:
        return sorted(self._loaded().values(), key=lambda r: r.record.seq)

    def changes(self) -> bool:
        """Whether anything is to be written."""
        return bool(self._inserted or self._changed or self._deleted or self._events
                    or self._next_seq > self.reserved_until)

    def changes_as_json(self) -> dict[str, Any]:
        """The changes as the parameters of ``pg_statements.WRITE``."""
        rows = self._rows or {}
        updates = [{"request_id": r.request_id, **_changed_values(r),
                    **(_replanned_values(r) if r.revision != self._loaded_revisions.get(r.request_id)
                       else {"request": None})}
                   for r in self._changed.values()]
        events = [{"n": n, "at": e.at, "pool": e.pool, "table_key": e.table, "request_id": e.request_id,
                   "owner": e.owner, "kind": e.kind.value, "summary": e.summary, "detail": e.detail}
                  for n, e in enumerate(self._events)]
        touched = {row.record.table for row in self.written()} | self._deleted_tables
        return {"inserts": json.dumps([_values(rows[i]) for i in sorted(self._inserted)]),
                "updates": json.dumps(updates), "deletes": sorted(self._deleted), "events": json.dumps(events),
                "touched": json.dumps(sorted(touched)), "checked": json.dumps(sorted(touched | self._about))}

    def written(self) -> Iterator[Row]:
        """The rows this transaction inserts or changes (not every row: ``rows`` sorts the whole pool)."""
        rows = self._rows or {}
        yield from (rows[i] for i in self._inserted)
        yield from self._changed.values()

    def _loaded(self) -> dict[str, Row]:
        if self._rows is None:
            assert self.conn is not None, "a transaction without a connection is given its rows"
            query = sa.select(*_ROW_COLUMNS).where(leases_table.c.pool == self.pool).order_by(leases_table.c.seq)
            self._rows = {r.request_id: self.store._row(r) for r in self.conn.execute(query)}
            self._loaded_revisions = {i: row.revision for i, row in self._rows.items()}
        return self._rows

    def next_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def revision_after(self, revision: int) -> int:
        """The pool's revision once these changes land on ``revision``: past every arrival number handed out."""
        return max(self._next_seq, revision + 1)

    def insert(self, row: Row) -> None:
        self._loaded()[row.request_id] = row
        self._inserted.add(row.request_id)

    def update(self, row: Row) -> None:
        self._loaded()[row.request_id] = row
        if row.request_id not in self._inserted:
            self._changed[row.request_id] = row

    def delete(self, request_id: str) -> None:
        gone = self._loaded().pop(request_id, None)
        self._changed.pop(request_id, None)
        if request_id in self._inserted:
            self._inserted.discard(request_id)
        else:
            self._deleted.add(request_id)
            if gone is None:   # not read here, so its table is unknown: land only on the revision read
                self.blind = True
            else:
                self._deleted_tables.add(gone.record.table)

    def audit(self, event: AuditEvent) -> None:
        self._events.append(event)

    def about(self, table: str | None) -> None:
        if table is None:
            self.blind = True
        else:
            self._about.add(table)

    def flush(self) -> None:
        assert self.conn is not None
        rows = self._rows or {}
        if self._inserted:
            self.conn.execute(leases_table.insert(), [_values(rows[i]) for i in sorted(self._inserted)])
        replanned = [r for r in self._changed.values() if r.revision != self._loaded_revisions.get(r.request_id)]
        for row in replanned:   # a new footprint: rare, one statement each
            self.conn.execute(leases_table.update().where(leases_table.c.request_id == row.request_id)
                              .values(**_changed_values(row), **_replanned_values(row)))
        moved = [r for r in self._changed.values() if r.revision == self._loaded_revisions.get(r.request_id)]
        if moved:   # a release that grants many, or moves many waiters on to another blocker
            _update_many(self.conn, moved)
        if self._deleted:
            self.conn.execute(leases_table.delete().where(leases_table.c.request_id.in_(sorted(self._deleted))))
        if self._events:
            self.conn.execute(audit_table.insert(), [
                {"at": e.at, "pool": e.pool, "table_key": e.table, "request_id": e.request_id, "owner": e.owner,
                 "kind": e.kind.value, "summary": e.summary, "detail": e.detail} for e in self._events])
        if self._next_seq > self.reserved_until:
            self.conn.execute(pools_table.update().where(pools_table.c.name == self.pool)
                              .values(next_seq=self._next_seq))


def _read_params(pool: str, known: _Snapshot | None) -> dict[str, Any]:
    """Parameters of ``pg_statements.SNAPSHOT``, ``LOCK`` and ``QUEUE``: the pool, the revision (and its write's
    token) whose rows are in hand, and how long a transaction may sit idle."""
    return {"pool": pool, "known": -1 if known is None else known.revision,
            "known_token": None if known is None else known.token, "stalled_ms": int(STALLED_TRANSACTION_MS)}


def _changed_values(row: Row) -> dict[str, Any]:
    """The columns a decision may change (status, times, revision, summary, the remembered blocker)."""
    record = row.record
    return {"status": record.status.value, "granted_at": record.granted_at, "expires_at": record.expires_at,
            "revision": row.revision, "summary": record.summary, "blocker": _remembered_text(row.remembered)}


def _replanned_values(row: Row) -> dict[str, Any]:
    """The columns a re-plan changes besides those: the new request and the terms kept beside it."""
    return {"request": row.request.json_text, "model": row.model, "max_writers": row.max_writers, "ttl": row.ttl,
            "reach": pg_at_once.reach_of(row.request, row.revision)}


_CHANGED = ("status", "granted_at", "expires_at", "revision", "summary", "blocker")
_UPDATE_CHANGED = (leases_table.update().where(leases_table.c.request_id == sa.bindparam("changed_id"))
                   .values({name: sa.bindparam(f"changed_{name}") for name in _CHANGED}))


def _update_many(conn: Connection, rows: list[Row]) -> None:
    """One UPDATE statement for ``rows``, executed for each (SQLite: in process; PostgreSQL: in pages of many
    rows per round trip, ``executemany_mode``)."""
    conn.execute(_UPDATE_CHANGED, [{"changed_id": r.request_id,
                                    **{f"changed_{k}": v for k, v in _changed_values(r).items()}} for r in rows])


def _values(row: Row) -> dict[str, Any]:
    record = row.record
    return {"request_id": record.request_id, "pool": record.pool, "table_key": record.table, "owner": record.owner,
            "seq": record.seq, "revision": row.revision, "status": record.status.value, "summary": record.summary,
            "model": row.model, "max_writers": row.max_writers, "ttl": row.ttl, "request": row.request.json_text,
            "requested_at": record.requested_at, "granted_at": record.granted_at, "expires_at": record.expires_at,
            "blocker": _remembered_text(row.remembered), "reach": pg_at_once.reach_of(row.request, row.revision)}


def _now_sql(dialect: str) -> Any:
    """The database's clock in epoch seconds, read after the pool lock is taken."""
    if dialect == "postgresql":
        return sa.extract("epoch", sa.func.clock_timestamp())
    return sa.literal_column("(julianday('now') - 2440587.5) * 86400.0")


def _engine(url: str, options: dict[str, Any]) -> Engine:
    parsed = parse_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = sa.create_engine(parsed, **{"connect_args": {"timeout": 60}, **options})
        sa.event.listen(engine, "connect", _sqlite_connect)
        sa.event.listen(engine, "begin", _sqlite_begin)
        return engine
    if "+" not in parsed.drivername:   # a bare postgresql:// means psycopg 3 to SQLAlchemy 2.1: use the installed one
        parsed = parsed.set(drivername="postgresql+psycopg2")
    if parsed.get_driver_name() != "psycopg2":
        raise LeaseStoreError(f"the PostgreSQL lease store needs the psycopg2 driver (postgresql+psycopg2://...), "
                              f"not {parsed.get_driver_name()!r}: its statements are sent as psycopg2 sends them")
    batched = {"executemany_mode": "values_plus_batch"}
    # Autocommit for every connection, set once when it is made: each write is one statement that commits
    # itself, and reads under READ COMMITTED see a new snapshot per statement anyway. Switching a pooled
    # connection to autocommit at every checkout, and back at every checkin, cost two driver calls per
    # operation (0.2 ms of CPU alone; about 0.8 ms of wall time per call in a profiled worker under the lease
    # benchmark's 16-process load). Not left to ``options``: the
    # writes' atomicity depends on it.
    execution = {k: v for k, v in (options.get("execution_options") or {}).items() if k != "isolation_level"}
    engine = sa.create_engine(parsed, **{"pool_size": 2, "max_overflow": 4, "pool_recycle": 1800, **batched,
                                         **options, "execution_options": execution,
                                         "isolation_level": "AUTOCOMMIT"})
    sa.event.listen(engine, "checkin", _note_checkin)
    sa.event.listen(engine, "checkout", _ping_if_idle)
    return engine


#: A pooled connection idle this long is checked before use (see ``_ping_if_idle``).
IDLE_PING_SECONDS = 5.0


def _note_checkin(dbapi_connection: Any, record: Any) -> None:
    """Note when the connection went idle; end a transaction it still has open, or throw it away.

    ``SqlLeaseStore._transact_locked`` ends its own transactions; this is the guard behind it: SQLAlchemy's
    reset on return cannot end a transaction opened with a ``BEGIN`` statement on an autocommit connection,
    and a connection pooled inside one would keep the pool's lock and turn later autocommit writes into
    writes nobody commits.
    """
    record.info["delta_occ_idle_since"] = time.monotonic()
    status = getattr(getattr(dbapi_connection, "info", None), "transaction_status", _IDLE)
    if status in (_IN_TRANSACTION, _IN_FAILED_TRANSACTION):
        try:
            _run(dbapi_connection, "ROLLBACK")
        except Exception as exc:   # the driver's own error types
            record.invalidate(exc)


# psycopg2's ``connection.info.transaction_status`` values (``psycopg2.extensions.TRANSACTION_STATUS_*``).
_IDLE, _IN_TRANSACTION, _IN_FAILED_TRANSACTION = 0, 2, 3


def _run(dbapi_connection: Any, statement: str) -> None:
    """One statement on a raw DBAPI connection (the pool's events get no SQLAlchemy connection)."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(statement)
    finally:
        cursor.close()


def _queue_key(pool: str, table: str) -> int:
    """The second key of a table's queue lock (``pg_statements.QUEUE``): a digest of the pool and the table, as a
    signed 32-bit integer, the same in every process (Python's ``hash`` is not). A cryptographic digest, so that
    a table name cannot be picked to share another table's queue as cheaply as a CRC's."""
    digest = hashlib.blake2b(f"{pool}\0{table}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


def _transaction_ended(conn: Connection) -> bool:
    """Whether ``conn``'s server-side transaction is over (committed or rolled back), after an error: a message's
    statements after its COMMIT failed, not the write before it."""
    dbapi = conn.connection.dbapi_connection
    return dbapi is not None and dbapi.info.transaction_status == _IDLE


class _QueueTimedOut(Exception):
    """A table's queue did not let this operation in within ``QUEUE_WAIT_MS``."""


def _roll_back(conn: Connection) -> None:
    """End the server-side transaction on ``conn``; a connection that cannot is thrown away (never pooled)."""
    try:
        conn.exec_driver_sql("ROLLBACK")
    except SQLAlchemyError:
        conn.invalidate()


def _ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    """Check a connection that sat idle in the pool before it is used; a dead one is replaced.

    Not every use: a ping is a round trip, and a busy process's connections are seconds old at most (a
    dropped one fails one call, SQLAlchemy then discards the whole pool, and callers poll again). An idle
    one is what a holder has when it releases after minutes of Spark work, or renews after a database
    restart; without the check that release or renewal would fail once, and a failed release leaves the
    next writer waiting for the lease's TTL.
    """
    idle_since = record.info.get("delta_occ_idle_since")
    if idle_since is None or time.monotonic() - idle_since < IDLE_PING_SECONDS:
        return
    try:
        _run(dbapi_connection, "SELECT 1")
        dbapi_connection.rollback()
    except Exception as exc:   # the driver's own error types; the pool retries with a new connection
        raise DisconnectionError(f"idle connection is gone: {exc}") from exc


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event issue BEGIN IMMEDIATE instead of pysqlite's deferred BEGIN, so a
    # transaction holds the write lock before it reads (no read-then-upgrade deadlocks, no stale reads).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=60000")
    cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    read_only = conn.get_execution_options().get("delta_occ_read_only", False)
    conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def _safe(url: str) -> str:
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # a URL that does not parse is still named, without its password
        return masked_url(url)
