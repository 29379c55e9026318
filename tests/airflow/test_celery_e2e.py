"""Conflict pools where platform teams run Airflow: the CeleryExecutor on a Redis broker, metadata on
PostgreSQL, two hosts each with a scheduler, a triggerer and a Celery worker (``tests/deployment.py``),
every Delta job on one Spark Connect server, the lease store on the same PostgreSQL server.

Two backfills through one conflict pool run at once (``celery_dags/delta_occ_scale.py``): DAYS
date-partition overwrites that never conflict, and WRITERS MERGEs of an unpartitioned table that all
conflict. One fault lands in the middle: the Celery worker running one of the MERGEs is killed
(SIGKILL of the worker and its task processes, a host lost) while that MERGE holds its lease and its
commit is held at the gate, then the host's worker comes back. What must hold afterwards, read from
the parts' own records (Airflow's task instances and XComs, the lease store's audit, the Delta log):

* every task succeeded; the killed MERGE was retried by Airflow, and its write is in the table once
  (one commit per writer, whichever try made it), with no Delta conflict anywhere;
* the flat table's leases never overlapped, the killed holder's lease ended by expiry (TTL), and the
  next MERGE was granted only after it; the dated writers held leases side by side;
* both tables are exactly what the writers wrote;
* the lease CLI reads the same store from the other host.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
from airflow_delta_occ.pools.requests import AuditKind
from airflow_delta_occ.spark.session import delta_submit_conf

from ..deployment import CeleryDeployment
from ..pg import PostgresServer
from ..postgres.conftest import postgres_server  # noqa: F401 - the session's server
from ..servers import connect_server
from ..spark.differential.harness import gate_session_conf
from . import scale

pytestmark = pytest.mark.postgres

DAYS, WRITERS = 24, 8
HOLD = "flat:2"
TTL, HEARTBEAT = 15.0, 3.0
RUN_TIMEOUT = 600.0
RUN = "e2e"


def _kill_the_held_writer(deployment: CeleryDeployment, store: SqlLeaseStore, gate: Path,
                          log: dict[str, Any]) -> None:
    """Once the held MERGE's commit waits at the gate and another MERGE waits behind its lease, SIGKILL
    the worker host running it, start that host's worker again, and let the dead task's commit go."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while not ((gate / "held.reached").exists()
               and any(r.owner.startswith(scale.FLAT) for r in store.waiters(pool=scale.POOL))):
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)
    host = deployment.host_running(int((gate / "held.pid").read_text()))
    log["waiting_at_kill"] = len([r for r in store.waiters(pool=scale.POOL) if r.owner.startswith(scale.FLAT)])
    deployment.kill(host.name, "worker")
    log.update(killed=time.time(), host=host.name)
    deployment.spawn(host, "worker")
    (gate / "held.release").touch()   # the job lives on in the Connect server: its commit may still land


@pytest.fixture(scope="module")
def celery_run(tmp_path_factory: pytest.TempPathFactory,
               postgres_server: PostgresServer) -> Iterator[dict[str, Any]]:  # noqa: F811
    work = tmp_path_factory.mktemp("celery_e2e")
    root = work / "lake"
    scale.write_tables(root)
    pools = scale.pool_file(root, work / "pools.toml", ttl=TTL, heartbeat=HEARTBEAT)
    lease_url = postgres_server.create_database("celery_e2e_leases")
    (work / "spark").mkdir()
    with connect_server(work / "spark", {**delta_submit_conf(), **gate_session_conf(),
                                         "spark.hadoop.occ.armed.dir": str(root / "gate")}) as spark:
        settings = scale.airflow_settings(root, pools, spark_url=spark["url"], lease_url=lease_url, days=DAYS,
                                          writers=WRITERS, hold=HOLD)
        with CeleryDeployment(work / "airflow", postgres_server, scale.DAGS, settings=settings,
                              worker_concurrency=4, database="celery_e2e_airflow") as deployment, \
                SqlLeaseStore(lease_url) as store:
            started = time.monotonic()
            deployment.cli("delta-occ", "pools", "sync", host="b")   # the CLI from any host
            deployment.wait_for_dags(scale.DATED, scale.FLAT)
            print(f"\ndeployment up in {time.monotonic() - started:.0f} s")
            watched: dict[str, Any] = {}
            killer = threading.Thread(target=_kill_the_held_writer, args=(deployment, store, root / "gate", watched),
                                      daemon=True)
            killer.start()
            triggered = {dag_id: deployment.trigger(dag_id, RUN) for dag_id in (scale.DATED, scale.FLAT)}
            states = {dag_id: deployment.wait_for_run(dag_id, RUN, timeout=RUN_TIMEOUT) for dag_id in triggered}
            killer.join(30)
            print(f"runs {states} in {time.time() - min(triggered.values()):.0f} s; fault: {watched}")
            yield {"root": root, "deployment": deployment, "store": store, "states": states, "watched": watched,
                   "events": store.history(pool=scale.POOL, limit=100_000),
                   "tis": {d: deployment.task_instances(d, RUN) for d in triggered},
                   "xcoms": {d: deployment.xcoms(d, RUN) for d in triggered}}


def test_every_task_succeeded_and_the_killed_writer_was_retried(celery_run: dict[str, Any]) -> None:
    assert celery_run["states"] == {scale.DATED: "success", scale.FLAT: "success"}, celery_run["tis"]
    watched = celery_run["watched"]
    assert "killed" in watched, "the held MERGE never reached its commit with a waiter behind it"
    held = int(HOLD.split(":")[1])
    tries = {ti["map_index"]: ti["try_number"] for ti in celery_run["tis"][scale.FLAT]}
    assert tries[held] >= 2, tries
    for dag_id, xcoms in celery_run["xcoms"].items():
        assert len(xcoms) == (DAYS if dag_id == scale.DATED else WRITERS), (dag_id, sorted(xcoms))
        for key, result in xcoms.items():
            assert result["status"] == "success" and result["conflicts"] == [], (dag_id, key, result)


def test_each_writer_committed_once_and_the_tables_are_exact(celery_run: dict[str, Any]) -> None:
    root = celery_run["root"]
    dated = scale.commits_by_writer(str(root / "dated"))
    flat = scale.commits_by_writer(str(root / "flat"))
    assert dated == {(scale.DATED, i): 1 for i in range(DAYS)}, dated
    assert flat == {(scale.FLAT, j): 1 for j in range(WRITERS)}, flat
    held = int(HOLD.split(":")[1])
    result = celery_run["xcoms"][scale.FLAT][("merge_one", held)]
    print("the killed MERGE's retry:", "found its first try's commit" if result.get("already_committed")
          else "wrote it")
    assert {r["id"]: (str(r["day"]), r["v"]) for r in scale.table_rows(str(root / "dated"))} == \
        scale.expected_dated(DAYS)
    rows = scale.table_rows(str(root / "flat"))
    assert len(rows) == WRITERS and {r["id"]: r["v"] for r in rows} == scale.expected_flat(WRITERS)


def test_conflicting_leases_never_overlapped_and_the_dead_holder_expired(celery_run: dict[str, Any]) -> None:
    spans = scale.lease_spans(celery_run["events"])
    flat = [s for s in spans if s.table.endswith("/flat")]
    dated = [s for s in spans if s.table.endswith("/dated")]
    assert scale.overlapping(flat) == [], scale.overlapping(flat)
    held = int(HOLD.split(":")[1])
    killed = [s for s in flat if scale.owner_key(s.owner) == (scale.FLAT, held) and s.owner.endswith("/1")]
    assert len(killed) == 1 and killed[0].how is AuditKind.EXPIRE, killed
    after = [s for s in flat if s.granted > killed[0].granted]
    assert after and min(s.granted for s in after) >= killed[0].ended, (killed, after[:2])
    assert len(dated) == DAYS and scale.overlapping(dated), "the disjoint writers never held leases together"
    assert all(s.how is AuditKind.RELEASE for s in dated), dated


def test_nothing_was_left_in_the_pool_and_the_cli_reads_it_from_any_host(celery_run: dict[str, Any]) -> None:
    assert celery_run["store"].records(pool=scale.POOL) == []
    last = celery_run["events"][-3:]
    for host in ("a", "b"):
        out = celery_run["deployment"].cli("delta-occ", "leases", "--pool", scale.POOL, "-o", "json",
                                           "--history", "3", host=host)
        shown = json.loads(out[out.index("{"):])
        assert shown["holders"] == [] and shown["waiters"] == [], shown
        assert [e["event_id"] for e in shown["history"]] == [e.event_id for e in last], (shown, last)
