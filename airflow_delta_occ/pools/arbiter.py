"""The grant rule: which waiting requests of one pool may start now.

Pure and deterministic: the stores call ``decide`` inside the database transaction that holds the
pool's lock, on every live request of the pool, so no grant can interleave with another.

Rule, for the waiting requests in arrival order:

1. a request waits while it can conflict (``compare.lease_verdict``, both commit orders) with a
   lease held on its table;
2. it also waits while it can conflict with an *earlier* request still waiting on its table: a
   later request never overtakes an earlier one it conflicts with, so nobody is starved by a
   stream of newcomers;
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
    a store need not decode every request of a busy pool on every decision.
    """

    request_id: str
    key: object
    table: str
    owner: str
    load: Callable[[], PlannedJob] = field(compare=False, repr=False)
    model: str
    max_writers: int | None

    @functools.cached_property
    def planned(self) -> PlannedJob:
        return self.load()


@dataclass(frozen=True)
class Decision:
    granted: tuple[str, ...]
    blockers: Mapping[str, tuple[Blocker, ...]]   # every request still waiting -> why


def decide(holders: Sequence[Candidate], waiters: Sequence[Candidate], judge: PairJudge) -> Decision:
    """Grant what the rule allows; ``waiters`` must be in arrival order."""
    active = list(holders)
    waiting: list[Candidate] = []
    granted: list[str] = []
    blockers: dict[str, tuple[Blocker, ...]] = {}
    for request in waiters:
        found = [_blocker(judge, request, other, granted=True) for other in active if other.table == request.table]
        found += [_blocker(judge, request, other, granted=False) for other in waiting
                  if other.table == request.table]
        reasons = tuple(b for b in found if b is not None)
        if not reasons and request.max_writers is not None and len(active) >= request.max_writers:
            reasons = (Blocker(f"the pool's writer limit of {request.max_writers} is reached"),)
        if reasons:
            blockers[request.request_id] = reasons
            waiting.append(request)
        else:
            granted.append(request.request_id)
            active.append(request)
    return Decision(tuple(granted), blockers)


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
