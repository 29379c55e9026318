"""Acquire and release in one round trip on PostgreSQL, where the server can tell the answer by itself.

On a pool many processes write (a shared pool: every table of a platform in one), an operation had to read
the pool before it decided, because somebody else had written it since: two round trips, one of them the
table's queue (``pg_statements.QUEUE``), and a decision in Python on rows it had to fetch and decode. Most
operations of a busy pool need none of that:

* an **acquire** whose partitions are apart from those of every live request of its table (a backfill's
  dates, one pipeline per country) is granted at once by the grant rule (``arbiter``: rule 3, nothing holding
  or waiting before it can conflict);
* a **release** on a table where nobody waits hands nothing over.

Each is decided here by a server-side function, in one call: it takes the pool row's lock (as every write of
the store does, before any lease row is touched: ``pg_statements``), reads the table's rows after the lock,
and either writes the grant or the release with the pool's revision bumped, or writes nothing and answers
NULL; the caller then goes the usual way (``sql.SqlLeaseStore``), which decides everything the function does
not: expiries, hand-overs, writer limits, asking again, ownership errors.

What the server compares is each request's *reach* (``compare.Reach``: the partitions the job can touch, per
partition column) as ``reach_of`` makes it beside the stored request: per column, one token per value. Two
values a filter holds equal always get the same token (``_token``), and a value without an exact token leaves
its column out, so tokens that share nothing mean values that share nothing (``Reach.apart``), and every
doubt reads as "may meet": the call then writes nothing. A token set is kept with the revision of the request
it was made for, so a re-planned request whose tokens a process of an older release did not renew is never
judged on the old ones.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from decimal import Decimal
from typing import Any, Final

from ..requests import LeaseRequest
from . import pg_statements

#: The form of ``reach_of``; part of every layout key, so a release that changes the tokens never compares its
#: tokens with another release's. Move it whenever what the tokens are made from changes what it gives
#: (``compare.reach``, ``predicates.comparison_key``, ``_token``): tokens stored by the older code are then
#: never compared with the new ones.
_FORM: Final = 1


def _token(key: Any) -> str | None:
    """One token per value a filter compares (``predicates.comparison_key``): equal keys give equal tokens;
    ``None`` for a kind of value without an exact one (its column is then left out). Every token is ASCII, so
    that any value (a NUL, a lone surrogate, any database encoding) can be stored and compared as JSON."""
    if isinstance(key, tuple) and len(key) == 2 and key[0] == 0:   # a number: ints and doubles by value
        number = key[1]
        if isinstance(number, bool):
            return None
        if isinstance(number, int):
            return f"n:{int(number)}"
        if isinstance(number, float) and math.isfinite(number):
            return f"n:{int(number)}" if number.is_integer() else f"n:{float.__repr__(float(number))}"
        return None
    if isinstance(key, tuple) and key == (1, 0.0):   # NaN, equal to itself in a filter
        return "nan"
    if isinstance(key, bool):   # True == Decimal(1) in Python: a bool is compared as that number
        return _decimal_token(Decimal(int(key)))
    if isinstance(key, str):
        return "s:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    if isinstance(key, Decimal):
        return _decimal_token(key) if key.is_finite() else None
    if isinstance(key, dt.datetime):
        return None   # naive and aware times, time zones: no token is worth the doubt
    if isinstance(key, dt.date):
        return f"D:{key.isoformat()}"
    return None


def _decimal_token(value: Decimal) -> str:
    """A finite decimal's exact value as digits without leading or trailing zeros and an exponent
    (``Decimal.normalize`` would round to the context's precision, which differs between processes that set it)."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    whole = "".join(map(str, digits)).lstrip("0")
    if not whole:
        return "d:0"
    significant = whole.rstrip("0")
    return f"d:{'-' if sign else ''}{significant}e{exponent + len(whole) - len(significant)}"


def reach_of(request: LeaseRequest, revision: int) -> dict[str, Any] | None:
    """The request's reach as the server compares it (stored as JSON), made for its ``revision``; ``None`` when it
    may touch any partition or has no column with exact tokens (it is then apart from nothing)."""
    reach = request.reach
    if reach is None or reach.columns is None:
        return None
    columns: dict[str, list[str]] = {}
    for index, values in enumerate(reach.columns):
        if values is None or None in values:
            continue
        tokens = [_token(v) for v in values]
        if not tokens or any(t is None for t in tokens):
            continue
        columns[str(index)] = sorted({t for t in tokens if t is not None})
    if not columns:
        return None
    kind = json.dumps([_FORM, request.model, [list(c) for c in reach.layout]], separators=(",", ":"))
    return {"k": hashlib.sha256(kind.encode()).hexdigest(), "r": revision, "c": columns}


# -- the functions -------------------------------------------------------------------------------------------------

#: The pool row after a write: its revision moved by one, this write's token, its table's revision, the last 64
#: tokens; as ``pg_statements.WRITE`` keeps them, so the optimistic writes of other processes see this one.
_BUMP = """
    UPDATE delta_occ_lease_pools AS q SET
        next_seq = p.next_seq + 1,
        changed_at = GREATEST(p.changed_at, now_),
        write_token = a_token,
        table_revs = CASE WHEN (SELECT count(*) FROM jsonb_object_keys(COALESCE(p.table_revs, '{}'::jsonb))) < 256
                          THEN COALESCE(p.table_revs, '{}'::jsonb)
                          ELSE jsonb_build_object('*', p.next_seq) END
                     || jsonb_build_object(table_, p.next_seq + 1),
        tracked_seq = p.next_seq + 1,
        recent_tokens = (SELECT COALESCE(jsonb_object_agg(e.key, e.value), '{}'::jsonb)
                         FROM jsonb_each(COALESCE(p.recent_tokens, '{}'::jsonb)) AS e
                         WHERE e.key::bigint > p.next_seq + 1 - 64)
                        || jsonb_build_object((p.next_seq + 1)::text, a_token)
    WHERE q.name = a_pool;"""

#: Takes its table's turn in the table's queue (``pg_statements.QUEUE``: the advisory lock the usual way reads
#: the pool in, so that a call never lands between another process's read there and its write, which would then
#: miss), waiting at most ``a_wait_ms`` for it and for the pool's lock (then PostgreSQL raises
#: ``lock_not_available`` and the caller goes the usual way); then takes the pool row's lock and reads it. No
#: answer (NULL) for a pool without a row, one whose writes did not all record their tables (a process of an
#: older release), or one that holds a request with a writer limit (the limit counts every table's holders).
#: ``now_`` is the injected clock, else the database's, never before the pool's last write.
_LOCK_POOL = f"""
    outer_lock_timeout := current_setting('lock_timeout');
    {pg_statements.QUEUE_WAIT.replace("SELECT set_config", "PERFORM set_config", 1).replace(
        "%(queue_wait_ms)s", "a_wait_ms")}
    PERFORM pg_advisory_xact_lock(a_queue_class, a_queue_key);
    PERFORM set_config('lock_timeout', outer_lock_timeout, true);
    SELECT * INTO p FROM delta_occ_lease_pools WHERE name = a_pool FOR UPDATE;
    IF NOT FOUND OR p.tracked_seq IS DISTINCT FROM p.next_seq OR COALESCE(p.limited, true) THEN
        RETURN QUERY SELECT NULL::bigint, NULL::numeric, extract(epoch FROM clock_timestamp())::numeric;
        RETURN;
    END IF;
    now_ := COALESCE(a_now, GREATEST(extract(epoch FROM clock_timestamp())::numeric,
                                     COALESCE(p.changed_at, 0)::numeric));"""

#: Grants a new request at once when every live request of its table is apart from it. Arguments: the pool, the
#: table, the owner, the injected clock (NULL: the database's), this write's token, the new row (JSON: its id,
#: summary, model, TTL, request text and reach), and the request event's detail. Answers the pool's revision
#: after the write and the time it was made at (both NULL: nothing written), and the database's clock.
ACQUIRE_BODY: Final = f"""
DECLARE
    p record;
    now_ numeric;
    table_ text := a_table;
    outer_lock_timeout text;
    mine jsonb := a_row::jsonb;
    my_reach jsonb := a_row::jsonb -> 'reach';
BEGIN
{_LOCK_POOL}
    IF my_reach IS NULL OR EXISTS (
        SELECT FROM delta_occ_leases AS l
        WHERE l.pool = a_pool AND l.table_key = a_table
          AND (l.owner = a_owner OR l.expires_at <= now_ OR l.max_writers IS NOT NULL OR l.reach IS NULL
               OR (l.reach ->> 'r') IS DISTINCT FROM l.revision::text
               OR (l.reach ->> 'k') IS DISTINCT FROM (my_reach ->> 'k')
               OR NOT EXISTS (
                   SELECT FROM jsonb_each(my_reach -> 'c') AS m(col, vals)
                   WHERE (l.reach -> 'c') ? m.col
                     AND NOT ((l.reach -> 'c' -> m.col) ?| ARRAY(SELECT jsonb_array_elements_text(m.vals))))))
    THEN
        RETURN QUERY SELECT NULL::bigint, NULL::numeric, extract(epoch FROM clock_timestamp())::numeric;
        RETURN;
    END IF;
    INSERT INTO delta_occ_leases (request_id, pool, table_key, owner, seq, revision, status, summary, model,
                                  max_writers, ttl, request, requested_at, granted_at, expires_at, blocker, reach)
    VALUES (mine ->> 'request_id', a_pool, a_table, a_owner, p.next_seq, 0, 'granted', mine ->> 'summary',
            mine ->> 'model', NULL, (mine ->> 'ttl')::double precision, mine ->> 'request', now_::double precision,
            now_::double precision, (now_ + (mine ->> 'ttl')::numeric)::double precision, NULL, my_reach);
    INSERT INTO delta_occ_lease_audit (at, pool, table_key, request_id, owner, kind, summary, detail)
    VALUES (now_::double precision, a_pool, a_table, mine ->> 'request_id', a_owner, 'request', mine ->> 'summary',
            a_detail),
           (now_::double precision, a_pool, a_table, mine ->> 'request_id', a_owner, 'grant', mine ->> 'summary',
            'waited 0.000 s');
{_BUMP}
    RETURN QUERY SELECT p.next_seq + 1, now_, extract(epoch FROM clock_timestamp())::numeric;
END
"""

#: Releases a lease (or gives up a waiting request) when nobody waits on its table: nothing is handed over.
#: Arguments: the pool, the request's id, its owner, the injected clock, this write's token, the note for the
#: audit line. Answers as ``ACQUIRE_BODY``; NULL also for a request that is not this owner's, or gone (the usual
#: way then tells which).
RELEASE_BODY: Final = f"""
DECLARE
    p record;
    r record;
    outer_lock_timeout text;
    now_ numeric;
    table_ text;
BEGIN
{_LOCK_POOL}
    SELECT * INTO r FROM delta_occ_leases AS l WHERE l.request_id = a_request_id AND l.pool = a_pool;
    IF NOT FOUND OR r.owner IS DISTINCT FROM a_owner OR r.table_key IS DISTINCT FROM a_table OR EXISTS (
        SELECT FROM delta_occ_leases AS l
        WHERE l.pool = a_pool AND l.table_key = r.table_key AND l.status <> 'granted')
    THEN
        RETURN QUERY SELECT NULL::bigint, NULL::numeric, extract(epoch FROM clock_timestamp())::numeric;
        RETURN;
    END IF;
    table_ := r.table_key;
    DELETE FROM delta_occ_leases AS l WHERE l.request_id = a_request_id;
    INSERT INTO delta_occ_lease_audit (at, pool, table_key, request_id, owner, kind, summary, detail)
    VALUES (now_::double precision, a_pool, r.table_key, r.request_id, r.owner, 'release', r.summary,
            concat_ws('; ', 'held ' || round(now_ - COALESCE(r.granted_at::numeric, now_), 3)::text || ' s',
                      NULLIF(a_note, '')));
{_BUMP}
    RETURN QUERY SELECT p.next_seq + 1, now_, extract(epoch FROM clock_timestamp())::numeric;
END
"""

_QUEUE_TYPES = "a_queue_class integer, a_queue_key integer, a_wait_ms integer"
ACQUIRE_TYPES: Final = ("a_pool text, a_table text, a_owner text, a_now numeric, a_token text, a_row text, "
                        f"a_detail text, {_QUEUE_TYPES}")
RELEASE_TYPES: Final = ("a_pool text, a_table text, a_request_id text, a_owner text, a_now numeric, a_token text, "
                        f"a_note text, {_QUEUE_TYPES}")


def _function(prefix: str, arguments: str, body: str) -> tuple[str, str, str]:
    """The function's name (a digest of its whole definition, as ``pg_statements``' write function: releases side
    by side never call each other's), its definition after the name, and its argument types."""
    types = ", ".join(part.split()[1] for part in arguments.split(", "))
    definition = (f"({arguments}) RETURNS TABLE (applied bigint, decided_at numeric, db_now numeric)\n"
                  f"LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $delta_occ${body}$delta_occ$")
    return prefix + hashlib.sha256(definition.encode()).hexdigest()[:12], definition, types


ACQUIRE_FUNCTION, ACQUIRE_DEFINITION, ACQUIRE_FUNCTION_TYPES = _function(
    "delta_occ_lease_acquire_", ACQUIRE_TYPES, ACQUIRE_BODY)
RELEASE_FUNCTION, RELEASE_DEFINITION, RELEASE_FUNCTION_TYPES = _function(
    "delta_occ_lease_release_", RELEASE_TYPES, RELEASE_BODY)


def qualified(schema: str, name: str) -> str:
    """``name`` in ``schema``, quoted as identifiers."""
    return '"{}"."{}"'.format(schema.replace('"', '""'), name)


def call_acquire(schema: str) -> str:
    return (f"SELECT applied, decided_at, db_now FROM {qualified(schema, ACQUIRE_FUNCTION)}(%(pool)s, %(table)s, "
            "%(owner)s, %(now)s::numeric, %(token)s, %(row)s, %(detail)s, %(queue_class)s, %(queue_key)s, "
            "%(wait_ms)s)")


def call_release(schema: str) -> str:
    return (f"SELECT applied, decided_at, db_now FROM {qualified(schema, RELEASE_FUNCTION)}(%(pool)s, %(table)s, "
            "%(request_id)s, %(owner)s, %(now)s::numeric, %(token)s, %(note)s, %(queue_class)s, %(queue_key)s, "
            "%(wait_ms)s)")
