"""The backfill scenario of ``celery_dags/delta_occ_scale.py``, shared by the Celery e2e test and
``make bench-scale``: its tables, its Airflow settings, and what its parts recorded (the Delta log,
the lease store's audit), read back as typed facts.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.pools.leases.base import LeaseStore
from airflow_delta_occ.pools.requests import AuditEvent
from airflow_delta_occ.pools.story import PoolStory

from ..deployment import CeleryDeployment
from ..unit.engine.logbuilder import LogBuilder, commit_info, metadata, protocol

HERE = Path(__file__).resolve().parent
DAGS = HERE / "celery_dags"
DATED, FLAT = "delta_occ_scale_dated", "delta_occ_scale_flat"
POOL = "scale"


def write_table(path: Path, columns: list[tuple[str, str]], partitions: list[str]) -> None:
    """An empty Delta table (one commit: protocol and metadata) at ``path``."""
    schema = {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}}
                                           for n, t in columns]}
    LogBuilder(path).commit(commit_info("CREATE TABLE"), protocol(),
                            metadata(partitions, schema=schema, table_id=f"scale-{path.name}"))


def write_tables(root: Path) -> None:
    write_table(root / "dated", [("id", "long"), ("day", "date"), ("v", "string")], ["day"])
    write_table(root / "flat", [("id", "long"), ("v", "string")], [])
    (root / "gate").mkdir()


def pool_file(root: Path, path: Path, *, ttl: float, heartbeat: float) -> Path:
    path.write_text(f'[pools.{POOL}]\ntables = ["{root}/dated", "{root}/flat"]\n'
                    f'lease_ttl = "{ttl:g}s"\nheartbeat = "{heartbeat:g}s"\n')
    return path


def lease_connection(lease_url: str) -> str:
    """The ``delta_occ_leases`` connection as JSON (an environment variable's value, or ``--conn-json``)."""
    return json.dumps({"conn_type": "delta_occ_leases", "extra": {"url": lease_url}})


def airflow_settings(root: Path, pools: Path, *, spark_url: str, lease_url: str | None, days: int, writers: int,
                     slots: int, hold: str = "", quick_failure_detection: bool = False) -> dict[str, str]:
    """Airflow environment every host gets: the pool file, the connections (the lease store's only when
    ``lease_url`` is given; else it must be added to the metadata database), the scenario's size.

    Each scheduler queues at most ``slots`` (its share of the workers' slots: queued tasks then start at
    once instead of waiting behind a backlog in the broker, which would count as hand-over time), and a
    task queued for 90 s is queued again (one a killed worker had taken is not lost for Airflow's default
    10 minutes). ``quick_failure_detection`` (fault runs): a dead task is noticed in 20 s, a dead
    scheduler or triggerer in 15 s; elsewhere Airflow's defaults, which a loaded machine does not trip.
    """
    quick = {
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
        "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
    }
    return {
        **(quick if quick_failure_detection else {}),
        "AIRFLOW__CORE__PARALLELISM": str(slots),
        "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "90",
        "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "15",
        "AIRFLOW__DELTA_OCC__POOL_FILE": str(pools),
        "AIRFLOW_CONN_DELTA_OCC_DEFAULT": json.dumps({"conn_type": "delta_occ",
                                                      "extra": {"mode": "connect", "connect_url": spark_url}}),
        **({"AIRFLOW_CONN_DELTA_OCC_LEASES": lease_connection(lease_url)} if lease_url else {}),
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "1024",
        "DELTA_OCC_SCALE_ROOT": str(root),
        "DELTA_OCC_SCALE_DAYS": str(days),
        "DELTA_OCC_SCALE_WRITERS": str(writers),
        "DELTA_OCC_SCALE_HOLD": hold,
    }


def expected_dated(days: int) -> dict[int, tuple[str, str]]:
    from datetime import date, timedelta

    first = date(2021, 1, 1)
    return {i * 10 + k: ((first + timedelta(days=i)).isoformat(), f"d{i}") for i in range(days) for k in range(3)}


def expected_flat(writers: int) -> dict[int, str]:
    return {j: f"w{j}" for j in range(writers)}


def table_rows(table: str) -> list[dict[str, Any]]:
    """Every row of the table's newest snapshot, read from its data files (no deletion vectors here),
    with its partition values."""
    import os
    from urllib.parse import unquote

    import pyarrow.parquet as pq

    rows = []
    for add in DeltaLog.for_table(table).snapshot().files():
        for r in pq.read_table(os.path.join(table, unquote(add.path))).to_pylist():
            rows.append({**r, **add.partition_values})
    return rows


def commits_by_writer(table: str) -> Counter[tuple[str, int]]:
    """How many commits each (dag_id, map_index) made to the table (from commitInfo.userMetadata)."""
    counts: Counter[tuple[str, int]] = Counter()
    for commit in DeltaLog.for_table(table).history():
        info = commit.commit_info
        if info is None or not info.user_metadata:
            continue
        tag = json.loads(info.user_metadata).get("airflow", {})
        counts[(tag["dag_id"], int(tag["map_index"]))] += 1
    return counts


def table_story(events: list[AuditEvent], table_suffix: str) -> PoolStory:
    """The pool's story (``pools.story``: spans, pairs held together, peak) for one table's events."""
    return PoolStory.from_audit(e for e in events if e.table.endswith(table_suffix))


def owner_key(owner: str) -> tuple[str, int]:
    """(dag_id, map_index) of a lease owner ``dag/task/run/map/try``."""
    dag_id, _task, _run, map_index, _try = owner.split("/")
    return dag_id, int(map_index)


# -- one run of the backfills, with a fault ----------------------------------------------------------
#: A fault: called in a thread once both runs are triggered, with the deployment, the lease store, the
#: scenario's root and a dict to record what it did in.
Fault = Callable[[CeleryDeployment, LeaseStore, Path, dict[str, Any]], None]


@dataclass
class Outcome:
    """What one run of the backfills left: run states, task instances, XComs by (task, map index), the
    pool's audit, what the fault recorded, and each run's start and end on the metadata database's clock."""

    states: dict[str, str]
    tis: dict[str, list[dict[str, Any]]]
    xcoms: dict[str, dict[tuple[str, int], Any]]
    events: list[AuditEvent]
    fault: dict[str, Any] = field(default_factory=dict)
    run_times: dict[str, tuple[float, float]] = field(default_factory=dict)


def run_backfills(deployment: CeleryDeployment, store: LeaseStore, root: Path, run_id: str, *,
                  dag_ids: tuple[str, ...] = (DATED, FLAT), fault: Fault | None = None,
                  timeout: float = 900.0) -> Outcome:
    """Trigger ``dag_ids`` at once, run ``fault`` beside them, wait until every run has ended."""
    log: dict[str, Any] = {}

    def run_fault() -> None:
        assert fault is not None
        try:
            fault(deployment, store, root, log)
        except Exception as error:   # recorded: a fault that did not happen must not pass silently
            log["error"] = f"{type(error).__name__}: {error}"

    thread = threading.Thread(target=run_fault, daemon=True) if fault else None
    if thread:
        thread.start()
    for dag_id in dag_ids:
        deployment.trigger(dag_id, run_id)
    states = {dag_id: deployment.wait_for_run(dag_id, run_id, timeout=timeout) for dag_id in dag_ids}
    if thread:
        thread.join(120)
        if thread.is_alive():
            log["error"] = "the fault was still running when the runs had ended"
    run_times = {}
    for dag_id in dag_ids:
        [row] = deployment.query("SELECT extract(epoch FROM start_date) AS s, extract(epoch FROM end_date) AS e "
                                 "FROM dag_run WHERE dag_id = %s AND run_id = %s", dag_id, run_id)
        run_times[dag_id] = (float(row["s"]), float(row["e"]))
    events = store.history(pool=POOL, limit=1_000_000)   # a read: repeated by the store after a restart
    return Outcome(states, {d: deployment.task_instances(d, run_id) for d in dag_ids},
                   {d: deployment.xcoms(d, run_id) for d in dag_ids}, events, log, run_times)


def problems(outcome: Outcome, root: Path, *, days: int, writers: int) -> list[str]:
    """Every way the run broke the promise, as sentences (none: every task done once, no Delta conflict in
    any task's final result, exact tables, one commit per writer, no two conflicting leases at once)."""
    found = [f"{d} ended {s}" for d, s in outcome.states.items() if s != "success"]
    if "error" in outcome.fault:
        found.append(f"fault: {outcome.fault['error']}")
    for dag_id, xcoms in outcome.xcoms.items():
        expected = days if dag_id == DATED else writers
        if len(xcoms) != expected:
            found.append(f"{dag_id}: {len(xcoms)} results for {expected} tasks")
        found += [f"{dag_id} {key}: {r}" for key, r in xcoms.items()
                  if r is None or r.get("status") != "success" or r.get("conflicts")]
    if DATED in outcome.states:
        commits = commits_by_writer(str(root / "dated"))
        if commits != {(DATED, i): 1 for i in range(days)}:
            found.append(f"dated commits per writer: {sorted(commits.items())[:10]} ... ({len(commits)} writers)")
        dated_rows = table_rows(str(root / "dated"))
        rows = {r["id"]: (str(r["day"]), r["v"]) for r in dated_rows}
        if len(dated_rows) != len(rows) or rows != expected_dated(days):
            found.append(f"dated table: {len(dated_rows)} rows ({len(rows)} ids), not the {3 * days} written")
    if FLAT in outcome.states:
        commits = commits_by_writer(str(root / "flat"))
        if commits != {(FLAT, j): 1 for j in range(writers)}:
            found.append(f"flat commits per writer: {sorted(commits.items())}")
        flat_rows = table_rows(str(root / "flat"))
        if len(flat_rows) != writers or {r["id"]: r["v"] for r in flat_rows} != expected_flat(writers):
            found.append(f"flat table: {sorted((r['id'], r['v']) for r in flat_rows)}")
        found += [f"conflicting leases at once: {a.owner} and {b.owner}"
                  for a, b in table_story(outcome.events, "/flat").together]
    return found


def flat_waiters(store: LeaseStore) -> int:
    """How many requests wait in the pool for the flat table."""
    return sum(1 for r in store.waiters(pool=POOL) if r.table.endswith("/flat"))


def wait_until(condition: Callable[[], bool], timeout: float = 600.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def kill_the_held_writer(deployment: CeleryDeployment, store: LeaseStore, root: Path, log: dict[str, Any]) -> None:
    """Once the held MERGE's commit waits at the gate with another MERGE waiting behind its lease, SIGKILL
    the worker running it with its task processes (a host lost), start that host's worker again, and let
    the dead task's commit go on (its Spark job lives on in the Connect server)."""
    gate = root / "gate"
    if not wait_until(lambda: (gate / "held.reached").exists()):
        log["error"] = "the held MERGE never reached its commit"
        return
    # The gate fails a commit held for 180 s: give up well before, and let it go.
    if not wait_until(lambda: flat_waiters(store) > 0, timeout=150):
        (gate / "held.release").touch()
        log["error"] = "no MERGE waited behind the held one"
        return
    host = deployment.host_running(int((gate / "held.pid").read_text()))
    log["waiting_at_kill"] = flat_waiters(store)
    deployment.kill(host.name, "worker")
    log.update(killed=time.time(), host=host.name, held=int((gate / "held.index").read_text()))
    deployment.spawn(host, "worker")
    (gate / "held.release").touch()


def triggers_by_triggerer(deployment: CeleryDeployment) -> dict[int | None, int]:
    rows = deployment.query("SELECT triggerer_id, count(*) AS n FROM trigger GROUP BY triggerer_id")
    return {r["triggerer_id"]: int(r["n"]) for r in rows}


def kill_a_triggerer(deployment: CeleryDeployment, store: LeaseStore, root: Path, log: dict[str, Any]) -> None:
    """Once both triggerers run deferred waiters, SIGKILL host a's triggerer (with its trigger runner) and
    record how long until every trigger belongs to a triggerer that is alive (the other one)."""
    def both_busy() -> bool:
        counts = triggers_by_triggerer(deployment)
        return len([t for t, n in counts.items() if t is not None and n > 0]) >= 2
    if not wait_until(both_busy):
        log["error"] = "the two triggerers never both ran waiters"
        return
    before = triggers_by_triggerer(deployment)
    alive_before = {r["id"] for r in deployment.query(
        "SELECT id FROM job WHERE job_type = 'TriggererJob' AND state = 'running'")}
    deployment.kill("a", "triggerer")
    killed = time.time()
    log.update(killed=killed, triggers_before=before, waiting_at_kill=flat_waiters(store))
    # The dead triggerer's job stops heartbeating; the survivor takes its triggers once the health check
    # threshold has passed. Which one died: the job whose heartbeat stops.
    def taken_over() -> bool:
        live = {r["id"] for r in deployment.query(
            "SELECT id FROM job WHERE job_type = 'TriggererJob' AND state = 'running' "
            "AND latest_heartbeat > now() - interval '15 seconds'")}
        held = {t for t, n in triggers_by_triggerer(deployment).items() if n}
        return bool(alive_before - live) and held <= live
    if wait_until(taken_over, timeout=300):
        log["taken_over_after"] = round(time.time() - killed, 1)
        log["triggers_after"] = triggers_by_triggerer(deployment)


def kill_a_scheduler(deployment: CeleryDeployment, store: LeaseStore, root: Path, log: dict[str, Any]) -> None:
    """Once MERGEs wait in the pool, SIGKILL host a's scheduler; the other one carries on alone."""
    if not wait_until(lambda: flat_waiters(store) > 0):
        log["error"] = "no MERGE ever waited"
        return
    deployment.kill("a", "scheduler")
    log.update(killed=time.time(), waiting_at_kill=flat_waiters(store))


def restart_postgres(server: Any, *, down_seconds: float = 5.0) -> Fault:
    """A fault that stops the lease store's PostgreSQL server abruptly (``immediate``: a crash) once MERGEs
    wait in the pool, keeps it down ``down_seconds``, and starts it again on the same port."""
    def fault(deployment: CeleryDeployment, store: LeaseStore, root: Path, log: dict[str, Any]) -> None:
        if not wait_until(lambda: flat_waiters(store) > 0):
            log["error"] = "no MERGE ever waited"
            return
        log["waiting_at_kill"] = flat_waiters(store)
        server.crash()
        log["stopped"] = time.time()
        try:
            time.sleep(down_seconds)
        finally:
            server.restart()
        log["started"] = time.time()
    return fault
