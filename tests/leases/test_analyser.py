"""The audit analyser can fail: hand-made audits that break each property, and one a real store wrote.

``test_contention`` trusts ``workload.analyse`` to find conflicting overlaps, unfair or late grants, lost
leases and a broken writer limit; each test here hands it an audit with exactly one such fault (and a clean
twin) and checks that the fault, and only it, is reported.
"""

from __future__ import annotations

import json

import pytest

from airflow_delta_occ.engine.planner import Model, Verdict
from airflow_delta_occ.pools.compare import PairJudge, PlannedJob
from airflow_delta_occ.pools.leases.memory import MemoryLeaseStore
from airflow_delta_occ.pools.requests import AuditEvent, AuditKind, LeaseRequest

from .workload import Analysis, MenuItem, WaitBound, analyse, build_menu, find_item, request_for

pytestmark = pytest.mark.unit

UPDATE_DE = ("sales", "UPDATE 2024-01-01/DE")
DELETE_DE = ("sales", "DELETE 2024-01-01/DE")     # same partition as UPDATE_DE: can conflict with it
UPDATE_FR = ("sales", "UPDATE 2024-01-01/FR")     # another partition: cannot conflict with UPDATE_DE
OPTIMIZE = ("sales", "OPTIMIZE whole table")      # can conflict with every job above


@pytest.fixture
def menu(lease_tables: dict[str, str]) -> dict[str, list[MenuItem]]:
    return build_menu(lease_tables)


class Audit:
    """Builds a pool's audit by hand, numbering events in the order they are added (the commit order)."""

    def __init__(self, menu: dict[str, list[MenuItem]]) -> None:
        self.menu = menu
        self.events: list[AuditEvent] = []
        self.requests: dict[str, LeaseRequest] = {}

    def _add(self, kind: AuditKind, owner: str, at: float, detail: str = "") -> None:
        request = self.requests[owner]
        self.events.append(AuditEvent(at=at, pool=request.pool, table=request.table, request_id=f"id-{owner}",
                                      owner=owner, kind=kind, summary=request.summary, detail=detail,
                                      event_id=len(self.events) + 1))

    def request(self, owner: str, job: tuple[str, str], at: float, max_writers: int | None = None,
                expected_hold: float | None = None) -> Audit:
        self.requests[owner] = request_for(find_item(self.menu, *job), owner, max_writers=max_writers,
                                           expected_hold=expected_hold)
        self._add(AuditKind.REQUEST, owner, at, json.dumps(self.requests[owner].to_json()))
        return self

    def grant(self, owner: str, at: float) -> Audit:
        self._add(AuditKind.GRANT, owner, at)
        return self

    def release(self, owner: str, at: float) -> Audit:
        self._add(AuditKind.RELEASE, owner, at)
        return self


def _only(analysis: Analysis, tag: str) -> str:
    assert len(analysis.problems) == 1 and analysis.problems[0].startswith(tag), analysis.problems
    return analysis.problems[0]


def test_conflicting_leases_one_after_the_other_pass(menu: dict[str, list[MenuItem]]) -> None:
    audit = (Audit(menu).request("a", UPDATE_DE, 0.0).grant("a", 0.0).request("b", DELETE_DE, 0.01)
             .release("a", 0.05).grant("b", 0.05).release("b", 0.1))
    analysis = analyse(audit.events)
    assert analysis.problems == []
    assert len(analysis.grants) == 2 and analysis.waited_for_conflict == 1
    assert analysis.max_wait == pytest.approx(0.04)


def test_a_conflicting_overlap_fails_and_names_both_jobs(menu: dict[str, list[MenuItem]]) -> None:
    audit = (Audit(menu).request("a", UPDATE_DE, 0.0).grant("a", 0.0).request("b", DELETE_DE, 0.01)
             .grant("b", 0.02).release("a", 0.05).release("b", 0.1))
    problem = _only(analyse(audit.events), "(a) conflicting leases held together on contention/sales")
    assert "a [sales: UPDATE 2024-01-01/DE]" in problem and "b [sales: DELETE 2024-01-01/DE]" in problem


def test_an_overlap_hidden_by_a_clock_tie_still_fails(menu: dict[str, list[MenuItem]]) -> None:
    # One millisecond of the store's clock for everything: only the commit order shows the overlap.
    audit = (Audit(menu).request("a", UPDATE_DE, 1.0).grant("a", 1.0).request("b", DELETE_DE, 1.0)
             .grant("b", 1.0).release("a", 1.0).release("b", 1.0))
    _only(analyse(audit.events), "(a) conflicting leases held together")


def test_overlapping_leases_on_other_partitions_pass(menu: dict[str, list[MenuItem]]) -> None:
    audit = (Audit(menu).request("a", UPDATE_DE, 0.0).grant("a", 0.0).request("b", UPDATE_FR, 0.01)
             .grant("b", 0.01).release("a", 0.05).release("b", 0.1))
    analysis = analyse(audit.events)
    assert analysis.problems == [] and analysis.waited_for_conflict == 0
    assert analysis.max_holders == {"contention": 2}


def test_overtaking_an_earlier_waiter_fails(menu: dict[str, list[MenuItem]]) -> None:
    # The compaction waits for "a"; "c" conflicts only with the compaction, so it must queue behind it.
    audit = (Audit(menu).request("a", UPDATE_DE, 0.0).grant("a", 0.0).request("opt", OPTIMIZE, 0.01)
             .request("c", UPDATE_FR, 0.02).grant("c", 0.02).release("c", 0.03).release("a", 0.05)
             .grant("opt", 0.05).release("opt", 0.1))
    problem = _only(analyse(audit.events), "(a) fairness")
    assert "c [sales: UPDATE 2024-01-01/FR]" in problem and "opt [sales: OPTIMIZE whole table]" in problem


def test_going_ahead_in_the_holders_shadow_passes_and_ending_after_it_fails(menu: dict[str, list[MenuItem]]) -> None:
    """Rule 2a: "c" may go ahead of the compaction while "a" holds, when it is expected to end before "a" is;
    the compaction's later grant is then explained by "c" (property e). Expected to end after "a", it may not."""
    def audit(c_hold: float) -> Audit:
        return (Audit(menu).request("a", UPDATE_DE, 0.0, expected_hold=1.0).grant("a", 0.0)
                .request("opt", OPTIMIZE, 0.01, expected_hold=2.0)
                .request("c", UPDATE_FR, 0.02, expected_hold=c_hold).grant("c", 0.02)
                .release("a", 0.5).release("c", 1.2).grant("opt", 1.2).release("opt", 2.0))
    assert analyse(audit(0.9).events).problems == []
    fairness, late = analyse(audit(1.0).events).problems   # and the compaction's delay is then unexplained
    assert fairness.startswith("(a) fairness") and late.startswith("(e) opt [sales: OPTIMIZE whole table]")
    assert "c [sales: UPDATE 2024-01-01/FR]" in fairness and "opt [sales: OPTIMIZE whole table]" in fairness


def test_a_shadow_cast_by_a_request_that_went_ahead_fails(menu: dict[str, list[MenuItem]]) -> None:
    """Only leases that arrived before the waiter cast the shadow: once "a" (600 s expected) ended after 1 s,
    the compaction waits only for "c", which went ahead of it, and "e" may not go ahead in "c"'s shadow."""
    audit = (Audit(menu).request("a", UPDATE_DE, 0.0, expected_hold=600.0).grant("a", 0.0)
             .request("opt", OPTIMIZE, 0.01, expected_hold=2.0)
             .request("c", UPDATE_FR, 0.02, expected_hold=500.0).grant("c", 0.02).release("a", 1.0)
             .request("e", DELETE_DE, 2.0, expected_hold=10.0).grant("e", 2.0).release("e", 3.0)
             .release("c", 400.0).grant("opt", 400.0).release("opt", 402.0))
    problem = _only(analyse(audit.events), "(a) fairness")
    assert "e [sales: DELETE 2024-01-01/DE]" in problem and "opt [sales: OPTIMIZE whole table]" in problem


def test_a_grant_that_never_ends_fails(menu: dict[str, list[MenuItem]]) -> None:
    audit = Audit(menu).request("a", UPDATE_DE, 0.0).grant("a", 0.0)
    assert "never released nor expired" in _only(analyse(audit.events), "(b)")


def test_a_release_of_a_lease_never_granted_fails(menu: dict[str, list[MenuItem]]) -> None:
    audit = Audit(menu).request("a", UPDATE_DE, 0.0).release("a", 0.1)
    assert "which held nothing" in _only(analyse(audit.events), "(b)")


def test_more_holders_than_the_writer_limit_fails(menu: dict[str, list[MenuItem]]) -> None:
    audit = Audit(menu)
    for n, job in enumerate([UPDATE_DE, UPDATE_FR, ("orders", "UPDATE 2024-01-01/DE")]):
        audit.request(f"w{n}", job, 0.0, max_writers=2).grant(f"w{n}", 0.0)
    for n in range(3):
        audit.release(f"w{n}", 0.1)
    assert "over its writer limit of 2" in _only(analyse(audit.events), "(c) 3 leases held")
    within = Audit(menu).request("w0", UPDATE_DE, 0.0, max_writers=2).grant("w0", 0.0)
    within.request("w1", UPDATE_FR, 0.0, max_writers=2).grant("w1", 0.0).release("w0", 0.1).release("w1", 0.1)
    assert analyse(within.events).problems == []


def test_a_wait_beyond_the_bound_fails(menu: dict[str, list[MenuItem]]) -> None:
    bound = WaitBound(workers=2, max_hold=0.06, poll_interval=0.02, per_op_overhead=0.01, slack=1.0)
    assert bound.seconds == pytest.approx(0.09)   # (2 - 1) * (0.06 + 0.02 + 0.01) * 1
    audit = (Audit(menu).request("a", UPDATE_DE, 0.0).grant("a", 0.0).request("b", DELETE_DE, 0.0)
             .release("a", 0.5).grant("b", 0.5).release("b", 0.6))
    assert "waited 0.500 s" in _only(analyse(audit.events, bound=bound), "(d) 1 grants waited longer")
    assert analyse(audit.events, bound=WaitBound(2, 0.5, 0.02, 0.01, 1.0)).problems == []


def test_a_waiter_left_waiting_after_everything_ahead_of_it_ended_fails(menu: dict[str, list[MenuItem]]) -> None:
    audit = (Audit(menu).request("a", UPDATE_DE, 0.0).grant("a", 0.0).request("b", DELETE_DE, 0.01)
             .release("a", 0.05).grant("b", 0.3).release("b", 0.4))
    assert "after the last of the 1 requests ahead of it ended at 0.050" in _only(analyse(audit.events), "(e)")


class _NeverConflicts(PairJudge):
    """A broken judge: every pair may run together."""

    def verdict(self, key_a: object, a: PlannedJob, key_b: object, b: PlannedJob, model: Model) -> Verdict:
        return Verdict(False, model, "broken judge")


@pytest.mark.parametrize("broken", [False, True])
def test_the_audit_of_a_real_store_is_judged_independently_of_its_arbiter(
        menu: dict[str, list[MenuItem]], broken: bool) -> None:
    store = MemoryLeaseStore(judge=_NeverConflicts() if broken else None)
    first = store.acquire(request_for(find_item(menu, *UPDATE_DE), "first"))
    second = store.acquire(request_for(find_item(menu, *DELETE_DE), "second"))
    assert first.granted and second.granted is broken
    store.release(first.request_id, "first")
    store.release(second.request_id, "second")
    analysis = analyse(store.history(limit=1000))
    if broken:
        _only(analysis, "(a) conflicting leases held together")
    else:
        assert analysis.problems == [] and analysis.waited_for_conflict == 1
