"""The pool's story is told from the audit alone: who held leases together, who waited for whom, and why."""

from __future__ import annotations

from airflow_delta_occ.engine.planner import ConflictKind
from airflow_delta_occ.pools.leases.memory import MemoryLeaseStore
from airflow_delta_occ.pools.requests import AuditKind
from airflow_delta_occ.pools.story import PoolStory

from .contract import Request


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


DE = [{"date": "2024-01-01", "country": "DE"}]
FR = [{"date": "2024-01-01", "country": "FR"}]


def test_disjoint_writers_ran_together_and_a_conflicting_one_waited_for_the_reason_the_planner_gives(
        request_for: Request) -> None:
    clock = Clock()
    store = MemoryLeaseStore(clock=clock)
    merge_de = store.acquire(request_for("merge_de", "MERGE", "country = 'DE'", write_partitions=DE))
    clock.now += 1
    merge_fr = store.acquire(request_for("merge_fr", "MERGE", "country = 'FR'", write_partitions=FR))
    clock.now += 1
    fix_de = store.acquire(request_for("fix_de", "UPDATE", "country = 'DE'"))
    assert merge_de.granted and merge_fr.granted and not fix_de.granted
    clock.now += 10
    store.release(merge_de.request_id, "merge_de")   # grants fix_de in the same transaction
    clock.now += 5
    store.release(merge_fr.request_id, "merge_fr")
    clock.now += 3
    store.release(fix_de.request_id, "fix_de")

    story = PoolStory.from_audit(store.history(limit=1000))

    assert [s.owner for s in story.spans] == ["merge_de", "merge_fr", "fix_de"]
    waited = {s.owner: s.waited for s in story.spans}
    assert waited == {"merge_de": 0.0, "merge_fr": 0.0, "fix_de": 10.0}
    assert {s.owner: s.end for s in story.spans} == dict.fromkeys(("merge_de", "merge_fr", "fix_de"),
                                                                   AuditKind.RELEASE)
    assert [(w.waiter.owner, w.ahead.owner) for w in story.waits] == [("fix_de", "merge_de")]
    verdict = story.waits[0].verdict
    assert verdict.conflict and verdict.exception in set(ConflictKind)
    assert "merge_de" in verdict.reason and "fix_de" in verdict.reason
    # merge_fr held its lease beside both; fix_de was granted exactly when merge_de released.
    assert {(a.owner, b.owner) for a, b in story.together} == {("merge_de", "merge_fr"), ("merge_fr", "fix_de")}
    assert story.peak == 2


def test_a_wait_for_a_non_conflicting_reason_names_no_conflict_and_unfinished_leases_stay_open(
        request_for: Request) -> None:
    clock = Clock()
    store = MemoryLeaseStore(clock=clock)
    first = store.acquire(request_for("first", "UPDATE", "country = 'DE'", max_writers=1))
    clock.now += 2
    second = store.acquire(request_for("second", "UPDATE", "country = 'FR'", max_writers=1))
    assert first.granted and not second.granted   # only the pool's writer limit holds it back
    clock.now += 4
    store.release(first.request_id, "first")

    story = PoolStory.from_audit(reversed(store.history(limit=1000)))   # any order: event ids sort it

    assert [s.owner for s in story.spans] == ["first", "second"]
    assert story.waits == ()   # the two could not conflict: the wait was the writer limit's
    second_span = story.spans[1]
    assert second_span.waited == 4.0 and second_span.ended_at is None and second_span.end is None
    assert story.together == () and story.peak == 1


def test_events_of_a_request_asked_before_the_window_are_left_out(request_for: Request) -> None:
    clock = Clock()
    store = MemoryLeaseStore(clock=clock)
    old = store.acquire(request_for("old", "OPTIMIZE"))
    clock.now += 1
    events = store.history(limit=1000)
    store.release(old.request_id, "old")
    later = [e for e in store.history(limit=1000) if e.event_id not in {x.event_id for x in events}]
    assert PoolStory.from_audit(later).spans == ()


def test_a_deeply_nested_audit_detail_is_read_as_no_request() -> None:
    """An audit row's detail is untrusted text: nesting deeper than Python decodes is no request,
    not a RecursionError (issue #20)."""
    from airflow_delta_occ.pools.requests import AuditEvent

    deep = "[" * 100_000 + "]" * 100_000
    event = AuditEvent(at=1.0, pool="p", table="/t", request_id="r1", owner="o", kind=AuditKind.REQUEST,
                       summary="s", detail=deep)
    story = PoolStory.from_audit([event])
    assert [span.request for span in story.spans] == [None]
