"""``airflow delta-occ leases`` prints any lease the store holds, however odd its times."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from airflow_delta_occ.cli import commands
from airflow_delta_occ.engine import DeltaLog, Snapshot
from airflow_delta_occ.engine.planner import TableState, plan_footprint
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
from airflow_delta_occ.pools.requests import LeaseRequest, utc_text

from ..engine.logbuilder import LogBuilder, add, commit_info, metadata, protocol

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("epoch", [1e300, -1e300, 1e18, -1e18, 2**63, 10**400, math.inf, -math.inf, math.nan, 0.0,
                                   253402300800.0])
def test_time_formatting_never_raises(epoch: float) -> None:
    text = utc_text(epoch)
    assert isinstance(text, str) and text and len(text) < 80


def test_time_formatting_of_ordinary_times() -> None:
    assert utc_text(None) == "-"
    assert utc_text(0) == "1970-01-01T00:00:00+00:00"
    assert utc_text(1_700_000_000.5) == "2023-11-14T22:13:20+00:00"


def _store_and_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Snapshot]:
    """A SQLite store the ``delta_occ_leases`` connection names, and a table with one file in DE."""
    db = tmp_path / "leases.db"
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_LEASES", json.dumps(
        {"conn_type": "delta_occ_leases", "extra": {"backend": "sqlite", "path": str(db)}}))
    builder = LogBuilder(tmp_path / "sales")
    builder.commit(commit_info("CREATE TABLE"), protocol(), metadata())
    builder.commit(commit_info(), add("DE-0.parquet", {"date": "2024-01-01", "country": "DE"}))
    return db, DeltaLog.for_table(builder.root).snapshot()


@pytest.mark.parametrize("clock", [1e12, 1e15, 1e18])
def test_leases_lists_a_lease_whose_times_are_out_of_any_calendar(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], clock: float) -> None:
    db, snapshot = _store_and_table(tmp_path, monkeypatch)
    with SqlLeaseStore(f"sqlite:///{db}", clock=lambda: clock) as store:
        assert store.acquire(LeaseRequest.of(
            pool="sales", table="file:///sales", owner="far_future", ttl=600.0, table_state=TableState.of(snapshot),
            footprint=plan_footprint(snapshot, "UPDATE", "country = 'DE'", label="u"))).granted
    args = argparse.Namespace(table=None, pool=None, history=5, conn_id="delta_occ_leases", output="table",
                              verbose=False)
    commands.leases(args)
    out = capsys.readouterr().out
    assert "Holders (1)" in out and "far_future" in out


@pytest.mark.parametrize("history", [-1, 100_001, 10**30])
def test_a_history_count_out_of_range_is_a_usage_error(capsys: pytest.CaptureFixture[str], history: int) -> None:
    args = argparse.Namespace(table=None, pool=None, history=history, conn_id="delta_occ_leases", output="table",
                              verbose=False)
    with pytest.raises(SystemExit) as info:
        commands.leases(args)
    assert info.value.code == commands.EXIT_USAGE
    assert "--history must be from 0 to 100000" in capsys.readouterr().err


def test_each_waiter_is_listed_with_whom_it_waits_for_and_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #24: the listing said who waits, not on whom; the store explains it from a read (no heartbeat)."""
    db, snapshot = _store_and_table(tmp_path, monkeypatch)

    def request(owner: str, operation: str, predicate: str | None) -> LeaseRequest:
        return LeaseRequest.of(pool="sales", table="file:///sales", owner=owner, ttl=600.0,
                               table_state=TableState.of(snapshot),
                               footprint=plan_footprint(snapshot, operation, predicate, label=owner))

    with SqlLeaseStore(f"sqlite:///{db}") as store:
        assert store.acquire(request("optimizer", "OPTIMIZE", None)).granted
        waiting = store.acquire(request("updater", "UPDATE", "country = 'DE'"))
        assert not waiting.granted
        before = [(r.request_id, r.expires_at) for r in store.waiters()]
        assert store.waiting_for(pool="sales")[waiting.request_id][0].owner == "optimizer"
        assert [(r.request_id, r.expires_at) for r in store.waiters()] == before   # a read: no heartbeat given
    args = argparse.Namespace(table=None, pool="sales", history=0, conn_id="delta_occ_leases", output="table",
                              verbose=False)
    commands.leases(args)
    waiters = capsys.readouterr().out.split("Waiters")[1]
    assert "WAITS_FOR" in waiters and "optimizer" in waiters.split("updater", 1)[1], waiters
    commands.leases(argparse.Namespace(**{**vars(args), "output": "json"}))
    shown = json.loads(capsys.readouterr().out)
    [waiter] = shown["waiters"]
    assert [b["owner"] for b in waiter["waits_for"]] == ["optimizer"] and waiter["waits_for"][0]["reason"], waiter
