"""Shared unit fixtures: a small partitioned table whose Delta log is written by hand (no Spark), and a
SQLite lease store that the ``delta_occ_leases`` connection names. Every test under this folder is marked
``unit`` here, so none can be left out of ``make test-unit`` by a module that forgets its ``pytestmark``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_delta_occ.engine import DeltaLog, Snapshot
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore

from .engine.logbuilder import LogBuilder, add, commit_info, metadata, protocol

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before tests/conftest.py checks that every test has its tier
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under this folder is in the ``unit`` tier (``make test-unit``: ``pytest tests -m unit``)."""
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.unit)


@pytest.fixture
def sales_log(tmp_path: Path) -> tuple[str, Snapshot]:
    """``sales`` partitioned by (date, country): two files in each of DE and FR on 2024-01-01."""
    b = LogBuilder(tmp_path / "sales")
    b.commit(commit_info("CREATE TABLE"), protocol(), metadata())
    b.commit(commit_info(), *(add(f"{c}-{i}.parquet", {"date": "2024-01-01", "country": c})
                              for c in ("DE", "FR") for i in range(2)))
    return str(b.root), DeltaLog.for_table(b.root).snapshot()


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SqlLeaseStore]:
    """A real SQLite lease store, named by the ``delta_occ_leases`` connection (environment)."""
    db = tmp_path / "leases.db"
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_LEASES", json.dumps(
        {"conn_type": "delta_occ_leases", "extra": {"backend": "sqlite", "path": str(db)}}))
    store = SqlLeaseStore(f"sqlite:///{db}")
    yield store
    store.close()
