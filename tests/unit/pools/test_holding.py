"""``pools.holding``: a holder that stops waiting keeps no place in line, even when the store half works."""

from __future__ import annotations

import logging
import threading

import pytest

from airflow_delta_occ.exceptions import JobKilledError, LeaseStoreError
from airflow_delta_occ.pools import holding
from airflow_delta_occ.pools.leases.memory import MemoryLeaseStore
from airflow_delta_occ.pools.requests import LeaseRecord, LeaseStatus

from .contract import Request

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
