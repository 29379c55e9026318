"""The grant rule: which waiting requests of one pool may start now.

Pure and deterministic: the stores call ``decide`` inside the database transaction that holds the
pool's lock, on every live request of the pool, so no grant can interleave with another.

Rule, for the waiting requests in arrival order:

1. a request waits while it can conflict (``compare.lease_verdict``, both commit orders) with a
   lease held on its table;
2. it also waits while it can conflict with an *earlier* request still waiting on its table: a
   later request does not overtake an earlier one it conflicts with, so nobody is starved by a
   stream of newcomers; except
2a. *in the shadow of the holders*: it may go ahead of earlier requests it conflicts with when each
   of them waits for a held lease that arrived before it, and it is expected to end (``now`` plus its
   ``expected_hold``) no later than the last of those leases is expected to be released (its grant
   plus its ``expected_hold``). Every estimate must be known, and the decision must be given ``now``.
   This is backfilling, as batch schedulers do it: on a table where every reader conflicts with
   appends and compactions, an append granted beside a compaction uses time the chain of readers
   could not use, and when the estimates hold, the overtaken request starts no later than it would
   have. Only leases that arrived before the overtaken request cast the shadow, never the requests
   that went ahead of it, so its delay is bounded by the estimates' error (an overtaker running over,
   a holder ending early), once: nobody goes ahead of it once its earlier holders were expected to
   end or have ended, however many newcomers arrive;
3. a request that conflicts with nobody holding or waiting before it is granted at once, even
   when earlier requests wait for something else;
4. the pool's writer limit counts held leases across all its tables; when it is reached nobody
   is granted, so the next free slot goes to the earliest request that can use it.

Cost: a decision grows about linearly with the live requests. A request is compared only with the
requests its reach meets (``compare.reach``: jobs in disjoint partitions never conflict), in arrival
order, and the comparisons stop at the first blocker: a request blocked by a held lease is not
compared with the waiters before it, and one blocked by an earlier waiter is not compared with the
waiters after that one. So a waiter names one blocker (the earliest-arrived lease it waits for, else
the first request ahead of it); rule 2a, rarely weighed, still judges every lease the overtaken request
waits for.
"""

from __future__ import annotations

import bisect
import functools
import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from .compare import PairJudge, PlannedJob, Reach
from .requests import Blocker


@dataclass(frozen=True)
class Candidate:
    """A live request as the arbiter sees it. ``key`` changes whenever the request's footprint does.

    The footprint is loaded only when the request is compared with another on its table (``load``):
    a store need not decode every request of a busy pool on every decision. Likewise its expected
    hold (``hold``), read only where rule 2a is weighed, and its reach (``span``; ``None``: unknown,
    compared with every request of its table).
    """

    request_id: str
    key: object
    table: str
    owner: str
    load: Callable[[], PlannedJob] = field(compare=False, repr=False)
    model: str
    max_writers: int | None
    granted_at: float | None = None   # None: waiting (a request granted in this decision: from ``now``)
    seq: int = 0                      # arrival order in the pool (rule 2a: only earlier arrivals cast a shadow)
    hold: Callable[[], float | None] = field(default=lambda: None, compare=False, repr=False)
    span: Callable[[], Reach | None] = field(default=lambda: None, compare=False, repr=False)
    remembered: Remembered | None = None   # the lease it was last found waiting for (a waiter's only)

    @functools.cached_property
    def planned(self) -> PlannedJob:
        return self.load()

    @functools.cached_property
    def expected_hold(self) -> float | None:
        return self.hold()

    @functools.cached_property
    def reach(self) -> Reach | None:
        return self.span()


@dataclass(frozen=True)
class Remembered:
    """The held lease a waiting request was last found to conflict with, kept with the stored request.

    While that lease is held under the same ``key`` (the footprint it was judged with) the request still
    waits for it, so a decision in any process answers from here without judging the pair again: a
    store opened in a fresh task process does not re-judge every waiter of a busy pool. The store drops
    it when the request re-plans (its own key changes).
    """

    key: object
    request_id: str
    reason: str
    waiter_key: object = None   # the waiter's own key when it was judged: a re-planned waiter forgets it


@dataclass(frozen=True)
class Decision:
    granted: tuple[str, ...]
    blockers: Mapping[str, tuple[Blocker, ...]]   # every request still waiting -> why
    remember: Mapping[str, Remembered | None] = field(default_factory=dict)   # every waiter -> its held blocker


def decide(holders: Sequence[Candidate], waiters: Sequence[Candidate], judge: PairJudge, *,
           now: float | None = None) -> Decision:
    """Grant what the rule allows; ``waiters`` must be in arrival order. Rule 2a needs ``now`` (the store's
    clock, the same one as ``granted_at``); without it a request never goes ahead of one it conflicts with."""
    active = _Index(holders)
    waiting = _Index(())
    granted: list[str] = []
    granted_now: set[str] = set()
    blockers: dict[str, tuple[Blocker, ...]] = {}
    remember: dict[str, Remembered | None] = {}
    for request in waiters:
        held = _still_held(request, active)
        if held is None:
            held = next(((other, b) for other in active.near(request)
                         if (b := _blocker(judge, request, other, granted=True)) is not None), None)
        remember[request.request_id] = None
        if held is not None:
            holder, blocker = held
            blockers[request.request_id] = (blocker,)
            remember[request.request_id] = Remembered(holder.key, holder.request_id, blocker.reason, request.key)
            waiting.add(request)
            continue
        overtaken: list[tuple[Candidate, Blocker]] = []
        ahead: Blocker | None = None
        for other in waiting.near(request):
            b = _blocker(judge, request, other, granted=False)
            if b is None:
                continue
            if now is not None and _in_shadow(request, other, active, judge, granted_now, now):
                overtaken.append((other, b))
                continue
            ahead = b
            break
        if ahead is None and request.max_writers is not None and len(active) >= request.max_writers:
            # still behind the requests it would have gone ahead of: name them with the limit
            blockers[request.request_id] = (*(b for _, b in overtaken),
                                            Blocker(f"the pool's writer limit of {request.max_writers} is reached"))
            waiting.add(request)
            continue
        if ahead is not None:
            blockers[request.request_id] = (ahead,)
            waiting.add(request)
            continue
        granted.append(request.request_id)
        granted_now.add(request.request_id)
        active.add(request)
        for other, b in overtaken:   # the requests it went ahead of now wait for it too
            blockers[other.request_id] += (Blocker(b.reason, request.request_id, request.owner, True),)
    for request_id in granted:
        remember.pop(request_id, None)
    return Decision(tuple(granted), blockers, remember)


EXPLAIN_AHEAD_LIMIT = 100   # earlier waiters compared at most when explaining one request
UNCOMPARED = "(earlier requests not compared)"   # the owner a blocker names when the limit cut the comparisons


class Explainer:
    """Why waiting requests wait, for any number of requests of one read of a pool (a batched poll answers
    many); the pool's requests are indexed once.

    A request is explained by every held lease it conflicts with (what its expected wait needs: the longest
    time one of them has left), then by the nearest earlier request it conflicts with, the one it queues
    directly behind. With ``every_held_lease=False`` (a batched poll's answers), a request queued behind
    another names only the held lease the pool's last decision kept with it (``Remembered``; every held
    lease when there is none). Why: a triggerer answers all its waiters each time the pool moves, and when a
    lease passed down a line of a thousand, judging each waiter against the new holder (and, before, against
    the new first in line) was a new pair per waiter at every hand-over, in every triggerer. The kept lease
    and the request directly ahead are pairs already judged, so only the new first in line is judged again
    (``benchmarks/trigger_notice.py``). A deferred waiter behind somebody is never near its grant
    (``holding.grant_is_near``), so its estimate is not computed from such an answer.

    At most ``EXPLAIN_AHEAD_LIMIT`` earlier requests its reach meets are compared; when none of them
    conflicts and more are left, the answer names the held leases it conflicts with and says the rest is
    unknown with a blocker naming no request (its owner is ``UNCOMPARED``), which leaves a waiter's estimate
    unknown rather than too short.
    """

    def __init__(self, holders: Sequence[Candidate], waiters: Sequence[Candidate], judge: PairJudge, *,
                 every_held_lease: bool = True) -> None:
        self._holders = _Index(holders)
        self._waiters = _Index(waiters)
        self._judge = judge
        self._every_held_lease = every_held_lease

    def explain(self, request: Candidate) -> tuple[Blocker, ...]:
        unknown: tuple[Blocker, ...] = ()
        for compared, other in enumerate(self._waiters.before(request)):
            if compared == EXPLAIN_AHEAD_LIMIT:   # one more is left: whether it conflicts is not known
                unknown = (Blocker(f"more than {EXPLAIN_AHEAD_LIMIT} earlier requests may conflict; not all "
                                   "were compared", owner=UNCOMPARED),)
                break
            ahead = _blocker(self._judge, request, other, granted=False)
            if ahead is not None:
                remembered = None if self._every_held_lease else _still_held(request, self._holders)
                return (*((remembered[1],) if remembered is not None else self._held(request)), ahead)
        return (*self._held(request), *unknown)

    def _held(self, request: Candidate) -> tuple[Blocker, ...]:
        return tuple(b for other in self._holders.near(request)
                     if (b := _blocker(self._judge, request, other, granted=True)) is not None)


def _meets(a: Candidate, b: Candidate) -> bool:
    """Whether ``a`` and ``b`` may share a partition (``compare.Reach.apart``); when unsure, they may."""
    ra, rb = a.reach, b.reach
    return ra is None or rb is None or a.model != b.model or not ra.apart(rb)


def _still_held(request: Candidate, active: _Index) -> tuple[Candidate, Blocker] | None:
    """The lease ``request`` was last found waiting for, when it is still held under the key it was judged with."""
    remembered = request.remembered
    if remembered is None or remembered.waiter_key != request.key:
        return None
    holder = active.get(remembered.request_id)
    if holder is None or holder.key != remembered.key:
        return None
    return holder, Blocker(remembered.reason, holder.request_id, holder.owner, True)


def _in_shadow(request: Candidate, other: Candidate, active: _Index, judge: PairJudge, granted_now: set[str],
               now: float) -> bool:
    """Rule 2a for one earlier request ``other``: ``request`` is expected to end before ``other`` can start
    (every estimate known), judged on every held lease ``other`` waits for that arrived before it (not on
    requests that went ahead of it). All of them, not only the one its decision named: one whose estimate
    is unknown makes the shadow unknown."""
    hold = request.expected_hold
    if hold is None:
        return False
    held_by = [holder for holder in active.near(other)
               if holder.seq < other.seq and _blocker(judge, other, holder, granted=True) is not None]
    if not held_by:   # it waits only for requests that wait themselves, or for the writer limit
        return False
    ends = [_expected_end(holder, granted_now, now) for holder in held_by]
    return not any(end is None for end in ends) and now + hold <= max(e for e in ends if e is not None)


def _expected_end(holder: Candidate | None, granted_now: set[str], now: float) -> float | None:
    """When ``holder``'s lease is expected to be released; ``None``: unknown."""
    if holder is None or holder.expected_hold is None:
        return None
    granted_at = now if holder.request_id in granted_now or holder.granted_at is None else holder.granted_at
    return granted_at + holder.expected_hold


def _blocker(judge: PairJudge, request: Candidate, other: Candidate, *, granted: bool) -> Blocker | None:
    """Why ``request`` must wait for ``other``, or ``None``.

    Two requests of one table with different models (the pool file changed between them) wait if
    either model says they can conflict.
    """
    for model in sorted({request.model, other.model}):
        verdict = judge.verdict(request.key, request.planned, other.key, other.planned, model)  # type: ignore[arg-type]
        if verdict.conflict:
            return Blocker(verdict.reason, other.request_id, other.owner, granted)
    return None


class _Index:
    """Requests by table and partition: the ones a request's reach meets, in arrival order.

    A request with a known, bounded reach is filed under each of its partitions; one that may touch any
    partition (or whose reach is unknown) is filed as open. Two requests of one table are compared when
    their partitionings differ (a replaced table), when either is open, or when they share a partition.
    Models are part of the key, since a reach is judged under one model.
    """

    def __init__(self, candidates: Sequence[Candidate]) -> None:
        self._by_id: dict[str, Candidate] = {}
        self._tables: dict[str, _TableIndex] = {}
        for candidate in candidates:
            self.add(candidate)

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, request_id: str) -> Candidate | None:
        return self._by_id.get(request_id)

    def add(self, candidate: Candidate) -> None:
        self._by_id[candidate.request_id] = candidate
        self._tables.setdefault(candidate.table, _TableIndex()).add(candidate)

    def near(self, request: Candidate) -> Iterator[Candidate]:
        """The requests of ``request``'s table its reach may meet, earliest arrival first."""
        table = self._tables.get(request.table)
        return iter(()) if table is None else table.near(request)

    def before(self, request: Candidate) -> Iterator[Candidate]:
        """The requests of ``near`` that arrived before ``request``, the latest first."""
        table = self._tables.get(request.table)
        return iter(()) if table is None else table.before(request)


class _TableIndex:
    """One table's requests: by value of each partition column, and the open ones (any partition)."""

    def __init__(self) -> None:
        self.pending: list[Candidate] = []   # added, not filed yet: a reach is worked out only when asked
        self.everyone: list[Candidate] = []
        self.open: list[Candidate] = []
        self.by_value: list[dict[object, list[Candidate]]] = []   # per column: value -> requests with it
        self.open_on: list[list[Candidate]] = []                 # per column: bounded requests open there
        self.kinds: set[tuple[str, object]] = set()              # (model, layout) of the bounded ones
        self.in_order = True   # ``everyone`` is in arrival order

    def add(self, candidate: Candidate) -> None:
        self.pending.append(candidate)

    def _file(self, candidate: Candidate) -> None:
        if self.everyone and self.everyone[-1].seq > candidate.seq:
            self.in_order = False
        self.everyone.append(candidate)
        columns = _columns(candidate)
        if columns is None:
            self.open.append(candidate)
            return
        assert candidate.reach is not None
        self.kinds.add((candidate.model, candidate.reach.layout))
        while len(self.by_value) < len(columns):
            self.by_value.append({})
            self.open_on.append([])
        for i, values in enumerate(columns):
            if values is None or None in values:   # NULL meets every value (``Reach.apart``)
                self.open_on[i].append(candidate)
                continue
            for value in values:
                self.by_value[i].setdefault(value, []).append(candidate)

    def near(self, request: Candidate) -> Iterator[Candidate]:
        yield from self._walk(request, latest_first=False)

    def before(self, request: Candidate) -> Iterator[Candidate]:
        yield from self._walk(request, latest_first=True)

    def _walk(self, request: Candidate, *, latest_first: bool) -> Iterator[Candidate]:
        """``near`` (every request the reach meets, earliest first), or ``before`` (those that arrived
        before ``request``, latest first)."""
        for candidate in self.pending:   # filed when first asked: if every waiter waits for a held lease, never
            self._file(candidate)
        self.pending.clear()
        before = request.seq if latest_first else None
        columns = _columns(request)
        kind = None if request.reach is None else (request.model, request.reach.layout)
        open_request = columns is None or bool(self.kinds - {kind})   # or another model or partitioning on the table
        bounded = [] if columns is None or open_request else [
            (i, values) for i, values in enumerate(columns)
            if values is not None and None not in values and i < len(self.by_value)]
        if not bounded:   # every request of the table, those the reach meets (all, for an open request)
            everyone = self.everyone if self.in_order else sorted(self.everyone, key=_arrival)
            yield from (c for c in _ordered(everyone, before) if open_request or _meets(request, c))
            return
        column, values = min(bounded, key=lambda iv: len(self.open_on[iv[0]]) + sum(
            len(self.by_value[iv[0]].get(v, ())) for v in iv[1]))
        sources = [self.open, self.open_on[column], *(self.by_value[column].get(v, ()) for v in values)]
        if self.in_order:
            # Each list is in arrival order (filed in it): merged lazily, so a caller that stops at the first
            # conflict compares a few requests, not every one that shares the partition.
            seen: set[str] = set()
            merged = heapq.merge(*(_ordered(source, before) for source in sources), key=_arrival,
                                 reverse=latest_first)
            for candidate in merged:
                if candidate.request_id not in seen:
                    seen.add(candidate.request_id)
                    if _meets(request, candidate):
                        yield candidate
            return
        found = {c.request_id: c for source in sources for c in source}
        ordered = sorted((c for c in found.values() if _meets(request, c)), key=_arrival)
        yield from _ordered(ordered, before)


def _ordered(requests: Sequence[Candidate], before: int | None) -> Iterator[Candidate]:
    """``requests`` (in arrival order) as they are, or, given ``before``, those that arrived before it,
    the latest first (found by bisection: a walk back from a waiter deep in a long line starts where it is)."""
    if before is None:
        return iter(requests)
    end = bisect.bisect_left(requests, before, key=_arrival)
    return (requests[i] for i in range(end - 1, -1, -1))


def _columns(candidate: Candidate) -> tuple[frozenset[object] | None, ...] | None:
    """The request's values per partition column, or ``None`` when it may touch any partition."""
    reach = candidate.reach
    if reach is None or reach.columns is None or all(values is None for values in reach.columns):
        return None
    return reach.columns


def _arrival(candidate: Candidate) -> int:
    return candidate.seq
