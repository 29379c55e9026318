"""Lease requests and states: checked at construction, JSON round trips, untrusted documents refused by name."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_delta_occ.engine import Snapshot
from airflow_delta_occ.engine.planner import TableState, plan_footprint
from airflow_delta_occ.exceptions import LeaseError
from airflow_delta_occ.pools.leases.memory import MemoryLeaseStore
from airflow_delta_occ.pools.requests import LeaseRequest, LeaseRequestError, LeaseState, operation_of

pytestmark = pytest.mark.unit


def _request(snapshot: Snapshot, **overrides: Any) -> LeaseRequest:
    fields: dict[str, Any] = {"pool": "sales", "table": "file:///lake/sales", "owner": "dag/task/run/-1/1",
                              "footprint": plan_footprint(snapshot, "UPDATE", "country = 'DE'", label="u"),
                              "table_state": TableState.of(snapshot), "ttl": 60.0, "max_writers": 4}
    return LeaseRequest.of(**{**fields, **overrides})


def test_a_request_round_trips_through_json(sales_log: tuple[str, Snapshot]) -> None:
    request = _request(sales_log[1])
    again = LeaseRequest.from_json(json.loads(json.dumps(request.to_json())))
    assert again == request and again.summary == request.summary and again.expected_hold is None
    assert "UPDATE 'u' planned at version 1" in request.summary and "country=DE" in request.summary
    expecting = _request(sales_log[1], expected_hold=4.5)
    assert LeaseRequest.from_json(json.loads(json.dumps(expecting.to_json()))).expected_hold == 4.5
    assert expecting == request   # an estimate is no part of the job: asking again with another is no re-plan
    assert operation_of(request.summary) == "UPDATE" and operation_of("") == ""


@pytest.mark.parametrize("field,value,message", [
    ("owner", "", "owner must be a non-empty string"),
    ("pool", "x" * 201, "pool must be"),
    ("ttl", 0, "ttl must be a positive number"),
    ("ttl", float("nan"), "ttl must be"),
    ("max_writers", 0, "max_writers must be a positive integer"),
    ("max_writers", True, "max_writers must be"),
    ("model", "oracle", "model must be one of delta, databricks, maxcompute"),
    ("expected_hold", -1.0, "expected_hold must be a number of seconds from 0 or null"),
    ("expected_hold", float("inf"), "expected_hold must be"),
    ("expected_hold", "5", "expected_hold must be"),
])
def test_a_bad_request_is_refused_naming_the_field(sales_log: tuple[str, Snapshot], field: str, value: Any,
                                                   message: str) -> None:
    with pytest.raises(LeaseRequestError, match=message):
        _request(sales_log[1], **{field: value})
    assert issubclass(LeaseRequestError, LeaseError)


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.pop("footprint"), "footprint"),
    (lambda d: d["table_state"].update(version=-1), "version"),
    (lambda d: d.update(owner=7), "owner must be a non-empty string"),
    (lambda d: d["footprint"].update(operation="DROP"), "unknown operation"),
])
def test_an_untrusted_document_is_refused_by_name(sales_log: tuple[str, Snapshot], mutate: Any, message: str) -> None:
    doc = _request(sales_log[1]).to_json()
    mutate(doc)
    with pytest.raises(LeaseRequestError, match=message):
        LeaseRequest.from_json(doc)


def test_a_state_round_trips_through_json(sales_log: tuple[str, Snapshot]) -> None:
    store = MemoryLeaseStore()
    store.acquire(_request(sales_log[1]))
    waiting = store.acquire(_request(sales_log[1], owner="other"))
    assert LeaseState.from_json(json.loads(json.dumps(waiting.to_json()))) == waiting
    with pytest.raises(LeaseRequestError, match="lease state"):
        LeaseState.from_json({"request_id": "x", "status": "paused", "checked_at": 0})
