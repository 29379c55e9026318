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
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .compare import PairJudge, PlannedJob
from .requests import Blocker


@dataclass(frozen=True)
class Candidate:
    """A live request as the arbiter sees it. ``key`` changes whenever the request's footprint does.

    The footprint is loaded only when the request is compared with another on its table (``load``):
    a store need not decode every request of a busy pool on every decision. Likewise its expected
    hold (``hold``), read only where rule 2a is weighed.
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

    @functools.cached_property
    def planned(self) -> PlannedJob:
        return self.load()

    @functools.cached_property
    def expected_hold(self) -> float | None:
        return self.hold()


@dataclass(frozen=True)
class Decision:
    granted: tuple[str, ...]
    blockers: Mapping[str, tuple[Blocker, ...]]   # every request still waiting -> why


def decide(holders: Sequence[Candidate], waiters: Sequence[Candidate], judge: PairJudge, *,
           now: float | None = None) -> Decision:
    """Grant what the rule allows; ``waiters`` must be in arrival order. Rule 2a needs ``now`` (the store's
    clock, the same one as ``granted_at``); without it a request never goes ahead of one it conflicts with."""
    active = list(holders)
    waiting: list[Candidate] = []
    granted: list[str] = []
    granted_now: set[str] = set()
    blockers: dict[str, tuple[Blocker, ...]] = {}
    for request in waiters:
        held = [b for b in (_blocker(judge, request, other, granted=True) for other in active
                            if other.table == request.table) if b is not None]
        ahead = [(other, b) for other in waiting if other.table == request.table
                 and (b := _blocker(judge, request, other, granted=False)) is not None]
        overtaking = not held and bool(ahead) and now is not None and _ends_in_shadow(
            request, [other for other, _ in ahead], blockers, {c.request_id: c for c in active}, granted_now, now)
        reasons = tuple(held) if overtaking else (*held, *(b for _, b in ahead))
        if not reasons and request.max_writers is not None and len(active) >= request.max_writers:
            # still behind the requests it would have gone ahead of: name them with the limit
            reasons = (*(b for _, b in ahead), Blocker(f"the pool's writer limit of {request.max_writers} is reached"))
        if reasons:
            blockers[request.request_id] = reasons
            waiting.append(request)
            continue
        granted.append(request.request_id)
        granted_now.add(request.request_id)
        active.append(request)
        if overtaking:   # the requests it went ahead of now wait for it too
            for other, b in ahead:
                blockers[other.request_id] += (Blocker(b.reason, request.request_id, request.owner, True),)
    return Decision(tuple(granted), blockers)


def _ends_in_shadow(request: Candidate, overtaken: Sequence[Candidate], blockers: Mapping[str, tuple[Blocker, ...]],
                    active: Mapping[str, Candidate], granted_now: set[str], now: float) -> bool:
    """Rule 2a: ``request`` is expected to end before each of ``overtaken`` can start (every estimate known),
    judged on the leases each waits for that arrived before it (not on requests that went ahead of it)."""
    hold = request.expected_hold
    if hold is None:
        return False
    for other in overtaken:
        held_by = [holder for b in blockers[other.request_id] if b.granted
                   and ((holder := active.get(str(b.request_id))) is None or holder.seq < other.seq)]
        if not held_by:   # it waits only for requests that wait themselves, or for the writer limit
            return False
        ends = [_expected_end(holder, granted_now, now) for holder in held_by]
        if any(end is None for end in ends) or now + hold > max(e for e in ends if e is not None):
            return False
    return True


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
