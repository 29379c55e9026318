"""What a conflict pool did, told from its audit alone: who ran side by side, who waited for whom, and why.

The audit (``LeaseStore.history``) records every request with its footprint, every grant and every
end, in the order the store decided them. That is enough to tell the story after the fact without
the tables or the workers: a request that waited is re-judged (``lease_verdict``) against the
requests that were live on its table when it arrived, the only ones the pool's fairness rule lets
delay it, and the verdict's reason says why the two could not run together. ``make demo`` prints
this story; a platform team can tell it for any window of a pool's history.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from airflow_delta_occ.engine.planner import Verdict

from .compare import lease_verdict
from .requests import AuditEvent, AuditKind, LeaseRequest, LeaseRequestError

_ENDS = frozenset({AuditKind.RELEASE, AuditKind.CANCEL, AuditKind.EXPIRE, AuditKind.ABANDON})


@dataclass(frozen=True)
class LeaseSpan:
    """One request's life: asked at ``requested_at``, held from ``granted_at`` (``None``: never granted)
    until ``ended_at`` (``None``: still live when the audit was read), ended by ``end``."""

    request_id: str
    pool: str
    table: str
    owner: str
    summary: str
    requested_at: float
    granted_at: float | None = None
    ended_at: float | None = None
    end: AuditKind | None = None
    request: LeaseRequest | None = field(default=None, compare=False, repr=False)
    position: int = 0   # the REQUEST's place in the audit: who arrived first

    @property
    def waited(self) -> float | None:
        """Seconds from the request to the grant; ``None`` when it was never granted."""
        return None if self.granted_at is None else self.granted_at - self.requested_at

    def held_during(self, start: float, end: float) -> bool:
        """Whether the lease was held at some moment of ``[start, end)``."""
        if self.granted_at is None:
            return False
        return self.granted_at < end and (self.ended_at is None or self.ended_at > start)


@dataclass(frozen=True)
class Wait:
    """``waiter`` could not be granted while ``ahead`` was live, for the reason ``verdict`` gives."""

    waiter: LeaseSpan
    ahead: LeaseSpan
    verdict: Verdict


@dataclass(frozen=True)
class PoolStory:
    """The spans of every request in the audit, the waits that kept conflicting jobs apart, and the
    pairs that held leases at the same time."""

    spans: tuple[LeaseSpan, ...]
    waits: tuple[Wait, ...]
    together: tuple[tuple[LeaseSpan, LeaseSpan], ...]

    @property
    def peak(self) -> int:
        """The most leases held at one moment (a lease granted as another ends counts once)."""
        marks = sorted([(s.granted_at, 1) for s in self.spans if s.granted_at is not None]
                       + [(s.ended_at, -1) for s in self.spans if s.granted_at is not None and s.ended_at is not None])
        held = best = 0
        for _, step in marks:  # at equal times the end (-1) sorts first
            held += step
            best = max(best, held)
        return best

    def waits_of(self, span: LeaseSpan) -> list[Wait]:
        return [w for w in self.waits if w.waiter.request_id == span.request_id]

    @classmethod
    def from_audit(cls, events: Iterable[AuditEvent]) -> PoolStory:
        """Build the story from audit events: in ``event_id`` order when every event has one (the store's
        ``history`` does), else in the order given, which must then be the audit's.

        A request whose REQUEST event is not in ``events`` (it came before the window) is left out,
        as is a wait on a request whose footprint the audit cannot decode.
        """
        listed = list(events)
        if all(e.event_id is not None for e in listed):
            listed.sort(key=lambda e: e.event_id or 0)
        spans: dict[str, LeaseSpan] = {}
        for position, event in enumerate(listed):
            span = spans.get(event.request_id)
            if event.kind is AuditKind.REQUEST:
                spans[event.request_id] = LeaseSpan(event.request_id, event.pool, event.table, event.owner,
                                                    event.summary, event.at, request=_request(event.detail),
                                                    position=position)
            elif span is None:
                continue
            elif event.kind is AuditKind.REPLAN and span.granted_at is None:
                spans[event.request_id] = replace(span, request=_request(event.detail) or span.request,
                                                  summary=event.summary or span.summary)
            elif event.kind is AuditKind.GRANT:
                spans[event.request_id] = replace(span, granted_at=event.at)
            elif event.kind in _ENDS and span.end is None:
                spans[event.request_id] = replace(span, ended_at=event.at, end=event.kind)
        ordered = tuple(sorted(spans.values(), key=lambda s: s.position))
        return cls(ordered, _waits(ordered), _together(ordered))


def _request(detail: str) -> LeaseRequest | None:
    try:
        return LeaseRequest.from_json_text(detail)
    except LeaseRequestError:  # an audit detail that is no request (or too deeply nested to decode)
        return None


def _live_at(span: LeaseSpan, moment: float) -> bool:
    return span.requested_at <= moment and (span.ended_at is None or span.ended_at > moment)


def _waits(spans: Sequence[LeaseSpan]) -> tuple[Wait, ...]:
    """For each request granted later than it asked: the earlier requests live on its table then that
    ``lease_verdict`` says it can conflict with (the pool's rule lets only those delay it)."""
    found: list[Wait] = []
    for waiter in spans:
        if waiter.granted_at is None or waiter.granted_at <= waiter.requested_at or waiter.request is None:
            continue
        for ahead in spans:
            if ahead.position >= waiter.position or ahead.table != waiter.table or ahead.request is None:
                continue
            if not _live_at(ahead, waiter.requested_at):
                continue
            verdict = lease_verdict(waiter.request.planned, ahead.request.planned, waiter.request.model)
            if verdict.conflict:
                found.append(Wait(waiter, ahead, verdict))
    return tuple(found)


def _together(spans: Sequence[LeaseSpan]) -> tuple[tuple[LeaseSpan, LeaseSpan], ...]:
    pairs: list[tuple[LeaseSpan, LeaseSpan]] = []
    for i, a in enumerate(spans):
        if a.granted_at is None:
            continue
        a_end = a.ended_at if a.ended_at is not None else float("inf")
        pairs.extend((a, b) for b in spans[i + 1:] if b.held_during(a.granted_at, a_end))
    return tuple(pairs)
