"""The arbiter's cost: decisions grow about linearly with the waiters, and the partition index changes none.

Issue #23 measured the grant rule as quadratic (every waiter compared with every earlier one, every
blocker collected). Counted here as comparisons (``lease_verdict`` calls), not as time, so the claim
holds on any machine; ``benchmarks/arbiter_scale.py`` times it up to 1,000 waiters.
"""

from __future__ import annotations

import datetime
import itertools
import random
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog, Snapshot
from airflow_delta_occ.engine.planner import TableState, plan_footprint
from airflow_delta_occ.pools import compare
from airflow_delta_occ.pools.arbiter import (
    EXPLAIN_AHEAD_LIMIT,
    UNCOMPARED,
    Candidate,
    Decision,
    Explainer,
    Remembered,
    decide,
)
from airflow_delta_occ.pools.compare import PairJudge, PlannedJob, compact, reach

from ..engine.logbuilder import LogBuilder, add, commit_info, metadata, protocol
from .contract import record_calls

pytestmark = pytest.mark.unit


def _dates(n: int) -> list[str]:
    return [str(datetime.date(2020, 1, 1) + datetime.timedelta(days=i)) for i in range(n)]


def _table(root: Path, dates: Sequence[str], countries: Sequence[str] = ("DE",)) -> Snapshot:
    b = LogBuilder(root)
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata(("date", "country") if countries else ()))
    b.commit(commit_info(), *(add(f"{d}-{c}.parquet", {"date": d, "country": c} if countries else {})
                              for d in dates for c in (countries or ("",))))
    return DeltaLog.for_table(b.root).snapshot()


def _candidate(snapshot: Snapshot, seq: int, op: str, predicate: str | None, *, indexed: bool = True,
               granted_at: float | None = None, hold: float | None = None, model: str = "delta",
               **options: Any) -> Candidate:
    job = PlannedJob(compact(plan_footprint(snapshot, op, predicate, label=f"r{seq}", **options)),
                     TableState.of(snapshot))
    spanned = reach(job, model)  # type: ignore[arg-type]
    return Candidate(request_id=f"r{seq}", key=(f"r{seq}", 0), table="t", owner=f"o{seq}", load=lambda: job,
                     model=model, max_writers=None, granted_at=granted_at, seq=seq, hold=lambda: hold,
                     span=(lambda: spanned) if indexed else (lambda: None))


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every pair compared (``lease_verdict`` calls; a memo hit is not one)."""
    return record_calls(monkeypatch, compare, "lease_verdict")


@pytest.mark.parametrize("n", [50, 200])
def test_waiters_behind_a_whole_table_lease_cost_one_comparison_each(tmp_path: Path, n: int,
                                                                     counted: list[tuple[Any, ...]]) -> None:
    dates = _dates(n)
    snapshot = _table(tmp_path / "t", dates)
    optimize = _candidate(snapshot, 0, "OPTIMIZE", None, granted_at=0.0)
    waiters = [_candidate(snapshot, i + 1, "UPDATE", f"date = '{d}'") for i, d in enumerate(dates)]
    decision = decide([optimize], waiters, PairJudge())
    assert not decision.granted and all(b[0].owner == "o0" for b in decision.blockers.values())
    assert len(counted) == n, "one comparison per waiter (was n(n+1)/2: each with every earlier one)"
    counted.clear()
    released = decide([], waiters, PairJudge())
    assert len(released.granted) == n and counted == [], "partition-disjoint requests are never compared"


def test_a_remembered_blocker_still_held_costs_no_comparison(tmp_path: Path, counted: list[tuple[Any, ...]]) -> None:
    dates = _dates(30)
    snapshot = _table(tmp_path / "t", dates)
    optimize = _candidate(snapshot, 0, "OPTIMIZE", None, granted_at=0.0)
    waiters = [_candidate(snapshot, i + 1, "UPDATE", f"date = '{d}'") for i, d in enumerate(dates)]
    first = decide([optimize], waiters, PairJudge())
    remembered = [Candidate(**{**_fields(w), "remembered": first.remember[w.request_id]}) for w in waiters]
    assert all(isinstance(r.remembered, Remembered) for r in remembered)
    counted.clear()
    again = decide([optimize], remembered, PairJudge())   # a fresh process: nothing judged yet
    assert counted == [] and again.blockers == first.blockers
    moved = Candidate(**{**_fields(optimize), "key": ("r0", 1)})   # the holder re-planned: judged again
    decide([moved], remembered, PairJudge())
    assert len(counted) == len(waiters)


def test_a_chain_on_one_partition_costs_one_comparison_per_waiter_when_the_holder_leaves(
        tmp_path: Path, counted: list[tuple[Any, ...]]) -> None:
    snapshot = _table(tmp_path / "t", ["2024-01-01"], countries=())
    waiters = [_candidate(snapshot, i, "UPDATE", "id > 3") for i in range(1, 101)]
    decision = decide([], waiters, PairJudge())
    assert decision.granted == ("r1",)
    assert len(counted) == 99, "each later waiter stops at the first lease it conflicts with"


def _fields(c: Candidate) -> dict[str, Any]:
    return {f: getattr(c, f) for f in ("request_id", "key", "table", "owner", "load", "model", "max_writers",
                                       "granted_at", "seq", "hold", "span", "remembered")}


MENU: list[tuple[str, str | None, dict[str, Any]]] = [
    ("UPDATE", "date = '{d}' AND country = '{c}'", {}),
    ("UPDATE", "country = '{c}'", {}),
    ("DELETE", "date = '{d}' AND id > 3", {}),
    ("MERGE", "t.id = s.id AND t.date = '{d}'", {"target_alias": "t", "write_partitions": [
        {"date": "{d}", "country": "{c}"}]}),
    ("OPTIMIZE", "date = '{d}'", {}),
    ("OPTIMIZE", None, {}),
    ("INSERT", None, {"write_partitions": [{"date": "{d}", "country": "{c}"}]}),
    ("INSERT", None, {}),
    ("UPDATE", "date >= '{d}'", {}),
    ("REPLACE_WHERE", "date = '{d}' AND country IN ('{c}', 'FR')", {}),
]


def _fill(value: Any, d: str, c: str) -> Any:
    if isinstance(value, str):
        return value.replace("{d}", d).replace("{c}", c)
    if isinstance(value, list):
        return [_fill(v, d, c) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, d, c) for k, v in value.items()}
    return value


@pytest.mark.parametrize("seed", range(12))
def test_the_partition_index_changes_no_decision(tmp_path: Path, seed: int) -> None:
    """The index only skips pairs that cannot conflict, so the decision with it equals the decision that
    compares every pair: same grants, same blockers, same remembered leases (rule 2a included)."""
    rng = random.Random(seed)
    dates, countries = _dates(4), ("DE", "FR", "IT")
    snapshot = _table(tmp_path / "t", dates, countries)
    model = rng.choice(["delta", "databricks", "maxcompute"])
    plans = []
    for seq in range(rng.randint(8, 24)):
        op, predicate, options = rng.choice(MENU)
        d, c = rng.choice(dates), rng.choice(countries)
        held = rng.random() < 0.25
        plans.append((seq, op, _fill(predicate, d, c), _fill(options, d, c), held, rng.choice([None, 5.0, 50.0])))

    def decision(indexed: bool) -> Decision:
        made = [(held, _candidate(snapshot, seq, op, predicate, indexed=indexed, model=model,
                                  granted_at=0.0 if held else None, hold=hold, **options))
                for seq, op, predicate, options, held, hold in plans]
        return decide([c for held, c in made if held], [c for held, c in made if not held], PairJudge(), now=1.0)

    # holders are whatever the draw made them (they may conflict): the rule is judged on the waiters
    with_index, without = decision(True), decision(False)
    assert with_index == without
    assert any(itertools.chain(with_index.granted, with_index.blockers))


def test_a_request_does_not_go_ahead_of_one_that_also_waits_for_a_lease_of_unknown_length(tmp_path: Path) -> None:
    """Review: rule 2a weighed only the first lease the overtaken request waited for; one it also waits for
    with no estimate makes its start unknown, so nobody may go ahead of it (as before the index)."""
    snapshot = _table(tmp_path / "t", ["2024-01-01", "2024-01-02"], ("DE", "FR"))
    known = _candidate(snapshot, 0, "UPDATE", "date = '2024-01-01' AND country = 'DE'", granted_at=0.0, hold=100.0)
    unknown = _candidate(snapshot, 1, "UPDATE", "date = '2024-01-01' AND country = 'FR'", granted_at=0.0, hold=None)
    both = _candidate(snapshot, 2, "UPDATE", "date = '2024-01-01'", hold=10.0)
    short = _candidate(snapshot, 3, "INSERT", None, hold=5.0, write_partitions=[{"date": "2024-01-01",
                                                                                 "country": "IT"}])
    assert decide([known, unknown], [both, short], PairJudge(), now=1.0).granted == ()
    # with both estimates known, the short insert fits in their shadow and goes ahead
    known_too = _candidate(snapshot, 1, "UPDATE", "date = '2024-01-01' AND country = 'FR'", granted_at=0.0, hold=50.0)
    assert decide([known, known_too], [both, short], PairJudge(), now=1.0).granted == ("r3",)


@pytest.mark.parametrize("earlier", [EXPLAIN_AHEAD_LIMIT, EXPLAIN_AHEAD_LIMIT + 1])
def test_an_explanation_says_when_it_did_not_compare_every_earlier_request(tmp_path: Path, earlier: int) -> None:
    snapshot = _table(tmp_path / "t", ["2024-01-01"])
    held = _candidate(snapshot, 0, "UPDATE", "date = '2024-01-01'", granted_at=0.0)
    into = {"write_partitions": [{"date": "2024-01-01", "country": "DE"}]}
    waiting = [_candidate(snapshot, i, "INSERT", None, **into) for i in range(1, earlier + 2)]   # blind: apart
    blockers = Explainer([held], waiting, PairJudge()).explain(waiting[-1])
    assert blockers[0].request_id == "r0" and blockers[0].granted
    if earlier == EXPLAIN_AHEAD_LIMIT:   # all compared, none conflicts: nothing more to say
        assert len(blockers) == 1
    else:
        assert blockers[1].request_id is None and blockers[1].owner == UNCOMPARED


@pytest.mark.parametrize("indexed", [True, False])
def test_a_request_in_a_line_is_explained_by_the_one_directly_ahead_of_it(tmp_path: Path, indexed: bool) -> None:
    """Issue #23: the explanation named the first request in line, a new pair for every waiter each time the
    line moved; the request directly ahead stays the same. Partitioned requests (the index merges its
    per-partition lists backwards, a request of two dates filed under both) and requests of unknown reach
    (every request of the table) alike."""
    snapshot = _table(tmp_path / "t", ["2024-01-01", "2024-01-02", "2024-01-03"])
    held = _candidate(snapshot, 0, "OPTIMIZE", None, granted_at=0.0, indexed=indexed)
    dates = {i: ("2024-01-01", "2024-01-02") if i == 4 else (f"2024-01-0{1 + i % 3}",) for i in range(1, 13)}
    waiting = [_candidate(snapshot, i, "UPDATE", "date IN (" + ", ".join(f"'{d}'" for d in dates[i]) + ")",
                          indexed=indexed) for i in range(1, 13)]
    explainer = Explainer([held], waiting, PairJudge())
    for w in waiting:
        named = [b.request_id for b in explainer.explain(w)]
        ahead = [o.request_id for o in waiting if o.seq < w.seq and set(dates[o.seq]) & set(dates[w.seq])]
        # every held lease, then the nearest earlier request sharing a date (none: first in line on its dates)
        assert named == ["r0", *ahead[-1:]], (w.request_id, named)


def test_a_batched_answer_behind_somebody_names_the_lease_the_decision_kept(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A triggerer's answers (``every_held_lease=False``): a waiter behind another names the held lease its
    request keeps, not every held lease, so no waiter is judged against a new holder; every held lease when
    nothing is kept, or when nobody is ahead (what the estimate of a waiter near its grant needs)."""
    snapshot = _table(tmp_path / "t", ["2024-01-01"])
    first = _candidate(snapshot, 0, "UPDATE", "date = '2024-01-01'", granted_at=0.0)
    second = _candidate(snapshot, 1, "OPTIMIZE", None, granted_at=0.0)
    front = _candidate(snapshot, 2, "UPDATE", "date = '2024-01-01'")
    kept = Remembered(first.key, first.request_id, "kept", ("r3", 0))
    behind = replace(_candidate(snapshot, 3, "UPDATE", "date = '2024-01-01'"), remembered=kept)
    forgetful = _candidate(snapshot, 4, "UPDATE", "date = '2024-01-01'")
    batched = Explainer([first, second], [front, behind, forgetful], PairJudge(), every_held_lease=False)
    assert [b.request_id for b in batched.explain(front)] == ["r0", "r1"]
    judged = record_calls(monkeypatch, compare, "lease_verdict")
    blockers = batched.explain(behind)
    assert [(b.request_id, b.reason) for b in blockers] == [("r0", "kept"), ("r2", blockers[1].reason)]
    assert len(judged) == 1, "only the pair with the request ahead was judged"
    assert [b.request_id for b in batched.explain(forgetful)] == ["r0", "r1", "r3"]
    single = Explainer([first, second], [front, behind, forgetful], PairJudge())
    assert [b.request_id for b in single.explain(behind)] == ["r0", "r1", "r2"]


def test_a_walk_back_stops_after_the_limit_and_says_so(tmp_path: Path) -> None:
    snapshot = _table(tmp_path / "t", ["2024-01-01"])
    held = _candidate(snapshot, 0, "UPDATE", "date = '2024-01-01'", granted_at=0.0)
    into = {"write_partitions": [{"date": "2024-01-01", "country": "DE"}]}
    waiting = [_candidate(snapshot, i, "INSERT", None, **into) for i in range(1, EXPLAIN_AHEAD_LIMIT + 3)]
    last = Explainer([held], waiting, PairJudge(), every_held_lease=False).explain(waiting[-1])
    assert [b.request_id for b in last] == ["r0", None] and last[1].owner == UNCOMPARED
