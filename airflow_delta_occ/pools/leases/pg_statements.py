"""The two PostgreSQL statements of the optimistic lease store: a pool's snapshot, and a write that lands only
on the snapshot it was decided on.

Each is one round trip in autocommit mode. The write bumps the pool row's ``next_seq`` (its revision) only if
it still holds the revision the decision read; every other change of the statement (new requests, changed
and deleted rows, audit events) is filtered on that bump, so either all of it lands or none of it does.
The bump also stores the write's token, so a writer whose connection died can tell whether it landed.

Why it is safe: every change to a pool's rows is made by a statement that bumps its pool row, and the
bump's row lock is taken before any lease row is touched (the other changes wait on the bump through a
one-time filter). A statement that finds ``next_seq`` unchanged after taking that lock therefore writes
on exactly the rows its decision read, and holds the lock only while the statement runs, never while a
client decides.

One pool, many tables: the grant rule compares requests of one table only, so when a pool has no writer
limit a decision on one table's requests does not depend on the others'. The pool row therefore also
keeps, per table, the revision of the last write that changed its requests (``table_revs``), and a write
whose tables (those it changes, and those its answer depends on: ``LeaseStore``'s ``PoolTransaction.about``)
were changed by nobody since its read lands even though the pool moved (``per_table``). Its
new rows then take arrival numbers after everything that landed in between (their numbers are shifted by
how far the pool moved), so arrival order stays the order of landing. The check reads only the locked
pool row, so it is made on the row's newest version, like the revision's. A write that does not record its
tables (a process of an earlier release) is told by ``tracked_seq`` lagging ``next_seq``: the next write
that records its tables then marks every table changed at that revision (the key ``*``), as it does when
the map passes 256 tables. A pool that holds a request with a writer limit (``limited``, recomputed by every
write that lands on the revision it read) takes only writes on the revision they read. And a view read in a
history a failover lost (the pool went back to an earlier revision, and writes on other tables moved it past
the one read) is told by the token of the write that made the revision it read: the pool row keeps the
tokens of its last 64 revisions (``recent_tokens``), and a write lands past others only on a revision whose
token is still the one it read.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

#: The columns of ``delta_occ_leases`` a decision reads, in ``sql._ROW_COLUMNS`` order.
ROW_COLUMNS: Final = ("request_id", "pool", "table_key", "owner", "seq", "status", "summary", "requested_at",
                      "granted_at", "expires_at", "revision", "model", "max_writers", "ttl", "request", "blocker")

_SELECTED = ", ".join(f"l.{name}" for name in ROW_COLUMNS)

#: The columns before ``ROW_COLUMNS`` in each row of ``SNAPSHOT``: the pool's, the same in every row.
SNAPSHOT_HEAD: Final = ("seen_seq", "seen_at", "seen_token", "db_now")

#: The pool's revision (NULL: no pool row yet), its last write's time and token, the database's clock now, and
#: its live rows in arrival order (one row of NULLs when it has none, or when the revision and the last write's
#: token are still ``known`` and ``known_token``: the caller has those rows already, as every change to them
#: moves the revision; the token tells a revision written twice, by writes a failover lost and the ones after
#: it). ``%(pool)s``, ``%(known)s`` (-1: none known), ``%(known_token)s``. A triggerer polling a thousand
#: waiters of a pool nobody changed reads one short row.
SNAPSHOT = f"""
SELECT p.next_seq AS seen_seq, p.changed_at AS seen_at, p.write_token AS seen_token,
       extract(epoch FROM clock_timestamp()) AS db_now, {_SELECTED}
FROM (SELECT 1) AS one
LEFT JOIN delta_occ_lease_pools AS p ON p.name = %(pool)s
LEFT JOIN delta_occ_leases AS l ON l.pool = %(pool)s
    AND (p.next_seq IS DISTINCT FROM %(known)s OR p.write_token IS DISTINCT FROM %(known_token)s)
ORDER BY l.seq
"""

#: The conditional write. Parameters: ``pool``, ``expected`` (the revision read; 0 for a pool without a
#: row), ``next_seq`` (the revision after the write, when it lands on ``expected``), ``now`` (the decision's
#: time), ``token`` (this write's), ``unchecked`` (true when ``now`` need not be compared with the database's
#: clock: an injected clock, or a time read under the pool's lock), ``touched`` (a JSON array: the tables
#: whose requests the changes insert, change or delete), ``checked`` (those and the tables the operation's
#: answer depends on), ``per_table`` (whether it may land on a pool that moved, on tables not ``checked``
#: only), ``limited`` (whether the pool holds a request with a writer limit), ``seen_token`` (the
#: token of the write that made the revision read), and the
#: changes as JSON arrays (``inserts``, ``updates``, ``events``) and a text array (``deletes``). One row:
#: ``applied``, the new revision (NULL: nothing landed; another value than ``next_seq``: it landed after
#: others, on other tables), and ``db_now``.
WRITE = """
WITH bump AS (
    INSERT INTO delta_occ_lease_pools AS p (name, next_seq, changed_at, write_token, table_revs, tracked_seq,
                                            limited, recent_tokens)
    SELECT %(pool)s, %(next_seq)s, %(now)s, %(token)s,
           (SELECT COALESCE(jsonb_object_agg(t, %(next_seq)s), '{}'::jsonb)
            FROM jsonb_array_elements_text(%(touched)s::jsonb) AS t),
           %(next_seq)s, %(limited)s, jsonb_build_object(%(next_seq)s::text, %(token)s)
    WHERE %(unchecked)s OR %(now)s <= extract(epoch FROM clock_timestamp())
    ON CONFLICT (name) DO UPDATE SET
        next_seq = EXCLUDED.next_seq + p.next_seq - %(expected)s,
        changed_at = GREATEST(p.changed_at, EXCLUDED.changed_at),
        write_token = EXCLUDED.write_token,
        table_revs = CASE WHEN p.tracked_seq IS NOT DISTINCT FROM p.next_seq
                               AND (SELECT count(*) FROM jsonb_object_keys(p.table_revs)) < 256
                          THEN COALESCE(p.table_revs, '{}')
                          ELSE jsonb_build_object('*', p.next_seq) END
                     || (SELECT COALESCE(jsonb_object_agg(t, EXCLUDED.next_seq + p.next_seq - %(expected)s),
                                         '{}'::jsonb)
                         FROM jsonb_array_elements_text(%(touched)s::jsonb) AS t),
        tracked_seq = EXCLUDED.next_seq + p.next_seq - %(expected)s,
        limited = CASE WHEN p.next_seq = %(expected)s THEN EXCLUDED.limited
                       ELSE COALESCE(p.limited, false) OR EXCLUDED.limited END,
        recent_tokens = (SELECT COALESCE(jsonb_object_agg(e.key, e.value), '{}'::jsonb)
                         FROM jsonb_each(COALESCE(p.recent_tokens, '{}'::jsonb)) AS e
                         WHERE e.key::bigint > EXCLUDED.next_seq + p.next_seq - %(expected)s - 64)
                        || jsonb_build_object((EXCLUDED.next_seq + p.next_seq - %(expected)s)::text,
                                              EXCLUDED.write_token)
    WHERE p.next_seq = %(expected)s
       OR (%(per_table)s AND p.tracked_seq = p.next_seq AND NOT COALESCE(p.limited, true)
           AND p.next_seq > %(expected)s AND p.recent_tokens -> (%(expected)s::text) = to_jsonb(%(seen_token)s::text)
           AND NOT jsonb_path_exists(
               p.table_revs, '$.keyvalue() ? (@.value > $seen && (@.key == "*" || @.key == $tables[*]))',
               jsonb_build_object('seen', %(expected)s, 'tables', %(checked)s::jsonb)))
    RETURNING p.next_seq
), inserted AS (
    INSERT INTO delta_occ_leases (request_id, pool, table_key, owner, seq, revision, status, summary, model,
                                  max_writers, ttl, request, requested_at, granted_at, expires_at, blocker, reach)
    SELECT v.request_id, v.pool, v.table_key, v.owner, v.seq + (SELECT next_seq FROM bump) - %(next_seq)s,
           v.revision, v.status, v.summary, v.model,
           v.max_writers, v.ttl, v.request, v.requested_at, v.granted_at, v.expires_at, v.blocker, v.reach
    FROM jsonb_to_recordset(%(inserts)s::jsonb) AS v(
        request_id text, pool text, table_key text, owner text, seq bigint, revision integer, status text,
        summary text, model text, max_writers integer, ttl double precision, request text,
        requested_at double precision, granted_at double precision, expires_at double precision, blocker text,
        reach jsonb)
    WHERE EXISTS (SELECT FROM bump)
), updated AS (
    UPDATE delta_occ_leases AS l
    SET status = v.status, granted_at = v.granted_at, expires_at = v.expires_at, revision = v.revision,
        summary = v.summary, blocker = v.blocker, request = COALESCE(v.request, l.request),
        model = CASE WHEN v.request IS NULL THEN l.model ELSE v.model END,
        max_writers = CASE WHEN v.request IS NULL THEN l.max_writers ELSE v.max_writers END,
        ttl = CASE WHEN v.request IS NULL THEN l.ttl ELSE v.ttl END,
        reach = CASE WHEN v.request IS NULL THEN l.reach ELSE v.reach END
    FROM jsonb_to_recordset(%(updates)s::jsonb) AS v(
        request_id text, status text, granted_at double precision, expires_at double precision, revision integer,
        summary text, blocker text, request text, model text, max_writers integer, ttl double precision,
        reach jsonb)
    WHERE l.request_id = v.request_id AND EXISTS (SELECT FROM bump)
), deleted AS (
    DELETE FROM delta_occ_leases WHERE request_id = ANY(%(deletes)s) AND EXISTS (SELECT FROM bump)
), audited AS (
    INSERT INTO delta_occ_lease_audit (at, pool, table_key, request_id, owner, kind, summary, detail)
    SELECT v.at, v.pool, v.table_key, v.request_id, v.owner, v.kind, v.summary, v.detail
    FROM jsonb_to_recordset(%(events)s::jsonb) AS v(
        n integer, at double precision, pool text, table_key text, request_id text, owner text, kind text,
        summary text, detail text)
    WHERE EXISTS (SELECT FROM bump)
    ORDER BY v.n
)
SELECT (SELECT next_seq FROM bump) AS applied, extract(epoch FROM clock_timestamp())::numeric AS db_now
"""

#: Bounds how long the transaction it runs in may sit idle (``%(stalled_ms)s``): the server then ends the session,
#: and the lock it holds with it. A stricter limit the database or role already sets is kept.
_STALL_LIMIT = """SELECT set_config('idle_in_transaction_session_timeout',
    (SELECT CASE WHEN t.ms > 0 AND t.ms < %(stalled_ms)s THEN t.ms ELSE %(stalled_ms)s END
     FROM (SELECT extract(epoch FROM current_setting('idle_in_transaction_session_timeout')::interval) * 1000 AS ms)
          AS t)::bigint::text, true);"""

#: Sets ``lock_timeout`` for the wait to enter a table's queue: ``%(queue_wait_ms)s``, or less where the server
#: would stop the wait sooner (its own ``lock_timeout``; half its ``statement_timeout`` or ``transaction_timeout``,
#: so that the wait ends as a lock timeout, which the caller takes as "decide without the queue", and not as a
#: cancelled statement or an ended session).
QUEUE_WAIT = """SELECT set_config('lock_timeout', (SELECT LEAST(%(queue_wait_ms)s,
        CASE WHEN t.lock_ms > 0 THEN t.lock_ms END, CASE WHEN t.statement_ms > 0 THEN t.statement_ms / 2 END,
        CASE WHEN t.transaction_ms > 0 THEN t.transaction_ms / 2 END)
    FROM (SELECT extract(epoch FROM current_setting('lock_timeout')::interval) * 1000 AS lock_ms,
                 extract(epoch FROM current_setting('statement_timeout')::interval) * 1000 AS statement_ms,
                 extract(epoch FROM current_setting('transaction_timeout', true)::interval) * 1000 AS transaction_ms)
         AS t)::bigint::text, true);"""

#: Opens a transaction, takes the pool's row lock (a new pool's row is made first), then reads the pool: after
#: the lock, so the read is current. One round trip (several statements in one message); the caller sends
#: ``WRITE`` with ``COMMIT`` next, or ``ROLLBACK``. ``%(pool)s``, ``%(known)s``, ``%(known_token)s`` (as ``SNAPSHOT``),
#: and ``%(stalled_ms)s``: a client that leaves the transaction idle this long (a frozen process, a host cut off
#: from the network) has its session ended by the server, so the lock it holds stops nobody for longer; a dead
#: client's connection is closed anyway, but a stalled one's stays open until TCP gives up, hours later. (A
#: client that stalls while the server still sends it a large answer is not idle: TCP ends that one.)
LOCK = f"""
BEGIN ISOLATION LEVEL READ COMMITTED;
{_STALL_LIMIT}
INSERT INTO delta_occ_lease_pools (name, next_seq) VALUES (%(pool)s, 1) ON CONFLICT (name) DO NOTHING;
SELECT FROM delta_occ_lease_pools WHERE name = %(pool)s FOR UPDATE;
{SNAPSHOT}"""

#: A table's queue (``sql.SqlLeaseStore._transact_queued``): opens a transaction (ended by the server when its
#: client stalls, as ``LOCK``'s: ``%(stalled_ms)s``), waits at most ``%(queue_wait_ms)s`` (``lock_timeout`` for
#: this wait only; then the caller decides without the queue, so a lock on the key held by anybody else delays
#: an operation, never stops it) for its advisory lock
#: ``(%(queue_class)s, %(queue_key)s)`` (the second key a digest of the pool and the table), then reads the pool as
#: ``SNAPSHOT`` does, in one round trip. The lock orders the processes deciding on one table, so they stop missing
#: each other's writes; it decides nothing: every write stays conditional, so a digest two tables share only
#: makes them queue together. The caller sends ``WRITE`` with ``COMMIT`` and ``OUTCOME`` next (``ROLLBACK`` when
#: it has nothing to write): the lock lasts until that commit, so the next in the queue reads after it. A
#: transaction's lock, not the session's: a session lock held between statements would stay with a server
#: connection that a transaction-pooling PgBouncer gives to another client.
QUEUE = f"""
BEGIN ISOLATION LEVEL READ COMMITTED;
{_STALL_LIMIT}
SELECT set_config('delta_occ.outer_lock_timeout', current_setting('lock_timeout'), true);
{QUEUE_WAIT}
SELECT pg_advisory_xact_lock(%(queue_class)s, %(queue_key)s);
SELECT set_config('lock_timeout', current_setting('delta_occ.outer_lock_timeout'), true);
{SNAPSHOT}"""

#: The first key of every table queue's lock ("DELT"): two-key advisory locks of one class, apart from the
#: one-key schema lock and from other applications' locks of other classes.
QUEUE_CLASS: Final = 0x44454C54

#: Sent after ``WRITE`` and ``COMMIT`` in one message (whose answer is its last statement's): whether the write
#: with ``%(token)s`` landed, as ``WRITE``'s answer says it (``applied``: the revision it made, NULL when it did
#: not land; ``db_now``). The pool keeps the tokens of its last 64 revisions, so writes that land between the
#: commit and this read do not hide it. Also how a writer whose answer was lost with its connection learns
#: whether its write landed (``sql.SqlLeaseStore._landed``).
OUTCOME = """
SELECT COALESCE((SELECT e.key::bigint FROM jsonb_each_text(p.recent_tokens) AS e WHERE e.value = %(token)s),
                CASE WHEN p.write_token = %(token)s THEN p.next_seq END) AS applied,
       extract(epoch FROM clock_timestamp())::numeric AS db_now
FROM (SELECT 1) AS one
LEFT JOIN delta_occ_lease_pools AS p ON p.name = %(pool)s
"""


# -- the write as a server-side function --------------------------------------------------------------------------
#
# Sent as text, ``WRITE`` is parsed and planned on every call: about 60% of its round trip on an idle server
# (planning 0.6 ms and the parse of its ~10 kB of text, against 0.8 ms of execution, for one acquire), time the
# server spends before the statement takes the pool row's lock but CPU every writer pays. A PL/pgSQL function
# keeps its statements' plans for the session, so the same statement through ``call_write`` is parsed once per
# connection and its plan kept (a generic plan: the plan never decides what the statement does). Named
# statements (``PREPARE``) would do the same per connection but break behind a transaction-pooling PgBouncer;
# a function lives in the database, so every connection finds it.

#: ``WRITE``'s parameters in order, with the types the function declares. ``now`` stays ``numeric``: as a
#: literal it always was, so its comparison with the database's clock is exact, not rounded to a double.
WRITE_PARAMETERS: Final = (
    ("pool", "text"), ("next_seq", "bigint"), ("now", "numeric"), ("token", "text"), ("touched", "text"),
    ("limited", "boolean"), ("unchecked", "boolean"), ("expected", "bigint"), ("per_table", "boolean"),
    ("seen_token", "text"), ("checked", "text"), ("inserts", "text"), ("updates", "text"), ("deletes", "text[]"),
    ("events", "text"),
)

#: The function's argument types, as ``CREATE FUNCTION`` and ``to_regprocedure`` spell them.
WRITE_FUNCTION_TYPES: Final = ", ".join(kind for _, kind in WRITE_PARAMETERS)


def _write_function() -> tuple[str, str, str, str]:
    """The function's name, its body, the rest of its ``CREATE`` statement after the name, and the call's
    arguments (``WRITE``'s parameters, cast to the declared types).

    The name carries a digest of the whole definition, so a release that changes ``WRITE`` or the function
    around it creates a new function beside the old one: processes of both releases can run during a rolling
    upgrade, each calling the statement it was written for, and no process replaces one another is running.
    ``db_now`` is cast to ``numeric`` in ``WRITE`` itself: ``extract`` gives ``double precision`` before
    PostgreSQL 14, and ``RETURN QUERY`` does not cast to the declared result.
    """
    position = {name: n for n, (name, _) in enumerate(WRITE_PARAMETERS, start=1)}
    used = set(re.findall(r"%\((\w+)\)s", WRITE))
    if used != set(position):
        raise AssertionError(f"WRITE_PARAMETERS does not match WRITE's parameters: {sorted(used ^ set(position))}")
    body = ("\n#variable_conflict use_column\nBEGIN\nRETURN QUERY "
            + re.sub(r"%\((\w+)\)s", lambda m: f"${position[m.group(1)]}", WRITE) + ";\nEND\n")
    definition = (f"({WRITE_FUNCTION_TYPES}) RETURNS TABLE (applied bigint, db_now numeric)"
                  f"\nLANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $delta_occ${body}$delta_occ$")
    name = "delta_occ_lease_write_" + hashlib.sha256(definition.encode()).hexdigest()[:12]
    arguments = ", ".join(f"%({param})s::{kind}" for param, kind in WRITE_PARAMETERS)
    return name, body, definition, arguments


#: The function's name and body (its source as ``pg_proc.prosrc`` keeps it), what follows the name in its
#: ``CREATE FUNCTION``, and the arguments of a call. ``SqlLeaseStore`` makes it once per database, in the
#: schema of its tables, under its schema lock, and calls it by that schema (``call_write``).
WRITE_FUNCTION, WRITE_FUNCTION_BODY, WRITE_FUNCTION_DEFINITION, _WRITE_ARGUMENTS = _write_function()

#: The function as the store finds it in the schema of ``delta_occ_lease_pools`` (one row; the function's
#: columns NULL when it is missing): the schema; whether its owner is this role or the tables' owner (a
#: function of that name made by another role is never called: its name is known from the released source,
#: and calling it would run someone else's SQL with this role's rights); whether its source is this
#: release's; whether this role may run it (a hardened database revokes EXECUTE from PUBLIC).
#: ``%(name)s``, ``%(types)s`` (the argument types, so that a function of that name with other arguments, which
#: the call never picks, is not confused with it), ``%(body)s``.
WRITE_FUNCTION_STATE = """
SELECT n.nspname AS schema, p.oid IS NOT NULL AS present,
       p.proowner IN (c.relowner, (SELECT oid FROM pg_roles WHERE rolname = current_user)) AS trusted,
       p.prosrc = %(body)s AS same_body, has_function_privilege(p.oid, 'EXECUTE') AS usable
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_proc AS p
    ON p.oid = to_regprocedure(quote_ident(n.nspname) || '.' || %(name)s || '(' || %(types)s || ')')
WHERE c.oid = to_regclass('delta_occ_lease_pools')
"""


def qualified_write_function(schema: str) -> str:
    """The function's name in ``schema``, quoted as an identifier."""
    return '"{}"."{}"'.format(schema.replace('"', '""'), WRITE_FUNCTION)


def create_write_function(schema: str) -> str:
    """``CREATE FUNCTION`` for the function in ``schema`` (the schema of the store's tables)."""
    return f"CREATE FUNCTION {qualified_write_function(schema)}{WRITE_FUNCTION_DEFINITION}"


def call_write(schema: str) -> str:
    """``WRITE`` through the function in ``schema``: the same parameters, the same one-row answer."""
    return f"SELECT applied, db_now FROM {qualified_write_function(schema)}({_WRITE_ARGUMENTS})"


#: PostgreSQL's error codes for a function that does not exist (``undefined_function``; also an operator that
#: does not exist, so the message is checked too) and for one this role may not run (``insufficient_privilege``).
UNDEFINED_FUNCTION, INSUFFICIENT_PRIVILEGE = "42883", "42501"

#: PostgreSQL's error code for a lock not granted within ``lock_timeout`` (a table's queue, ``QUEUE``).
LOCK_NOT_AVAILABLE: Final = "55P03"
