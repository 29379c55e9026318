"""A Delta task in a conflict pool waits, deferred, for a conflicting lease, then runs, in a real Airflow run.

``airflow dags test`` runs ``tests/airflow/dags/delta_occ_conflict_pool.py``: one ``DeltaUpdateOperator``
with ``conflict_pool="sales"`` on a small table this test writes (a Parquet file and a hand-written
Delta log, so Spark starts once, in the task). Before the run, the test holds a conflicting lease
(an OPTIMIZE of the whole table, owned by "blocker") in a SQLite lease store; a thread releases it
about 5 s after the task's request appears. The task's acquire is told to wait, it defers to
``DeltaLeaseTrigger`` (which ``dags test`` runs in line), resumes in ``execute_complete`` and runs the
UPDATE with the lease. The evidence: the task's state and XCom in Airflow's database, the lease
store's audit, and the Delta log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.planner import TableState, plan_footprint
from airflow_delta_occ.pools.config import normalize_table
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
from airflow_delta_occ.pools.requests import AuditKind, LeaseRequest

from .conftest import AIRFLOW
from .test_task_retries import _query

HERE = Path(__file__).resolve().parent
DAG_ID = "delta_occ_conflict_pool"
TASK_ID = "update_in_pool"
HOLD_SECONDS = 5.0
RUN_TIMEOUT = 600.0


def _write_table(path: Path) -> None:
    """A two-row unpartitioned Delta table: one Parquet file and the commit that adds it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (path / "_delta_log").mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["seed", "seed"]}), path / "part-0.parquet")
    schema = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}},
                                           {"name": "v", "type": "string", "nullable": True, "metadata": {}}]}
    actions = [
        {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "CREATE TABLE"}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": {"id": "conflict-pool-sales", "format": {"provider": "parquet", "options": {}},
                      "schemaString": json.dumps(schema), "partitionColumns": [], "configuration": {},
                      "createdTime": int(time.time() * 1000)}},
        {"add": {"path": "part-0.parquet", "partitionValues": {}, "size": (path / "part-0.parquet").stat().st_size,
                 "modificationTime": int(time.time() * 1000), "dataChange": True}},
    ]
    (path / "_delta_log" / f"{0:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def _hold_then_release(store: SqlLeaseStore, table: str, blocker: str, released: dict[str, float]) -> None:
    """Release the blocker's lease HOLD_SECONDS after the task's request starts waiting behind it."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while not store.waiters(table=table) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(HOLD_SECONDS)
    released["at"] = time.time()
    store.release(blocker, "blocker")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("conflict_pool")
    home, lake, leases = work / "airflow", work / "lake", work / "leases.db"
    home.mkdir()
    table = lake / "sales"
    _write_table(table)
    pools = work / "pools.toml"
    pools.write_text(f'[pools.sales]\ntables = ["{lake}/**"]\nlease_ttl = "60s"\nheartbeat = "2s"\n')
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(HERE / "dags"),
        "AIRFLOW__DELTA_OCC__POOL_FILE": str(pools),
        "AIRFLOW_CONN_DELTA_OCC_LEASES": json.dumps({"conn_type": "delta_occ_leases",
                                                     "extra": {"backend": "sqlite", "path": str(leases)}}),
        "DELTA_OCC_TEST_ROOT": str(lake),
    }
    store = SqlLeaseStore(f"sqlite:///{leases}")
    snapshot = DeltaLog.for_table(str(table)).snapshot()
    key = normalize_table(str(table))
    blocker = store.acquire(LeaseRequest.of(pool="sales", table=key, owner="blocker",
                                            footprint=plan_footprint(snapshot, "OPTIMIZE"),
                                            table_state=TableState.of(snapshot), ttl=600.0))
    assert blocker.granted
    released: dict[str, float] = {}
    releaser = threading.Thread(target=_hold_then_release, args=(store, key, blocker.request_id, released),
                                daemon=True)
    try:
        migrate = subprocess.run([*AIRFLOW, "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
        assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
        releaser.start()
        started = time.monotonic()
        test = subprocess.run([*AIRFLOW, "dags", "test", DAG_ID, "2024-01-01"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=RUN_TIMEOUT)
        print(f"\ndags test: {time.monotonic() - started:.0f} s")
        (work / "dags-test.log").write_text(test.stdout)
        releaser.join(30)
        db = home / "airflow.db"
        [ti] = _query(db, "SELECT state, try_number FROM task_instance WHERE dag_id = ? AND task_id = ?",
                      DAG_ID, TASK_ID)
        xcom = _query(db, "SELECT value FROM xcom WHERE dag_id = ? AND task_id = ? AND key = 'return_value'",
                      DAG_ID, TASK_ID)
        value: Any = xcom[0]["value"] if xcom else None
        while isinstance(value, str | bytes):
            value = json.loads(value)
        yield {"ti": ti, "xcom": value, "log": test.stdout, "work": work, "table": str(table), "key": key,
               "history": store.history(pool="sales"), "records": store.records(), "released": released}
    finally:
        store.close()


def test_the_task_waited_for_the_blocker_and_succeeded(run: dict[str, Any]) -> None:
    assert run["ti"]["state"] == "success", f"see {run['work'] / 'dags-test.log'}"
    assert run["ti"]["try_number"] == 1  # the deferral resumed the same try
    lease = run["xcom"]["lease"]
    assert lease["pool"] == "sales" and lease["waited_for"] == ["blocker"] and lease["lost"] is False
    assert lease["waited"] >= HOLD_SECONDS - 1, lease
    assert run["xcom"]["confirmed"] is True and run["xcom"]["version"] == 1
    assert "running trigger in line" in run["log"]


def test_the_audit_shows_the_grant_after_the_blockers_release(run: dict[str, Any]) -> None:
    owner = f"{DAG_ID}/{TASK_ID}/"
    events = [(e.kind, e.owner) for e in run["history"]]
    mine = [(k, o) for k, o in events if o.startswith(owner)]
    assert [k for k, _ in mine if k is not AuditKind.RENEW] == [AuditKind.REQUEST, AuditKind.GRANT,
                                                                AuditKind.RELEASE], events
    assert events.index((AuditKind.RELEASE, "blocker")) < events.index(mine[1])
    assert events.index((AuditKind.REQUEST, mine[0][1])) < events.index((AuditKind.RELEASE, "blocker"))
    assert run["records"] == []  # no lease left behind


def test_the_update_committed_once_under_the_lease(run: dict[str, Any]) -> None:
    history = DeltaLog.for_table(run["table"]).history()
    assert [c.commit_info.operation for c in reversed(history) if c.commit_info] == ["CREATE TABLE", "UPDATE"]
    commit_at = history[0].commit_info.timestamp / 1000  # type: ignore[union-attr]
    assert commit_at >= run["released"]["at"] - 1
