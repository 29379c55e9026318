"""``DeltaLeaseTrigger``: wait in the triggerer for a conflict pool's lease, keeping the request alive.

A task that asked its pool's lease store for a lease and was told to wait defers to this trigger, so
the wait costs no worker slot. The trigger polls the store; each poll is also the waiting request's
heartbeat, so the poll interval is clamped to a third of the request's TTL (a request that misses
its heartbeat for a TTL is abandoned and stops holding its place in line).

Why it carries the whole request: a request can be dropped while nobody polls it (the triggerer
restarted, or was stalled past the TTL). The store then answers ``GONE``, and the trigger asks again
with the same request, under the same owner; the new request id goes into the event. The task resumes
with ``execute_complete(context, event=...)`` where ``event`` is one of:

* ``{"status": "granted", "request_id", "state": LeaseState.to_json(), "waited": seconds or None,
  "blockers_seen": [{"request_id", "owner", "reason"}, ...], "reacquired": n}``: the lease is held
  from the grant on, and its TTL runs: the resumed task must start renewing it within the TTL;
* ``{"status": "near", "request_id", "expected": seconds, "blockers_seen", "reacquired"}`` (only with
  ``resume_ahead``): only leases already held block the request, and the grant is expected within
  ``resume_ahead`` seconds; the request keeps its place
  and the task resumes to wait the rest in a worker, so its start overlaps the holder's last seconds
  (an adaptive wait, ``pools.holding.WaitRule``);
* ``{"status": "error", "request_id", "message"}``: the connection names no usable store, the request
  cannot be read, or the store failed ``pools.holding.MAX_FAILURES`` times in a row.

The triggerer's waiters of one store share one store and one polling loop (``poller.StorePoller``): every
``DEFERRED_WAKE_SECONDS`` one cheap read of every watched pool's revision, then one batched poll of the
waiters whose pool moved or whose own poll is due, so a grant is seen within that time and a thousand
waiters cost about one read per pool per poll interval, not a thousand.

An event is never sent sooner than ``settle_seconds()`` after the trigger started. Airflow 3.3 (apache/airflow
#72716, fixes open as #72767 and #71579) fails a task whose trigger fires so soon after the deferral that
the resumed try is running before the scheduler has read the deferring process's exit: it takes that
stale exit for the resumed try's and marks the task for retry. How late that exit can be read is set by
Airflow itself: the worker's supervisor may read the end of the task's output just before the process
is reaped, and then sleeps ``[workers] min_heartbeat_interval`` (5 s by default) before it looks again.
So the settling time is that interval plus ``SETTLE_MARGIN_SECONDS`` (the scheduler's loop), at least
``SETTLE_MIN_SECONDS``, read where it matters: in the worker that defers (``settle_seconds()`` there,
passed as ``settle``). It costs only waits granted within those seconds of the deferral, which the
adaptive rule keeps in the worker unless its estimate was wrong; a fixed 3 s was not enough on a loaded
machine (CI: the exit was read 5.03 s after the deferral, and the resumed task was failed while its
write committed). While it settles the trigger goes on polling, so a lease granted meanwhile keeps its
heartbeat (a pool's TTL may be shorter than the settling time) and a request sent back as ``near`` may
be granted before it leaves. No margin covers every case: a worker that keeps the exited process's
sockets open (``[workers] socket_cleanup_timeout``) or uploads remote logs first reads the exit later.

The triggerer must not load pyarrow or Spark for every trigger it runs: the store, the request types
and the engine they import are loaded inside ``run()``, off the event loop. Connections are read with
``BaseHook.aget_connection`` (in the triggerer, through its supervisor; there is no metadata
database access here). ``on_kill`` cancels the request when a user marks the deferred task failed
or successful, or clears it, so a task that no longer waits does not keep its place.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_delta_occ.exceptions import LeaseError, LeaseStoreError
from airflow_delta_occ.hooks.leases import store_url
from airflow_delta_occ.pools.holding import (
    LeaseWait,
    Log,
    WaitEstimate,
    cancel_requests,
    grant_is_near,
)
from airflow_delta_occ.triggers.poller import shared_poller

if TYPE_CHECKING:
    from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
    from airflow_delta_occ.pools.requests import LeaseRequest, LeaseState

SETTLE_MARGIN_SECONDS = 2.0   # beyond the worker's exit notice, for the scheduler's loop (module docstring)
SETTLE_MIN_SECONDS = 3.0      # never less, whatever the interval
SETTLE_MAX_SECONDS = 60.0     # never more: an event held longer would hold up every short deferred wait


def settle_seconds() -> float:
    """No event sooner than this after the trigger starts: Airflow's ``[workers] min_heartbeat_interval``
    (the longest a worker may take to notice the deferring process ended) plus ``SETTLE_MARGIN_SECONDS``,
    within ``SETTLE_MIN_SECONDS`` and ``SETTLE_MAX_SECONDS``. Called in the worker that defers."""
    from airflow_delta_occ import config

    return min(max(config.worker_exit_notice() + SETTLE_MARGIN_SECONDS, SETTLE_MIN_SECONDS), SETTLE_MAX_SECONDS)


class DeltaLeaseTrigger(BaseTrigger):
    """Waits until the lease request ``request_id`` of ``owner`` is granted; see the module docstring.

    :param lease_conn_id: the ``delta_occ_leases`` connection naming the store.
    :param request_id: the waiting request, as ``acquire`` returned it.
    :param owner: the task try that owns it (only the owner may poll or cancel it).
    :param request: ``LeaseRequest.to_json()``, to ask again if the request was dropped.
    :param poll_interval: seconds between full polls when the pool does not change; at most a third
        of the request's TTL is used.
    :param resume_ahead: end the wait with a ``near`` event when the grant is expected within this
        many seconds (``None``: only a grant ends it).
    :param blockers_seen: whom the request waited for before it deferred (the worker's part of the
        wait); the events' ``blockers_seen`` include them, so the task's result names everyone.
    :param settle: no event sooner than this many seconds after the trigger starts (``settle_seconds()``
        in the deferring worker; ``None``: read here).
    """

    def __init__(self, *, lease_conn_id: str, request_id: str, owner: str, request: dict[str, Any],
                 poll_interval: float = 2.0, resume_ahead: float | None = None,
                 blockers_seen: list[dict[str, Any]] | None = None, settle: float | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Airflow's BaseTrigger.__init__ is untyped
        self.lease_conn_id = lease_conn_id
        self.request_id = request_id
        self.owner = owner
        self.request = request
        self.poll_interval = poll_interval
        self.resume_ahead = resume_ahead
        self.blockers_seen = list(blockers_seen or [])
        self.settle = settle
        self.current_request_id = request_id   # moves on when a dropped request is asked for again

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"lease_conn_id": self.lease_conn_id, "request_id": self.request_id, "owner": self.owner,
                 "request": self.request, "poll_interval": self.poll_interval, "resume_ahead": self.resume_ahead,
                 "blockers_seen": self.blockers_seen, "settle": self.settle})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        loop = asyncio.get_running_loop()
        settle = self.settle if self.settle is not None else settle_seconds()
        payload = await self.wait_for_grant(not_before=loop.time() + settle)
        yield TriggerEvent(payload)  # type: ignore[no-untyped-call]  # untyped in Airflow

    async def wait_for_grant(self, not_before: float = 0.0) -> dict[str, Any]:
        """Poll until granted (asking again when the request is gone); the event payload. A grant or a
        ``near`` seen before ``not_before`` (the event loop's clock) is not sent yet: the polls go on (each
        one the request's or the lease's heartbeat) and the first one from then on decides.

        The store is opened here and closed before the event is yielded, whatever happens.
        """
        loop = asyncio.get_running_loop()
        try:
            request = await asyncio.to_thread(_parse_request, self.request)
        except LeaseError as exc:
            return self._error(f"the deferred lease request cannot be read: {exc}")
        if request.owner != self.owner:
            return self._error(f"the deferred lease request belongs to {request.owner!r}, not {self.owner!r}")

        try:
            url = await self._store_url()
        except (LeaseStoreError, AirflowNotFoundException) as exc:
            return self._error(f"connection {self.lease_conn_id!r}: {exc}")
        wait = LeaseWait(request, self.current_request_id, self.poll_interval, self.log, seen=self.blockers_seen)
        poller = shared_poller(url)
        watch = poller.watch(request, wait.request_id)
        estimate: WaitEstimate | None = None
        delay = 0.0
        try:
            while True:
                ready: dict[str, Any] | None = None   # the event, once the wait has one to send
                answer = await poller.next_answer(watch, delay)
                try:
                    if isinstance(answer, LeaseStoreError):
                        step = wait.failed(answer)   # raises at the limit
                    elif isinstance(answer, LeaseError):
                        raise answer
                    else:
                        step = wait.answered(answer)
                        watch.request_id = wait.request_id
                        # Estimated only where the grant could be near at all (nobody waits ahead).
                        state = step.state
                        if state is not None and grant_is_near(state, 0.0, self.resume_ahead):
                            if estimate is None:
                                estimate = await poller.call(partial(WaitEstimate.read, table=request.table,
                                                                     log=self.log))
                            expected = await poller.call(partial(_expected, wait, state, estimate))
                            if grant_is_near(state, expected, self.resume_ahead):
                                ready = {"status": "near", "request_id": state.request_id,
                                         "expected": expected, "blockers_seen": wait.blockers.seen(),
                                         "reacquired": wait.reacquired}
                except LeaseError as exc:   # not this owner's request, or the store kept failing
                    return self._error(str(exc))
                finally:
                    self.current_request_id = wait.request_id
                if step.state is not None and step.granted:
                    ready = {"status": "granted", "request_id": step.state.request_id, "state": step.state.to_json(),
                             "waited": step.state.waited, "blockers_seen": wait.blockers.seen(),
                             "reacquired": wait.reacquired}
                settling = not_before - loop.time()
                if ready is not None and settling <= 0:
                    return ready
                # While it settles, a ready wait polls on as a heartbeat, at its interval (a grant's step has no
                # delay: without the interval it would poll without pause until the settling ends).
                delay = step.delay if ready is None else min(wait.interval, settling)
        finally:
            poller.forget(watch)

    async def on_kill(self) -> None:
        """Cancel the request (or release the lease) so a killed or cleared task does not keep its place.

        Runs after ``run()`` was cancelled and closed its store, so it opens its own. It releases the
        request it last knew and any other live request of this owner on the table (a re-acquire
        this instance did not see). Failures are logged: the request is then abandoned after its TTL.
        """
        table = self.request.get("table") if isinstance(self.request, dict) else None
        try:
            url = await self._store_url()
            released = await asyncio.to_thread(
                _cancel, url, {self.request_id, self.current_request_id}, self.owner,
                table if isinstance(table, str) else None, self.log)
        except (LeaseError, AirflowNotFoundException) as exc:
            self.log.warning("could not cancel lease request %s of %s (it is abandoned after its TTL): %s",
                             self.current_request_id, self.owner, exc)
            return
        self.log.info("task killed: cancelled lease requests %s of %s", sorted(released) or "(none live)",
                      self.owner)

    async def _store_url(self) -> str:
        """The store's URL from the connection, built by the hook's ``store_url`` (one place for that logic).

        Raises:
            AirflowNotFoundException: no such connection.
            LeaseStoreError: the connection names no store.
        """
        conn = await BaseHook.aget_connection(self.lease_conn_id)
        return await asyncio.to_thread(   # store_url imports SQLAlchemy: not on the event loop
            store_url, backend=None, host=conn.host, port=conn.port, schema=conn.schema, login=conn.login,
            password=conn.password, extra=dict(conn.extra_dejson))

    def _error(self, message: str) -> dict[str, Any]:
        self.log.error("lease request %s of %s: %s", self.current_request_id, self.owner, message)
        return {"status": "error", "request_id": self.current_request_id, "message": message}


def _parse_request(data: object) -> LeaseRequest:
    """Runs in a thread: importing the request types loads the engine (and pyarrow)."""
    from airflow_delta_occ.pools.requests import LeaseRequest

    return LeaseRequest.from_json(data)


def _open_store(url: str) -> SqlLeaseStore:
    from airflow_delta_occ.pools.leases.sql import SqlLeaseStore

    return SqlLeaseStore(url)


def _expected(wait: LeaseWait, state: LeaseState, estimate: WaitEstimate, store: SqlLeaseStore) -> float | None:
    return wait.expected(store, state, estimate)


def _cancel(url: str, request_ids: set[str], owner: str, table: str | None, log: Log) -> set[str]:
    """Cancel the given requests and the owner's other live requests on ``table``; the ids released."""
    store = _open_store(url)
    try:
        return cancel_requests(store, owner, request_ids, table=table, log=log)
    finally:
        store.close()


__all__ = ["DeltaLeaseTrigger"]
