"""One-step acquire and release on PostgreSQL (``pg_at_once``): one call each where the server can decide alone,
and never a grant the grant rule would not make.

The server grants a new request at once only when every live request of its table is apart from it, compared
on the partition tokens stored beside each request. The differential test below runs every ordered pair of the
planner's menus through the one-step acquire and through the rule itself (the memory store, which decides with
``arbiter.decide``): a one-step grant the rule would refuse is two conflicting leases held at once.
"""

# ruff: noqa: F811 - the contract's fixtures are parameters of the tests
from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.planner import MODELS, TableState, plan_footprint
from airflow_delta_occ.exceptions import LeaseOwnershipError
from airflow_delta_occ.pools.leases import pg_at_once, pg_statements, sql
from airflow_delta_occ.pools.leases.memory import MemoryLeaseStore
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
from airflow_delta_occ.pools.requests import AuditKind, LeaseRequest, LeaseStatus

from ..unit.engine.logbuilder import SCHEMA, LogBuilder, add, commit_info, metadata, protocol
from ..unit.pools.contract import Clock, Request, request_for, table  # noqa: F401 - fixtures of the contract
from ..unit.pools.test_compare import PARTITIONED_MENU
from ..unit.pools.test_reach import MORE_PARTITIONED

pytestmark = pytest.mark.postgres


@pytest.fixture
def stores(postgres_url: str) -> Iterator[tuple[SqlLeaseStore, SqlLeaseStore]]:
    """Two stores on one database: two processes, each with its own view of the pools."""
    with SqlLeaseStore(postgres_url) as one, SqlLeaseStore(postgres_url) as other:
        yield one, other


def calls(store: SqlLeaseStore) -> list[str]:
    """Every statement ``store`` sends from now on: ``ACQUIRE`` / ``RELEASE`` for a one-step call, else its first
    word (``QUEUE`` for a table's queue with its read)."""
    sent: list[str] = []

    def note(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if pg_at_once.ACQUIRE_FUNCTION in statement:
            sent.append("ACQUIRE")
        elif pg_at_once.RELEASE_FUNCTION in statement:
            sent.append("RELEASE")
        elif statement == pg_statements.QUEUE:
            sent.append("QUEUE")
        else:
            sent.append(statement.strip().split()[0])
    sa.event.listen(store.engine, "before_cursor_execute", note)
    return sent


def test_a_shared_pool_grants_and_releases_apart_requests_in_one_call_each(
        stores: tuple[SqlLeaseStore, SqlLeaseStore], request_for: Request) -> None:
    one, other = stores
    neighbour = other.acquire(request_for("neighbour", "UPDATE", "country = 'FR'"))   # another process's lease
    sent = calls(one)
    for i in range(3):
        state = one.acquire(request_for(f"w{i}", "UPDATE", "country = 'DE'"))
        assert state.granted and state.record is not None and state.record.owner == f"w{i}"
        assert [r.owner for r in other.holders(pool="sales")] == ["neighbour", f"w{i}"]
        assert one.release(state.request_id, f"w{i}")
        moved = other.acquire(request_for(f"x{i}", "UPDATE", "country = 'IT'"))   # the pool moves between them
        assert other.release(moved.request_id, f"x{i}")
    assert sent.count("ACQUIRE") == 3 and sent.count("RELEASE") == 3
    assert [s for s in sent if s not in ("ACQUIRE", "RELEASE", "SELECT")] == [], sent   # SELECT: holders()
    assert one.writes["at_once"] == 6 and one.writes["at_once_declined"] == 0
    assert neighbour.granted


def test_a_one_step_grant_is_stored_and_audited_as_the_usual_way_stores_it(
        stores: tuple[SqlLeaseStore, SqlLeaseStore], request_for: Request) -> None:
    one, other = stores
    other.acquire(request_for("neighbour", "UPDATE", "country = 'FR'"))
    request = request_for("w", "UPDATE", "country = 'DE'")
    state = one.acquire(request)
    assert one.writes["at_once"] == 1
    [record] = [r for r in other.records(pool="sales") if r.owner == "w"]
    assert record == state.record   # what the caller was told is what is stored
    assert record.granted_at == record.requested_at and record.expires_at == pytest.approx(record.granted_at + 30.0)
    assert other.revision("sales") == record.seq + 1
    assert one.release(state.request_id, "w", note="stopped early by version 7")
    events = [e for e in other.history(pool="sales") if e.request_id == state.request_id]
    assert [e.kind for e in events] == [AuditKind.REQUEST, AuditKind.GRANT, AuditKind.RELEASE]
    assert LeaseRequest.from_json_text(events[0].detail) == request
    assert events[1].detail == "waited 0.000 s"
    assert events[2].detail.startswith("held ") and events[2].detail.endswith(" s; stopped early by version 7")


@pytest.mark.parametrize("table_key", ["t", "*", "$.a[*] ? (@ == 1)", "t'; DROP TABLE delta_occ_leases; --",
                                       "${spark.x} %(pool)s %s"])
def test_a_view_remembered_before_a_one_step_grant_is_not_decided_on(
        stores: tuple[SqlLeaseStore, SqlLeaseStore], request_for: Request, monkeypatch: pytest.MonkeyPatch,
        table_key: str) -> None:
    """Also with table keys that mean something to the pool row's per-table map (``*``: every table), to jsonpath,
    to SQL or to a driver's placeholders: each is the table's name, and the one-step write moves that table."""
    one, other = stores
    other.acquire(request_for("neighbour", "UPDATE", "country = 'FR'", table_key=table_key))   # remembered so
    granted = one.acquire(request_for("w", "UPDATE", "country = 'DE'", table_key=table_key))
    assert one.writes["at_once"] == 1
    assert [r.table for r in other.records(pool="sales")] == [table_key, table_key]
    monkeypatch.setattr(sql, "AT_ONCE", False)   # ``other`` decides on its remembered view, which lacks ``w``
    late = other.acquire(request_for("late", "UPDATE", "country = 'DE'", table_key=table_key))
    assert late.status is LeaseStatus.WAITING and late.blockers[0].request_id == granted.request_id
    assert other.writes["missed"] >= 1   # its write on the old view did not land


@pytest.mark.parametrize("held", [("OPTIMIZE", None), ("UPDATE", "country = 'DE' AND id > 3"),
                                  ("UPDATE", "date = '2024-01-01' OR id = 7")])
def test_a_request_that_may_meet_a_live_one_is_decided_the_usual_way(
        stores: tuple[SqlLeaseStore, SqlLeaseStore], request_for: Request, held: tuple[str, str | None]) -> None:
    one, other = stores
    holder = other.acquire(request_for("holder", *held))
    state = one.acquire(request_for("w", "UPDATE", "country = 'DE'"))
    assert one.writes["at_once"] == 0 and one.writes["at_once_declined"] == 1
    assert state.status is LeaseStatus.WAITING and state.blockers[0].request_id == holder.request_id


def test_an_expired_lease_on_the_table_is_expired_the_usual_way(postgres_url: str, request_for: Request) -> None:
    clock = Clock(1_800_000_000.0)
    with SqlLeaseStore(postgres_url, clock=clock) as store:
        gone = store.acquire(request_for("gone", "UPDATE", "country = 'FR'", ttl=5.0))
        clock.now += 10
        declined = store.writes["at_once_declined"]   # (the pool's first request: no pool row to lock yet)
        state = store.acquire(request_for("w", "UPDATE", "country = 'DE'"))
        assert state.granted and store.writes["at_once_declined"] == declined + 1
        assert [e.kind for e in store.history(pool="sales") if e.request_id == gone.request_id][-1] is AuditKind.EXPIRE


def test_asking_again_and_a_writer_limit_are_decided_the_usual_way(stores: tuple[SqlLeaseStore, SqlLeaseStore],
                                                                   request_for: Request) -> None:
    one, _ = stores
    first = one.acquire(request_for("w", "UPDATE", "country = 'DE'"))
    declined = one.writes["at_once_declined"]   # (the pool's first request: no pool row to lock yet)
    again = one.acquire(request_for("w", "UPDATE", "country = 'DE'"))
    assert again.request_id == first.request_id and one.writes["at_once_declined"] == declined + 1
    limited = one.acquire(request_for("l", "UPDATE", "country = 'IT'", max_writers=2))   # never offered
    assert limited.granted and one.writes["at_once_declined"] == declined + 1
    assert one.acquire(request_for("m", "UPDATE", "country = 'FR'")).granted   # the pool holds a limit now
    assert one.writes["at_once_declined"] == declined + 2 and one.writes["at_once"] == 0
    assert one.release(limited.request_id, "l")   # the usual way: the pool is limited
    # the mark stays until a write decided on rows without a limit lands (the release's rows still held one)
    assert one.acquire(request_for("x", "UPDATE", "country = 'IT'")).granted
    assert one.acquire(request_for("y", "INSERT", None, write_partitions=[
        {"date": "2024-01-05", "country": "ES"}])).granted
    assert one.writes["at_once"] == 1


def test_a_release_with_a_waiter_on_its_table_hands_over_the_usual_way(
        stores: tuple[SqlLeaseStore, SqlLeaseStore], request_for: Request) -> None:
    one, other = stores
    held = one.acquire(request_for("held", "UPDATE", "country = 'DE'"))
    waiting = other.acquire(request_for("waiting", "OPTIMIZE", None))
    assert waiting.status is LeaseStatus.WAITING
    sent = calls(one)
    assert one.release(held.request_id, "held")
    assert "RELEASE" in sent and one.writes["at_once_declined"] >= 1
    assert other.poll(waiting.request_id, "waiting").granted   # granted by the release, not by the poll's own turn
    assert [e.kind for e in other.history(pool="sales")
            if e.request_id == waiting.request_id][-1] is AuditKind.GRANT


def test_a_release_by_another_owner_is_refused_and_a_gone_one_is_false(
        stores: tuple[SqlLeaseStore, SqlLeaseStore], request_for: Request) -> None:
    one, other = stores
    state = one.acquire(request_for("w", "UPDATE", "country = 'DE'"))
    other._table_of[state.request_id] = "t"   # the other process knows the table: it would try the one step
    other._pool_of[state.request_id] = "sales"
    with pytest.raises(LeaseOwnershipError):
        other.release(state.request_id, "intruder")
    assert [r.owner for r in one.holders(pool="sales")] == ["w"]
    assert one.release(state.request_id, "w")
    assert not one.release(state.request_id, "w")


def test_tokens_of_a_request_re_planned_by_an_older_release_are_not_trusted(
        stores: tuple[SqlLeaseStore, SqlLeaseStore], request_for: Request) -> None:
    """A process of an earlier release re-plans a waiter without renewing its tokens; its revision moves, so the
    tokens (made for revision 0) no longer speak for it."""
    one, other = stores
    other.acquire(request_for("holder", "UPDATE", "country = 'FR'"))
    with one.engine.connect() as conn:   # as that process's write leaves the row: a new revision, the old tokens
        conn.exec_driver_sql("UPDATE delta_occ_leases SET revision = 1 WHERE owner = 'holder'")
    state = one.acquire(request_for("w", "UPDATE", "country = 'DE'"))
    assert state.granted and one.writes["at_once_declined"] == 1 and one.writes["at_once"] == 0


def test_a_request_stored_without_tokens_is_apart_from_nothing(stores: tuple[SqlLeaseStore, SqlLeaseStore],
                                                               request_for: Request) -> None:
    one, other = stores
    other.acquire(request_for("old", "UPDATE", "country = 'FR'"))
    with one.engine.connect() as conn:   # stored by a release before the tokens
        conn.exec_driver_sql("UPDATE delta_occ_leases SET reach = NULL")
    assert one.acquire(request_for("w", "UPDATE", "country = 'DE'")).granted
    assert one.writes["at_once_declined"] == 1


def test_a_held_queue_sends_the_operation_the_usual_way(postgres_url: str, request_for: Request,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sql, "QUEUE_WAIT_MS", 300)
    with SqlLeaseStore(postgres_url) as store, store.engine.connect() as squatter:
        store.acquire(request_for("first", "UPDATE", "country = 'FR'"))
        squatter.exec_driver_sql("BEGIN")
        squatter.exec_driver_sql("SELECT pg_advisory_xact_lock(%(c)s, %(k)s)",
                                 {"c": pg_statements.QUEUE_CLASS, "k": sql._queue_key("sales", "t")})
        state = store.acquire(request_for("w", "UPDATE", "country = 'DE'"))
        assert state.granted and store.writes["queue_timed_out"] == 1 and store.writes["at_once"] == 0
        squatter.exec_driver_sql("ROLLBACK")


# -- never a grant the rule would not make -----------------------------------------------------------------------

INT_PARTITIONED: list[tuple[str, str | None, dict[str, Any]]] = [
    ("UPDATE", "id = 1", {}),
    ("UPDATE", "id = 1.0", {}),
    ("DELETE", "id IN (1, 2)", {}),
    ("UPDATE", "id = 2", {}),
    ("UPDATE", "id = 3 AND name = 'x'", {}),
    ("INSERT", None, {"write_partitions": [{"id": "1"}]}),
    ("INSERT", None, {"write_partitions": [{"id": "4"}]}),
    ("OPTIMIZE", "id = 4", {}),
    ("UPDATE", "id IS NULL", {}),
]


def _int_table(root: Path) -> Path:
    b = LogBuilder(root)
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata(("id",), schema=copy.deepcopy(SCHEMA)))
    b.commit(commit_info(), *(add(f"f{i}.parquet", {"id": str(i)}) for i in (1, 2, 3)))
    return Path(b.root)


def _date_table(root: Path) -> Path:
    b = LogBuilder(root)
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata())
    b.commit(commit_info(), *(add(f"f{i}.parquet", {"date": d, "country": c}) for i, (d, c) in enumerate(
        itertools.product(("2024-01-01", "2024-01-02"), ("DE", "FR", None)))))
    return Path(b.root)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("menu_name", ["partitioned", "int"])
def test_a_one_step_grant_is_always_one_the_rule_makes(postgres_url: str, tmp_path: Path, model: str,
                                                       menu_name: str) -> None:
    if menu_name == "int":
        snapshot = DeltaLog.for_table(str(_int_table(tmp_path / "t"))).snapshot()
        menu = INT_PARTITIONED
    else:
        snapshot = DeltaLog.for_table(str(_date_table(tmp_path / "t"))).snapshot()
        menu = [*PARTITIONED_MENU, *MORE_PARTITIONED]
    state = TableState.of(snapshot)

    def request(i: int, pool: str, owner: str) -> LeaseRequest:
        op, predicate, options = menu[i]
        footprint = plan_footprint(snapshot, op, predicate, label=f"{i}:{op} {predicate}", **options)
        return LeaseRequest.of(pool=pool, table="t", owner=owner, footprint=footprint, table_state=state,
                               model=model)  # type: ignore[arg-type]

    one_step = rule = apart = 0
    with SqlLeaseStore(postgres_url) as store:
        for n, (a, b) in enumerate(itertools.permutations(range(len(menu)), 2)):
            pool = f"p{n}"
            first, second = request(a, pool, "a"), request(b, pool, "b")
            store.acquire(first)
            granted = store._acquire_at_once(second)
            oracle = MemoryLeaseStore()
            oracle.acquire(first)
            by_rule = oracle.acquire(second).granted
            one_step += granted is not None
            rule += by_rule
            reach_a, reach_b = first.reach, second.reach
            apart += reach_a is not None and reach_b is not None and reach_a.apart(reach_b)
            assert granted is None or by_rule, f"{first.footprint.label} held; {second.footprint.label} granted " \
                                               "in one step, but the rule makes it wait"
            if reach_a is not None and reach_b is not None and reach_a.apart(reach_b):
                assert granted is not None, f"{first.footprint.label} / {second.footprint.label}: apart, not granted"
    assert one_step == apart and one_step >= (4 if menu_name == "int" else 20), (one_step, apart, rule)


def test_any_partition_value_is_stored_and_compared(stores: tuple[SqlLeaseStore, SqlLeaseStore],
                                                    request_for: Request, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: a NUL in a value made a token PostgreSQL's JSON refuses, and a row stored so broke every one-step
    acquire of its table."""
    one, other = stores
    monkeypatch.setattr(sql, "AT_ONCE", False)
    odd = other.acquire(request_for("odd", "UPDATE", "country = 'a\x00\u00fc'"))
    assert odd.granted
    monkeypatch.setattr(sql, "AT_ONCE", True)
    assert one.acquire(request_for("w", "UPDATE", "country = 'DE'")).granted
    assert one.writes["at_once"] == 1
    same = one.acquire(request_for("same", "UPDATE", "country = 'a\x00\u00fc'"))
    assert same.status is LeaseStatus.WAITING and same.blockers[0].request_id == odd.request_id


def test_a_function_dropped_under_a_running_store_sends_it_the_usual_way(
        stores: tuple[SqlLeaseStore, SqlLeaseStore], request_for: Request, caplog: pytest.LogCaptureFixture) -> None:
    one, other = stores
    other.acquire(request_for("neighbour", "UPDATE", "country = 'FR'"))
    with other.engine.connect() as conn:
        conn.exec_driver_sql(f"DROP FUNCTION {pg_at_once.ACQUIRE_FUNCTION}({pg_at_once.ACQUIRE_FUNCTION_TYPES})")
    assert one.acquire(request_for("w", "UPDATE", "country = 'DE'")).granted
    assert one.at_once is None and "one-step function is gone" in caplog.text
    assert [r.owner for r in other.holders(pool="sales")] == ["neighbour", "w"]


def test_calls_the_server_refuses_go_the_usual_way_and_three_in_a_row_stop_them(
        stores: tuple[SqlLeaseStore, SqlLeaseStore], request_for: Request, caplog: pytest.LogCaptureFixture) -> None:
    one, other = stores
    other.acquire(request_for("neighbour", "UPDATE", "country = 'FR'"))
    assert one.at_once is not None
    failing = "SELECT 1 / (%(wait_ms)s - %(wait_ms)s) AS applied, now() AS decided_at, now() AS db_now"
    one.at_once = (failing, failing)   # a refusal with a code of the server's (division by zero)
    for owner in ("a", "b"):
        assert one.acquire(request_for(owner, "UPDATE", "country = 'DE'", table_key=f"t-{owner}")).granted
        assert one.at_once is not None
    assert one.acquire(request_for("c", "UPDATE", "country = 'DE'", table_key="t-c")).granted
    assert one.at_once is None and "as every operation of this store is from now on" in caplog.text
    assert sorted(r.owner for r in other.records(pool="sales")) == ["a", "b", "c", "neighbour"]
