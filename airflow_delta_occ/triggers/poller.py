"""One lease store and one polling loop per store in a triggerer, shared by every deferred waiter on it.

A triggerer may run hundreds of ``DeltaLeaseTrigger`` waits at once (a backfill whose writers all wait
for one table). Each used to open its own store (its own database connections) and poll it on its own
schedule: a thousand waiters were a thousand connections and a thousand queries per poll interval. Here
the waiters of one store share a ``StorePoller``:

* one ``SqlLeaseStore`` (one connection pool), used from one thread, so its caches (decoded requests,
  the judge's verdicts) are shared and never touched by two threads at once;
* every ``DEFERRED_WAKE_SECONDS`` one query reads the revision of every pool a waiter watches; the
  waiters whose pool moved, or whose own poll is due, are polled together (``LeaseStore.poll_many``:
  one read per pool, at most one transaction per pool for the heartbeats and grants due).

So a thousand waiters of one pool cost about four cheap queries a second and one read per poll interval.
The loop runs while somebody waits, and closes the store when the last waiter leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_delta_occ.exceptions import LeaseError, LeaseStoreError
from airflow_delta_occ.pools.holding import DEFERRED_WAKE_SECONDS

if TYPE_CHECKING:
    from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
    from airflow_delta_occ.pools.requests import LeaseRequest, LeaseState

_T = TypeVar("_T")

_pollers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, StorePoller]] = weakref.WeakKeyDictionary()


def shared_poller(url: str) -> StorePoller:
    """The running event loop's poller for the store at ``url`` (made on first use)."""
    loop = asyncio.get_running_loop()
    by_url = _pollers.setdefault(loop, {})
    poller = by_url.get(url)
    if poller is None or poller.closed:
        poller = by_url[url] = StorePoller(url)
    return poller


@dataclass(eq=False)
class Watch:
    """One waiting request, as the poller polls it: answered at ``due`` (the event loop's clock) at the
    latest, or at the first tick after its pool moved."""

    request: LeaseRequest
    request_id: str
    due: float = 0.0
    revision: int | None = None   # the pool's revision read before its last poll
    failed: bool = False          # its last poll failed: polled again only when due (its back-off)
    answer: asyncio.Future[Any] | None = field(default=None, repr=False)

    @property
    def pool(self) -> str:
        return self.request.pool


class StorePoller:
    """See the module docstring. Use ``shared_poller(url)``; ``watch`` a request, ``await next_answer``
    for each step of its wait, ``forget`` it when the wait ends; ``call`` runs anything else on the store."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.closed = False
        self._store: SqlLeaseStore | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="delta-occ-leases")
        self._watches: set[Watch] = set()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    async def call(self, function: Callable[[SqlLeaseStore], _T]) -> _T:
        """``function(store)`` on the poller's thread (the store is opened there on first use).

        Raises:
            LeaseStoreError: the store cannot be opened; or whatever ``function`` raises.
        """
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._on_store, function)

    def _on_store(self, function: Callable[[SqlLeaseStore], _T]) -> _T:
        if self._store is None:
            from airflow_delta_occ.pools.leases.sql import SqlLeaseStore

            self._store = SqlLeaseStore(self.url)
        return function(self._store)

    def watch(self, request: LeaseRequest, request_id: str) -> Watch:
        watch = Watch(request, request_id)
        self._watches.add(watch)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"delta-occ poller {id(self)}")
        return watch

    def forget(self, watch: Watch) -> None:
        self._watches.discard(watch)
        if watch.answer is not None and not watch.answer.done():
            watch.answer.cancel()

    async def next_answer(self, watch: Watch, delay: float) -> LeaseState | LeaseError:
        """The request's next state (or the error its poll met): polled within ``delay`` seconds, sooner
        when its pool moves. The request is asked for again if it is gone (``LeaseStore.poll_many``)."""
        if self.closed:   # stopped (the event loop is ending): an answer now, never a wait for none
            return LeaseStoreError("the triggerer's lease poller stopped")
        loop = asyncio.get_running_loop()
        watch.due = loop.time() + max(0.0, delay)
        watch.answer = loop.create_future()
        if delay <= 0:
            self._wake.set()
        answer: LeaseState | LeaseError = await watch.answer
        return answer

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._watches:
                waiting = [w for w in self._watches if w.answer is not None and not w.answer.done()]
                if waiting:
                    await self._tick(waiting, loop.time())   # never raises: each waiter gets its answer
                self._wake.clear()
                pending = [w.due for w in self._watches if w.answer is not None and not w.answer.done()]
                pause = min(DEFERRED_WAKE_SECONDS, max(0.0, min(pending, default=math.inf) - loop.time()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), pause)
        finally:
            self.closed = True
            for watch in self._watches:   # cancelled with the event loop: nobody is left waiting for an answer
                if watch.answer is not None and not watch.answer.done():
                    watch.answer.set_result(LeaseStoreError("the triggerer's lease poller stopped"))
            store, self._store = self._store, None
            if store is not None:
                await loop.run_in_executor(self._executor, _close, store)
            self._executor.shutdown(wait=False)

    async def _tick(self, waiting: list[Watch], now: float) -> None:
        """Poll the waiters that are due or whose pool moved, all at once. Any failure becomes each polled
        waiter's ``LeaseStoreError`` (its wait counts it and backs off); nothing escapes to end the loop."""
        revisions: dict[str, int] | None
        try:
            revisions = await self.call(lambda store: store.revisions({w.pool for w in waiting}))
        except Exception:   # unknown: only the waiters due anyway are polled (a failure must not end back-offs)
            revisions = None
        due = [w for w in waiting if now >= w.due
               or (not w.failed and revisions is not None and revisions.get(w.pool) != w.revision)]
        if not due:
            return
        try:
            answers: dict[str, LeaseState | LeaseError] = await self.call(
                lambda store: store.poll_many([(w.request_id, w.request) for w in due]))
        except LeaseStoreError as exc:
            answers = {w.request_id: exc for w in due}
        except Exception as exc:   # a defect or an OS error: reported to each waiter as a store failure
            failure = LeaseStoreError(f"polling the lease store failed: {exc!r}")
            answers = {w.request_id: failure for w in due}
        for w in due:
            w.revision = None if revisions is None else revisions.get(w.pool)
            answer = answers.get(w.request_id) or LeaseStoreError(f"no answer for request {w.request_id}")
            w.failed = isinstance(answer, LeaseStoreError)
            if w.answer is not None and not w.answer.done():
                w.answer.set_result(answer)


def _close(store: SqlLeaseStore) -> None:
    with contextlib.suppress(Exception):   # closing must not hide the waits' outcomes
        store.close()
