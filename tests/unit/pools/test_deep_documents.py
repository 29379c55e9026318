"""Deeply nested documents from the store or a trigger event are refused with the typed decode error,
never a raw ``RecursionError`` (JSON nesting is bounded by Python's recursion limit, not by the format)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_delta_occ.engine import Snapshot
from airflow_delta_occ.engine.planner import TableState, plan_footprint
from airflow_delta_occ.exceptions import LeaseStoreError
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
from airflow_delta_occ.pools.requests import LeaseRequest, LeaseRequestError, LeaseState, LeaseStatus

pytestmark = pytest.mark.unit

DEPTH = 100_000


def _nested(depth: int) -> Any:
    """A list ``depth`` levels deep, built without recursion."""
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def _request(snapshot: Snapshot, owner: str) -> LeaseRequest:
    return LeaseRequest.of(pool="sales", table="t", owner=owner, table_state=TableState.of(snapshot),
                           footprint=plan_footprint(snapshot, "UPDATE", "country = 'DE'", label=owner))


def test_a_deeply_nested_stored_request_is_a_lease_store_error(sales_log: tuple[str, Snapshot],
                                                                 tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'leases.db'}"
    with SqlLeaseStore(url) as store:
        store.acquire(_request(sales_log[1], "holder"))
        waiter = store.acquire(_request(sales_log[1], "waiter"))
    assert waiter.status is LeaseStatus.WAITING
    engine = sa.create_engine(url)
    with engine.begin() as conn:   # a corrupted (or hostile) row, as another writer of the database left it
        conn.execute(sa.text("UPDATE delta_occ_leases SET request = :text WHERE request_id = :id"),
                     {"text": "[" * DEPTH + "]" * DEPTH, "id": waiter.request_id})
    engine.dispose()
    with SqlLeaseStore(url) as store, pytest.raises(LeaseStoreError, match=waiter.request_id):
        store.poll(waiter.request_id, "waiter")   # judging the waiter decodes its stored request


def test_deeply_nested_request_text_is_a_request_error() -> None:
    with pytest.raises(LeaseRequestError, match="nested"):
        LeaseRequest.from_json_text("[" * DEPTH + "]" * DEPTH)
    with pytest.raises(LeaseRequestError, match="not JSON"):
        LeaseRequest.from_json_text("{")


@pytest.mark.parametrize("field", ["owner", "pool", "table", "model", "max_writers", "ttl", "summary"])
def test_a_deeply_nested_request_field_is_refused_by_name(sales_log: tuple[str, Snapshot], field: str) -> None:
    doc = _request(sales_log[1], "o").to_json()
    doc[field] = _nested(DEPTH)
    with pytest.raises(LeaseRequestError):
        LeaseRequest.from_json(doc)


def test_a_deeply_nested_trigger_state_is_refused() -> None:
    state = {"request_id": "r", "status": "waiting", "checked_at": 0.0, "record": None,
             "blockers": [{"reason": _nested(DEPTH), "request_id": "x", "owner": "o", "granted": True}]}
    with pytest.raises(LeaseRequestError, match="lease state"):
        LeaseState.from_json(state)
    with pytest.raises(LeaseRequestError, match="lease state"):
        LeaseState.from_json({**state, "blockers": [], "request_id": _nested(DEPTH)})


def test_a_huge_integer_field_is_refused_without_printing_it(sales_log: tuple[str, Snapshot]) -> None:
    doc = _request(sales_log[1], "o").to_json()
    doc["max_writers"] = -(10 ** 5000)   # repr() of it raises ValueError
    with pytest.raises(LeaseRequestError, match="max_writers must be a positive integer"):
        LeaseRequest.from_json(doc)
