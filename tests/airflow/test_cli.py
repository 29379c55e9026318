"""``airflow delta-occ``: the real ``airflow`` CLI in a throwaway AIRFLOW_HOME with its own SQLite metadata DB.

Every assertion reads what a real ``airflow`` process printed or stored: pools are checked with Airflow's
own ``airflow pools list``, DAGs reach the metadata database through ``airflow dags reserialize``, and the
lease store is a SQLite file seeded by ``SqlLeaseStore`` and read back through the ``delta_occ_leases``
connection from the environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.cli.commands import DELTA_TEMPLATE_FIELDS
from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.planner import TableState, plan_footprint
from airflow_delta_occ.pools.config import normalize_table
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
from airflow_delta_occ.pools.requests import LeaseRequest

from ..unit.engine.logbuilder import LogBuilder, add, commit_info, metadata, protocol
from .conftest import AIRFLOW

pytestmark = pytest.mark.airflow

DAG_FILE = '''
import datetime as dt
from airflow.sdk import DAG, task
from airflow_delta_occ.operators.delta import DeltaOptimizeOperator, DeltaUpdateOperator

class TeamOptimize(DeltaOptimizeOperator):
    """A Delta operator subclassed in a DAG file: serialized with this file's module."""

with DAG(dag_id="cli_pools", schedule=None, start_date=dt.datetime(2024, 1, 1)):
    DeltaOptimizeOperator(task_id="compact_missing", table="/lake/sales", pool="delta_missing")
    TeamOptimize(task_id="subclass_missing", table="/lake/sales", pool="delta_missing_too")
    DeltaUpdateOperator(task_id="update_routed", table="/lake/sales", set={"v": "1"}, pool="delta_occ_sales")
    DeltaOptimizeOperator.partial(task_id="mapped_missing", pool="delta_missing_mapped").expand(
        table=["/lake/a", "/lake/b"])

    @task(pool="not_delta_missing")
    def plain() -> None:
        pass

    plain()
'''

POOLS = '''
[pools.sales]
tables = ["s3://lake/sales/**"]
max_writers = {writers}
description = "Sales fact tables"

[pools.events]
tables = ["/lake/events/*"]
airflow_pool = "delta_events"
'''


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AIRFLOW, *args], env=env, capture_output=True, text=True, timeout=300)


def _json(text: str) -> Any:
    """The JSON document a CLI printed (log lines, if any, come before it)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(("[", "{")))
    return json.loads("\n".join(lines[start:]))


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A migrated AIRFLOW_HOME whose DAG folder holds Delta tasks in missing and existing pools."""
    import os

    home = tmp_path_factory.mktemp("cli_home")
    dags = home / "dags"
    dags.mkdir()
    (dags / "cli_pools.py").write_text(DAG_FILE)
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW__DELTA_OCC__POOL_FILE": str(home / "pools.toml"),
           "AIRFLOW_CONN_DELTA_OCC_LEASES": json.dumps(
               {"conn_type": "delta_occ_leases", "extra": {"backend": "sqlite", "path": str(home / "leases.db")}})}
    for command in (["db", "migrate"], ["dags", "reserialize"]):
        done = _run(env, *command)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    yield env


def _write_pools(env: dict[str, str], writers: int) -> None:
    Path(env["AIRFLOW__DELTA_OCC__POOL_FILE"]).write_text(POOLS.format(writers=writers))


def _airflow_pools(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The pools as Airflow's own ``airflow pools list`` reports them."""
    out = _run(env, "pools", "list", "--output", "json")
    assert out.returncode == 0, out.stderr
    return {p["pool"]: p for p in _json(out.stdout)}


def test_sync_creates_then_keeps_then_updates_the_pools_and_reports_delta_tasks_in_missing_pools(
        cli_env: dict[str, str]) -> None:
    _write_pools(cli_env, writers=3)
    first = _run(cli_env, "delta-occ", "pools", "sync")
    assert first.returncode == 1, first.stdout + first.stderr  # Delta tasks are routed to missing pools
    assert "Traceback" not in first.stderr
    assert [line.split()[:2] for line in first.stdout.splitlines()[2:4]] == [
        ["created", "delta_occ_sales"], ["created", "delta_events"]]
    # Every Delta task in a missing pool, the mapped one and the DAG file's subclass included; the routed
    # Delta task and the plain task (not Delta) are not named.
    assert "ERROR: 3 Delta tasks are routed to an Airflow pool that does not exist" in first.stderr
    for task_id, pool in (("compact_missing", "delta_missing"), ("subclass_missing", "delta_missing_too"),
                          ("mapped_missing", "delta_missing_mapped")):
        assert f"task {task_id!r}" in first.stderr and f"pool {pool!r}" in first.stderr
    assert "update_routed" not in first.stderr and "not_delta_missing" not in first.stderr

    pools = _airflow_pools(cli_env)
    assert (pools["delta_occ_sales"]["slots"], pools["delta_occ_sales"]["include_deferred"]) == ("3", "False")
    assert (pools["delta_events"]["slots"], pools["delta_events"]["include_deferred"]) == ("-1", "False")
    assert "conflict pool 'sales'" in pools["delta_occ_sales"]["description"]

    again = _run(cli_env, "delta-occ", "pools", "sync", "--no-fail")
    assert again.returncode == 0, again.stderr
    assert [line.split()[:2] for line in again.stdout.splitlines()[2:4]] == [
        ["unchanged", "delta_occ_sales"], ["unchanged", "delta_events"]]
    assert "WARNING: 3 Delta tasks are routed" in again.stderr

    _write_pools(cli_env, writers=5)
    dry = _run(cli_env, "delta-occ", "pools", "sync", "--dry-run", "--no-fail")
    assert dry.returncode == 0, dry.stderr
    assert "would update  delta_occ_sales" in dry.stdout and "slots 3 -> 5" in dry.stdout
    listed = _run(cli_env, "delta-occ", "pools", "list", "--output", "json")
    assert listed.returncode == 0, listed.stderr
    by_pool = {row["pool"]: row for row in _json(listed.stdout)}
    assert by_pool["sales"] | {"tables": None} == {
        "pool": "sales", "airflow_pool": "delta_occ_sales", "model": "delta", "max_writers": 5, "exists": True,
        "slots": 3, "include_deferred": False, "in_sync": False, "tables": None}  # the dry run changed nothing
    assert (by_pool["events"]["max_writers"], by_pool["events"]["slots"], by_pool["events"]["in_sync"]) == (
        None, -1, True)

    updated = _run(cli_env, "delta-occ", "pools", "sync", "--no-fail")
    assert updated.returncode == 0, updated.stderr
    assert "updated    delta_occ_sales" in updated.stdout and "slots 3 -> 5" in updated.stdout
    assert _airflow_pools(cli_env)["delta_occ_sales"]["slots"] == "5"


def test_an_unusable_pool_file_exits_2_naming_the_entry_and_changes_nothing(
        cli_env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[pools.sales]\ntables = ["s3://lake/sales/**"]\nmax_writers = 0\n'
                   '[pools.extra]\ntables = ["s3://lake/extra/*"]\n')
    out = _run(cli_env, "delta-occ", "pools", "sync", "--pool-file", str(bad))
    assert out.returncode == 2
    assert "pools.sales.max_writers: expected a positive integer, got 0" in out.stderr
    assert str(bad) in out.stderr and "Traceback" not in out.stderr
    assert "delta_occ_extra" not in _airflow_pools(cli_env)


@pytest.fixture
def seeded_store(cli_env: dict[str, str], tmp_path: Path) -> str:
    """Two holders on a table (DE and FR) and a DELETE of DE waiting behind the DE holder; returns the table."""
    builder = LogBuilder(tmp_path / "sales")
    builder.commit(commit_info("CREATE TABLE"), protocol(), metadata())
    builder.commit(commit_info(), *(add(f"{c}-{i}.parquet", {"date": "2024-01-01", "country": c})
                                    for c in ("DE", "FR") for i in range(2)))
    snapshot = DeltaLog.for_table(builder.root).snapshot()
    table = normalize_table(str(builder.root))

    def request(owner: str, operation: str, predicate: str) -> LeaseRequest:
        return LeaseRequest.of(pool="sales", table=table, owner=owner, ttl=600.0, table_state=TableState.of(snapshot),
                               footprint=plan_footprint(snapshot, operation, predicate, label=owner))

    extra = json.loads(cli_env["AIRFLOW_CONN_DELTA_OCC_LEASES"])["extra"]
    with SqlLeaseStore(f"sqlite:///{extra['path']}") as store:
        assert store.acquire(request("update_de", "UPDATE", "country = 'DE'")).granted
        assert store.acquire(request("update_fr", "UPDATE", "country = 'FR'")).granted
        assert not store.acquire(request("delete_de", "DELETE", "country = 'DE'")).granted
        assert store.acquire(LeaseRequest.of(  # another pool and table: filtered out below
            pool="other", table="main.other.t", owner="other_pool", ttl=600.0, table_state=TableState.of(snapshot),
            footprint=plan_footprint(snapshot, "OPTIMIZE", None, label="other"))).granted
    return str(builder.root)


def test_leases_lists_holders_waiters_and_the_audit(cli_env: dict[str, str], seeded_store: str) -> None:
    out = _run(cli_env, "delta-occ", "leases", "--pool", "sales", "--history", "4", "--output", "json")
    assert out.returncode == 0, out.stderr
    doc = _json(out.stdout)
    table = normalize_table(seeded_store)
    assert doc["table"] is None and doc["pool"] == "sales"
    assert [(r["owner"], r["status"], r["table"]) for r in doc["holders"]] == [
        ("update_de", "granted", table), ("update_fr", "granted", table)]
    assert [(r["owner"], r["status"]) for r in doc["waiters"]] == [("delete_de", "waiting")]
    assert "DELETE 'delete_de'" in doc["waiters"][0]["summary"]
    # The newest four events, oldest first: the FR grant, then the DELETE's request (it waits: no grant).
    assert [(e["kind"], e["owner"]) for e in doc["history"]] == [
        ("grant", "update_de"), ("request", "update_fr"), ("grant", "update_fr"), ("request", "delete_de")]

    # Text output, filtered by the table as a user types it (a plain path: compared in normal form).
    text = _run(cli_env, "delta-occ", "leases", "--table", seeded_store + "/", "--history", "2")
    assert text.returncode == 0, text.stderr
    sections = text.stdout.split("\n\n")
    assert sections[0].startswith("Holders (2)") and "update_de" in sections[0] and "update_fr" in sections[0]
    assert sections[1].startswith("Waiters (1, in arrival order)") and "delete_de" in sections[1]
    assert sections[2].startswith("History (latest 2, oldest first)")
    assert [line.split()[1] for line in sections[2].splitlines()[2:]] == ["grant", "request"]
    assert "other_pool" not in text.stdout


def test_leases_reads_a_connection_kept_in_the_metadata_database(cli_env: dict[str, str], seeded_store: str) -> None:
    """Issue #23: the command found only connections in environment variables, not one made with
    ``airflow connections add`` (the metadata database) as platform teams keep them."""
    extra = json.loads(cli_env["AIRFLOW_CONN_DELTA_OCC_LEASES"])["extra"]
    added = _run(cli_env, "connections", "add", "db_leases", "--conn-type", "delta_occ_leases",
                 "--conn-extra", json.dumps(extra))
    assert added.returncode == 0, added.stderr
    out = _run(cli_env, "delta-occ", "leases", "--conn-id", "db_leases", "--table", seeded_store, "--output", "json")
    assert out.returncode == 0, out.stderr
    assert [r["owner"] for r in _json(out.stdout)["holders"]] == ["update_de", "update_fr"]


def test_leases_without_a_store_connection_names_it_and_exits_1(cli_env: dict[str, str]) -> None:
    out = _run(cli_env, "delta-occ", "leases", "--conn-id", "no_such_leases")
    assert out.returncode == 1
    assert "'no_such_leases'" in out.stderr and "Traceback" not in out.stderr


def test_the_cli_definitions_load_no_pyarrow_numpy_or_spark_and_match_the_operators() -> None:
    """Airflow imports the definitions on every ``airflow`` invocation."""
    from airflow_delta_occ.operators.delta import DeltaBaseOperator

    assert set(DELTA_TEMPLATE_FIELDS) <= set(DeltaBaseOperator.template_fields)
    code = textwrap.dedent("""
        import sys
        from airflow_delta_occ.cli import get_provider_cli_definitions
        [group] = get_provider_cli_definitions()
        assert group.name == "delta-occ", group.name
        print(sorted({m.split('.')[0] for m in sys.modules} & {"pyarrow", "numpy", "pyspark", "py4j", "delta"}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
