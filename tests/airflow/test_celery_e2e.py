"""Conflict pools where platform teams run Airflow: the CeleryExecutor on a Redis broker, metadata on
PostgreSQL, two hosts each with a scheduler, a triggerer and a Celery worker (``tests/deployment.py``),
every Delta job on one Spark Connect server, the lease store on the same PostgreSQL server.

Two backfills through one conflict pool run at once (``celery_dags/delta_occ_scale.py``): DAYS
date-partition overwrites that never conflict, and WRITERS MERGEs of an unpartitioned table that all
conflict. One fault lands in the middle: the Celery worker running one of the MERGEs is killed
(SIGKILL of the worker and its task processes, a host lost) while that MERGE holds its lease and its
commit is held at the gate, then the host's worker comes back. ``make bench-scale`` runs the same
backfills with a thousand tasks and the other faults. What must hold afterwards, read from the parts'
own records (Airflow's task instances and XComs, the lease store's audit, the Delta log):

* every task succeeded; the killed MERGE was retried by Airflow, and its write is in the table once
  (one commit per writer, whichever try made it), with no Delta conflict anywhere;
* the flat table's leases never overlapped, the killed holder's lease ended by expiry (TTL), and the
  next MERGE was granted only after it; the dated writers held leases side by side;
* both tables are exactly what the writers wrote;
* the lease store's connection is kept in the metadata database only, and the tasks, the triggerers and
  the CLI on either host found it there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
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
TTL, HEARTBEAT = 15.0, 3.0
SLOTS = 4                     # per Celery worker (and what each scheduler queues at most)
RUN_TIMEOUT = 600.0


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
        # The lease store's connection lives in the metadata database (added below), as on most platforms:
        # workers, triggerers, schedulers and the CLI on either host read it from there.
        settings = scale.airflow_settings(root, pools, spark_url=spark["url"], lease_url=None, days=DAYS,
                                          writers=WRITERS, slots=SLOTS, hold="flat:first",
                                          quick_failure_detection=True)
        with CeleryDeployment(work / "airflow", postgres_server, scale.DAGS, settings=settings,
                              worker_concurrency=SLOTS, database="celery_e2e_airflow") as deployment, \
                SqlLeaseStore(lease_url) as store:
            started = time.monotonic()
            deployment.cli("connections", "add", "delta_occ_leases", "--conn-json", scale.lease_connection(lease_url))
            deployment.cli("delta-occ", "pools", "sync", host="b")   # the CLI from any host
            deployment.wait_for_dags(scale.DATED, scale.FLAT, timeout=600)
            print(f"\ndeployment up in {time.monotonic() - started:.0f} s")
            outcome = scale.run_backfills(deployment, store, root, "e2e", fault=scale.kill_the_held_writer,
                                          timeout=RUN_TIMEOUT)
            print(f"runs {outcome.states}; fault: {outcome.fault}")
            yield {"root": root, "deployment": deployment, "store": store, "outcome": outcome}


def test_every_task_succeeded_once_with_exact_tables_despite_the_killed_worker(celery_run: dict[str, Any]) -> None:
    outcome: scale.Outcome = celery_run["outcome"]
    assert "killed" in outcome.fault, "the held MERGE never reached its commit with a waiter behind it"
    assert scale.problems(outcome, celery_run["root"], days=DAYS, writers=WRITERS) == []
    held = outcome.fault["held"]
    tries = {ti["map_index"]: ti["try_number"] for ti in outcome.tis[scale.FLAT]}
    assert tries[held] >= 2, tries   # Airflow retried the task whose worker died
    result = outcome.xcoms[scale.FLAT][("merge_one", held)]
    print("the killed MERGE's retry", "found its first try's commit" if result.get("already_committed")
          else "wrote it")


def test_the_dead_holders_lease_expired_before_the_next_grant(celery_run: dict[str, Any]) -> None:
    events = celery_run["outcome"].events
    flat = [s for s in scale.table_story(events, "/flat").spans if s.granted_at is not None]
    held = celery_run["outcome"].fault["held"]
    killed = [s for s in flat if scale.owner_key(s.owner) == (scale.FLAT, held) and s.owner.endswith("/1")]
    assert len(killed) == 1 and killed[0].end is AuditKind.EXPIRE and killed[0].ended_at is not None, killed
    after = [s.granted_at for s in flat if s.granted_at > killed[0].granted_at]
    assert after and min(after) >= killed[0].ended_at, (killed, after[:2])
    # The dead worker may have run date writers too: their leases expired and their retries took new ones.
    dated = scale.table_story(events, "/dated")
    granted = [s for s in dated.spans if s.granted_at is not None]
    retried = {(scale.DATED, ti["map_index"]) for ti in celery_run["outcome"].tis[scale.DATED] if ti["try_number"] > 1}
    assert {scale.owner_key(s.owner) for s in granted} == {(scale.DATED, i) for i in range(DAYS)}
    assert all(s.end is AuditKind.RELEASE or scale.owner_key(s.owner) in retried for s in granted), granted
    assert dated.together, "the disjoint writers never held leases together"


def test_nothing_was_left_in_the_pool_and_the_cli_reads_it_from_either_host(celery_run: dict[str, Any]) -> None:
    assert celery_run["store"].records(pool=scale.POOL) == []
    last = celery_run["outcome"].events[-3:]
    for host in ("a", "b"):
        out = celery_run["deployment"].cli("delta-occ", "leases", "--pool", scale.POOL, "-o", "json",
                                           "--history", "3", host=host)
        shown = json.loads(out[out.index("{"):])
        assert shown["holders"] == [] and shown["waiters"] == [], shown
        assert [e["event_id"] for e in shown["history"]] == [e.event_id for e in last], (shown, last)
