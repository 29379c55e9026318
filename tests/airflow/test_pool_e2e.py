"""Conflict pools on a real scheduler: eight writers to one table, with and without a pool, and a killed holder.

One Airflow installation (``airflow standalone``: scheduler with the LocalExecutor and parallelism 4,
DAG processor, API server, triggerer; SQLite metadata database) runs the DAGs of
``tests/airflow/dags/delta_occ_pool_e2e.py`` one after the other. Every Delta job runs on one Spark
Connect server with delta-spark (started once, as a platform runs Spark), whose LogStore can hold a
commit (the test gate); the lease store is a real PostgreSQL. What is asserted comes from what the
parts recorded: Airflow's task instances (sampled while the runs go, and at the end) and XComs, the
lease store's audit, and the Delta log.

1. ``delta_occ_e2e_pooled``: ``merge_p1``'s commit is held for HOLD_SECONDS while it holds its lease
   (and until ``update_p1``, which asks only once merge_p1 holds, waits behind it and a disjoint
   writer holds a lease alongside, capped).
   No task fails, Delta raises no conflict, writers that can conflict never hold leases (and never
   commit) at the same time, disjoint writers do, the table is the expected one. The writers wait as
   they do by default (adaptive, ``[delta_occ] worker_wait`` = WORKER_WAIT here): ``update_p1`` first
   in the worker, then deferred once it waited that long, keeping its one request throughout; no
   request is abandoned or left behind.
2. ``delta_occ_e2e_naive``: the same writers without the pool; ``merge_p1``'s commit is held until
   ``update_p1`` has committed, and delta-spark raises a real conflict (so the pooled proof is not
   vacuous: the pool is what kept the conflicts away).
3. ``delta_occ_e2e_kill``: the task process holding a lease is killed with SIGKILL while its commit
   is held; the waiting writer is granted within TTL + heartbeat of the kill, and the killed job's
   late commit is refused by Delta.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from airflow_delta_occ.demo import airflow_env, standalone
from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore
from airflow_delta_occ.pools.requests import AuditEvent, AuditKind, LeaseRequest
from airflow_delta_occ.spark.session import delta_submit_conf

from ..pg import PostgresServer
from ..postgres.conftest import postgres_server  # noqa: F401 - the session's server
from ..servers import connect_server
from ..spark.differential.harness import gate_session_conf
from .conftest import AIRFLOW
from .test_task_retries import _commits, _query, _xcom

pytestmark = pytest.mark.postgres

HERE = Path(__file__).resolve().parent
POOLED, NAIVE, KILL = "delta_occ_e2e_pooled", "delta_occ_e2e_naive", "delta_occ_e2e_kill"
WRITERS = ("merge_p1", "update_p1", "merge_p2", "optimize_p2", "update_p3", "delete_p4", "append_p5",
           "set_properties")
#: Pairs that can conflict (the same partition rewritten; a metadata change against everything).
CONFLICTING = {frozenset(p) for p in (("merge_p1", "update_p1"), ("merge_p2", "optimize_p2"))} | {
    frozenset(("set_properties", w)) for w in WRITERS if w != "set_properties"}
HOLD_SECONDS = 10.0          # merge_p1's commit is held this long in the pooled run
KILL_TTL, KILL_HEARTBEAT = 6.0, 2.0
WORKER_WAIT = 3.0            # [delta_occ] worker_wait: update_p1's wait (>= HOLD_SECONDS) starts here, then defers
RUN_TIMEOUT = 900.0
FINAL = {"success", "failed", "upstream_failed", "skipped"}
ROWS_PER_FILE = 50


# -- the table ------------------------------------------------------------------------------------
def _write_table(path: Path) -> None:
    """Partitions p = 1..4, each of ids p*1000 .. p*1000+99 in two files of 50 rows; m = u = 'seed'."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (path / "_delta_log").mkdir(parents=True)
    now = int(time.time() * 1000)
    schema = {"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}}
        for n, t in (("id", "long"), ("p", "integer"), ("m", "string"), ("u", "string"))]}
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": now, "operation": "CREATE TABLE"}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": {"id": f"e2e-{path.name}", "format": {"provider": "parquet", "options": {}},
                      "schemaString": json.dumps(schema), "partitionColumns": ["p"], "configuration": {},
                      "createdTime": now}},
    ]
    for p in range(1, 5):
        (path / f"p={p}").mkdir()
        for half in range(2):
            start = p * 1000 + half * ROWS_PER_FILE
            ids = list(range(start, start + ROWS_PER_FILE))
            name = f"p={p}/part-{half}.parquet"
            pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "m": ["seed"] * len(ids),
                                     "u": ["seed"] * len(ids)}), path / name)
            actions.append({"add": {"path": name, "partitionValues": {"p": str(p)},
                                    "size": (path / name).stat().st_size, "modificationTime": now,
                                    "dataChange": True}})
    (path / "_delta_log" / f"{0:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def _expected_rows() -> dict[int, tuple[int, str, str | None]]:
    """What the eight writers leave, in any order they commit: id -> (p, m, u)."""
    rows: dict[int, tuple[int, str, str | None]] = {}
    for p in range(1, 5):
        for i in range(p * 1000, p * 1000 + 100):
            rows[i] = (p, "seed", "seed")
    for i in range(1000, 1050):
        rows[i] = (1, "merged", "seed")          # merge_p1
    for i in range(1050, 1100):
        rows[i] = (1, "seed", "updated")         # update_p1
    for i in range(2000, 2050):
        rows[i] = (2, "merged", "seed")          # merge_p2 (optimize_p2 changes no row)
    for i in range(3000, 3050):
        rows[i] = (3, "seed", "updated")         # update_p3
    for i in range(4000, 4100, 2):
        del rows[i]                              # delete_p4
    for i in range(5000, 5100):
        rows[i] = (5, "appended", None)          # append_p5
    return rows


def _rows(table: str) -> dict[int, tuple[int, str, str | None]]:
    """The table's rows, read from the data files of its newest snapshot (no deletion vectors here)."""
    import pyarrow.parquet as pq

    rows: dict[int, tuple[int, str, str | None]] = {}
    for add in DeltaLog.for_table(table).snapshot().files():
        p = int(add.partition_values["p"])
        for r in pq.read_table(os.path.join(table, unquote(add.path))).to_pylist():
            assert r["id"] not in rows, f"row {r['id']} twice"
            rows[r["id"]] = (p, r["m"], r["u"])
    return rows


# -- watching a run -------------------------------------------------------------------------------
class Sampler(threading.Thread):
    """Samples the run's task instance states every 0.5 s: ``[(time, {task_id: state})]``."""

    def __init__(self, db: Path, dag_id: str, run_id: str) -> None:
        super().__init__(name=f"sampler-{dag_id}", daemon=True)
        self.db, self.dag_id, self.run_id = db, dag_id, run_id
        self.samples: list[tuple[float, dict[str, str | None]]] = []
        self.waits: dict[str, Any] = {}   # task -> its delta_occ_wait XCom, as read while it was deferred
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            rows = _query(self.db, "SELECT task_id, state FROM task_instance WHERE dag_id = ? AND run_id = ?",
                          self.dag_id, self.run_id)
            self.samples.append((time.time(), {r["task_id"]: r["state"] for r in rows}))
            deferred = [r["task_id"] for r in rows if r["state"] == "deferred"]
            for row in _query(self.db, "SELECT task_id, value FROM xcom WHERE dag_id = ? AND run_id = ? AND "
                                       "key = 'delta_occ_wait'", self.dag_id, self.run_id):
                value = row["value"]
                while isinstance(value, str | bytes):
                    value = json.loads(value)
                if row["task_id"] in deferred:
                    self.waits[row["task_id"]] = value

    def seen(self, task_id: str, state: str) -> list[float]:
        return [t for t, states in self.samples if states.get(task_id) == state]


def _commits_of(table: str, task_id: str) -> list[dict[str, Any]]:
    return [c for c in _commits(table) if c["meta"].get("airflow", {}).get("task_id") == task_id
            or (task_id == "set_properties" and "e2e_set_properties" in c["meta"])]


def _wait_until_held(gate: Path, name: str) -> bool:
    """Whether the commit ``name`` reached the gate (and is held there) within RUN_TIMEOUT."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while not (gate / f"{name}.reached").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _hold_until_update(gate: Path, name: str, table: str, log: dict[str, Any]) -> None:
    """Release the held commit ``name`` once ``update_p1`` has committed."""
    if not _wait_until_held(gate, name):
        return
    log["held"] = time.time()
    until = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < until and not _commits_of(table, "update_p1"):
        time.sleep(0.2)
    log["released"] = time.time()
    (gate / f"{name}.release").touch()


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory,
            postgres_server: PostgresServer) -> Iterator[dict[str, Any]]:  # noqa: F811
    """Connect server, lease store, pool file and ``airflow standalone``; yields how to run a DAG."""
    work = tmp_path_factory.mktemp("pool_e2e")
    lake, gate, home = work / "lake", work / "lake" / "gate", work / "airflow"
    for name in ("pooled", "naive", "kill"):
        _write_table(lake / name)
    gate.mkdir()
    home.mkdir()
    pools = work / "pools.toml"
    # A lease granted in the triggerer runs its TTL while its task waits for one of the four slots: when
    # a release grants five waiters at once on a busy machine, the fifth waited 58 s (a 60 s TTL lapsed).
    pools.write_text(f'[pools.e2e]\ntables = ["{lake}/pooled"]\nlease_ttl = "180s"\nheartbeat = "2s"\n\n'
                     f'[pools.e2e_kill]\ntables = ["{lake}/kill"]\nlease_ttl = "{KILL_TTL:.0f}s"\n'
                     f'heartbeat = "{KILL_HEARTBEAT:.0f}s"\n')
    lease_url = postgres_server.create_database("pool_e2e")
    (work / "spark").mkdir()
    with connect_server(work / "spark", {**delta_submit_conf(), **gate_session_conf(),
                                         "spark.hadoop.occ.armed.dir": str(gate)}) as spark:
        env = airflow_env(
            home, HERE / "dags",
            AIRFLOW__CORE__PARALLELISM="4",
            AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
            AIRFLOW__DELTA_OCC__POOL_FILE=str(pools),
            AIRFLOW__DELTA_OCC__WORKER_WAIT=str(WORKER_WAIT),
            AIRFLOW_CONN_DELTA_OCC_DEFAULT=json.dumps({"conn_type": "delta_occ",
                                                       "extra": {"mode": "connect", "connect_url": spark["url"]}}),
            AIRFLOW_CONN_DELTA_OCC_LEASES=json.dumps({"conn_type": "delta_occ_leases", "extra": {"url": lease_url}}),
            DELTA_OCC_E2E_ROOT=str(lake),
        )
        db = home / "airflow.db"

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*AIRFLOW, *args], env=env, capture_output=True, text=True, timeout=300)

        for args in (("db", "migrate"), ("delta-occ", "pools", "sync")):
            done = cli(*args)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        store = SqlLeaseStore(lease_url)
        with standalone(env, work / "standalone.log") as server:
            deadline = time.monotonic() + 300
            while len(_query(db, "SELECT dag_id FROM serialized_dag WHERE dag_id IN (?, ?, ?)",
                             POOLED, NAIVE, KILL) if db.exists() else []) < 3:
                assert server.poll() is None and time.monotonic() < deadline, f"see {work / 'standalone.log'}"
                time.sleep(1)

            def run(dag_id: str, watch: Any = None) -> dict[str, Any]:
                sampler = Sampler(db, dag_id, "e2e")
                started = time.time()
                trigger = cli("dags", "trigger", dag_id, "-r", "e2e")
                assert trigger.returncode == 0, trigger.stdout[-3000:] + trigger.stderr[-3000:]
                sampler.start()
                watched: dict[str, Any] = {}
                watcher = threading.Thread(target=watch, args=(watched,), daemon=True) if watch else None
                if watcher:
                    watcher.start()
                try:
                    until = time.monotonic() + RUN_TIMEOUT
                    while True:
                        [dag_run] = _query(db, "SELECT state FROM dag_run WHERE dag_id = ? AND run_id = 'e2e'", dag_id)
                        if dag_run["state"] in ("success", "failed"):
                            break
                        assert server.poll() is None, f"Airflow exited; see {work / 'standalone.log'}"
                        assert time.monotonic() < until, f"{dag_id} did not finish; see {work}"
                        time.sleep(1)
                finally:
                    sampler.stopped.set()
                    sampler.join(5)
                    if watcher:
                        watcher.join(30)
                tis = {r["task_id"]: r for r in _query(
                    db, "SELECT task_id, state, try_number, start_date, end_date FROM task_instance "
                        "WHERE dag_id = ? AND run_id = 'e2e'", dag_id)}
                print(f"\n{dag_id}: {dag_run['state']} in {time.time() - started:.0f} s")
                xcoms = {t: _xcom(db, "e2e", t, dag_id) for t in tis}
                (work / f"{dag_id}.json").write_text(json.dumps({"tis": tis, "xcom": xcoms, "watched": watched,
                                                                 "samples": sampler.samples}, default=str))
                return {"state": dag_run["state"], "tis": tis, "sampler": sampler, "watched": watched,
                        "xcom": xcoms, "started": started,
                        "seconds": time.time() - started}

            try:
                yield {"run": run, "lake": lake, "gate": gate, "store": store, "work": work, "db": db, "cli": cli}
            finally:
                store.close()


# -- 1. the pooled run ----------------------------------------------------------------------------
def _audit(store: SqlLeaseStore, pool: str) -> list[AuditEvent]:
    return store.history(pool=pool, limit=100_000)


def _task(owner: str) -> str:
    """The task id of a lease owner ``dag/task/run/map/try``; the sensor's lease is set_properties'."""
    task = owner.split("/")[1]
    return "set_properties" if task == "wait_for_properties_lease" else task


def _windows(events: list[AuditEvent]) -> dict[str, tuple[float, float]]:
    """Each task's lease, from its grant to its release (one lease per task in these runs)."""
    grants = {e.request_id: e for e in events if e.kind is AuditKind.GRANT}
    ends = {e.request_id: e.at for e in events if e.kind in (AuditKind.RELEASE, AuditKind.EXPIRE)}
    windows: dict[str, tuple[float, float]] = {}
    owners: dict[str, str] = {}
    for request_id, grant in grants.items():
        task = _task(grant.owner)
        # The owner names the try: a second grant to a later try means Airflow retried the task.
        assert task not in windows, f"{task} was granted twice: to {owners[task]} and to {grant.owner}"
        windows[task], owners[task] = (grant.at, ends[request_id]), grant.owner
    return windows


def _hold_pooled_merge(gate: Path, store: SqlLeaseStore, log: dict[str, Any]) -> None:
    """Hold ``merge_p1``'s commit (its lease held) for at least HOLD_SECONDS, and until ``update_p1``
    waits behind it and a writer of another partition holds a lease at the same time.

    Waiting for those two is what makes the run deterministic, not what makes it pass: if the pool
    serialized disjoint writers, none would be granted while merge_p1 holds, the hold would end at its
    cap and the overlap assertion would fail.
    """
    disjoint = {w for w in WRITERS if frozenset(("merge_p1", w)) not in CONFLICTING}
    name = f"{POOLED}.merge_p1"
    if not _wait_until_held(gate, name):
        return
    log["held"] = time.time()
    minimum, cap = time.monotonic() + HOLD_SECONDS, time.monotonic() + RUN_TIMEOUT / 3
    alongside: set[str] = set()
    waiting = False
    while time.monotonic() < cap:
        alongside |= {_task(r.owner) for r in store.holders(pool="e2e")} & disjoint
        waiting = waiting or any("/update_p1/" in r.owner for r in store.waiters(pool="e2e"))
        if time.monotonic() >= minimum and waiting and alongside:
            break
        time.sleep(0.2)
    log.update(released=time.time(), alongside=sorted(alongside), update_p1_waited=waiting)
    (gate / f"{name}.release").touch()


@pytest.fixture(scope="module")
def pooled(airflow: dict[str, Any]) -> dict[str, Any]:
    table = str(airflow["lake"] / "pooled")

    def watch(log: dict[str, Any]) -> None:
        _hold_pooled_merge(airflow["gate"], airflow["store"], log)

    result = airflow["run"](POOLED, watch)
    events = _audit(airflow["store"], "e2e")
    return {**result, "table": table, "events": events, "windows": _windows(events)}


def test_pooled_run_no_task_failed_and_delta_raised_no_conflict(pooled: dict[str, Any]) -> None:
    assert pooled["state"] == "success", {t: ti["state"] for t, ti in pooled["tis"].items()}
    assert all(ti["try_number"] == 1 for ti in pooled["tis"].values()), pooled["tis"]
    for task in WRITERS[:-1]:
        result = pooled["xcom"][task]
        assert result["status"] == "success" and result["attempts"] == 1, (task, result)
        assert result["conflicts"] == [], (task, result["conflicts"])
        assert result["lease"]["pool"] == "e2e" and result["lease"]["lost"] is False, (task, result["lease"])


def test_pooled_run_conflicting_writers_never_overlapped(pooled: dict[str, Any]) -> None:
    windows = pooled["windows"]
    assert set(windows) == set(WRITERS), windows
    for pair in CONFLICTING:
        a, b = sorted(pair)
        (a0, a1), (b0, b1) = windows[a], windows[b]
        assert a1 <= b0 or b1 <= a0, f"{a} {windows[a]} and {b} {windows[b]} held leases at the same time"
    # ... and each writer's commit happened while it held its lease.
    history = {c.version: c.commit_info for c in DeltaLog.for_table(pooled["table"]).history()}
    for task in WRITERS:
        [commit] = _commits_of(pooled["table"], task)
        info = history[commit["version"]]
        assert info is not None
        start, end = windows[task]
        assert start - 1 <= info.timestamp / 1000 <= end + 1, (task, start, info.timestamp / 1000, end)


def test_pooled_run_disjoint_writers_overlapped(pooled: dict[str, Any]) -> None:
    windows = pooled["windows"]
    overlapping = sorted(
        (a, b) for a in WRITERS for b in WRITERS
        if a < b and frozenset((a, b)) not in CONFLICTING
        and min(windows[a][1], windows[b][1]) > max(windows[a][0], windows[b][0]))
    print("disjoint writers holding leases at the same time:", overlapping)
    assert overlapping, windows
    # merge_p1 held its lease through the held commit; a disjoint writer ran meanwhile.
    assert any("merge_p1" in pair for pair in overlapping), overlapping


def test_pooled_run_waiting_tasks_waited_where_the_adaptive_rule_says(airflow: dict[str, Any],
                                                                    pooled: dict[str, Any]) -> None:
    sampler: Sampler = pooled["sampler"]
    waited = {t: x["lease"] for t, x in pooled["xcom"].items() if isinstance(x, dict) and "lease" in x
              and x["lease"]["waited_for"]}
    # One of the two writers of partition 1 asked while the other held it (merge_p1's held commit
    # lasts HOLD_SECONDS; whichever asked first holds).
    assert any(any(f"/{other}/" in owner for owner in waited.get(task, {}).get("waited_for", []))
               for task, other in (("update_p1", "merge_p1"), ("merge_p1", "update_p1"))), waited
    events = pooled["events"]
    for task, lease in waited.items():
        log = _task_log(airflow["work"], POOLED, task)
        assert "(waiting: adaptive)" in log, (task, log[-2000:])
        asked = [e for e in events if e.kind is AuditKind.REQUEST and _task(e.owner) == task]
        assert [e.request_id for e in asked] == [lease["request_id"]], (task, asked)   # one request, kept
        if lease["waited"] < WORKER_WAIT + 2:
            continue   # a short wait may end in the worker or just after it deferred
        # A long wait began in the worker, then moved to the triggerer (and may have come back to a
        # worker when its grant looked near, and moved again): every deferral was the rule's choice.
        deferrals = log.count("Pausing task as DEFERRED")
        assert deferrals >= 1 and log.count("waiting deferred from here") == deferrals, (task, log[-3000:])
        assert sampler.seen(task, "deferred"), \
            f"{task} waited {lease['waited']} s for {lease['waited_for']} but was never seen deferred"
        # Issue #24: while it was deferred, its XCom tab said on whom it waited and why.
        shown = sampler.waits.get(task) or {}
        assert shown.get("request_id") == lease["request_id"], (task, sampler.waits)
        assert any(b.get("owner") in lease["waited_for"] and b.get("reason") for b in shown.get("waits_for", [])), \
            (task, shown, lease)
    assert any(lease["waited"] >= WORKER_WAIT + 2 for lease in waited.values()), waited   # not vacuous
    # Nobody was dropped from the line on the way (a waiter that stops polling is abandoned).
    assert not [e for e in events if e.kind in (AuditKind.ABANDON, AuditKind.EXPIRE, AuditKind.CANCEL)
                and _task(e.owner) != "set_properties"], events


def _task_log(work: Path, dag_id: str, task: str) -> str:
    """Every attempt log of ``task`` in the run ``e2e`` (a deferred task logs to its try's file)."""
    folder = work / "airflow" / "logs" / f"dag_id={dag_id}" / "run_id=e2e" / f"task_id={task}"
    return "\n".join(p.read_text(errors="replace") for p in sorted(folder.glob("attempt=*.log")))


def test_pooled_run_left_the_expected_table(pooled: dict[str, Any]) -> None:
    assert _rows(pooled["table"]) == _expected_rows()
    snapshot = DeltaLog.for_table(pooled["table"]).snapshot()
    assert snapshot.metadata.configuration.get("e2e.owner") == "platform"
    # One commit per writer, nothing else: no retried or doubled work.
    ops = [c["operation"] for c in _commits(pooled["table"])][1:]
    assert sorted(ops) == sorted(["MERGE", "UPDATE", "MERGE", "OPTIMIZE", "UPDATE", "DELETE", "WRITE",
                                  "SET TBLPROPERTIES"]), ops


def test_pooled_run_left_no_lease_behind(airflow: dict[str, Any], pooled: dict[str, Any]) -> None:
    assert airflow["store"].records(pool="e2e") == []


# -- 2. the same writers without a pool -----------------------------------------------------------
@pytest.fixture(scope="module")
def naive(airflow: dict[str, Any], pooled: dict[str, Any]) -> dict[str, Any]:
    table = str(airflow["lake"] / "naive")

    def watch(log: dict[str, Any]) -> None:
        _hold_until_update(airflow["gate"], f"{NAIVE}.merge_p1", table, log)

    return {**airflow["run"](NAIVE, watch), "table": table}


def test_without_the_pool_delta_raised_real_conflicts(naive: dict[str, Any]) -> None:
    conflicts = {t: [c["kind"] for c in x.get("conflicts", [])] for t, x in naive["xcom"].items()
                 if isinstance(x, dict)}
    failed = {t: ti["state"] for t, ti in naive["tis"].items() if ti["state"] != "success"}
    print("naive run: conflicts", {t: k for t, k in conflicts.items() if k}, "not successful", failed)
    # merge_p1 read partition 1, update_p1 committed to it while merge_p1's commit was held.
    assert naive["watched"]["released"] > naive["watched"]["held"]
    assert conflicts.get("merge_p1") or naive["tis"]["merge_p1"]["try_number"] > 1, (conflicts, naive["tis"])
    kinds = conflicts.get("merge_p1") or []
    assert any(k in ("ConcurrentAppendException", "ConcurrentDeleteReadException") for k in kinds), kinds


def test_the_check_named_the_pairs_and_the_exception_delta_raised(airflow: dict[str, Any],
                                                                  naive: dict[str, Any]) -> None:
    """Issue #24: ``airflow delta-occ check`` on the naive DAG, in this deployment, against what its run saw.
    Its unprotected pairs are the conflicting pairs of the provider's writers (``set_properties`` is a plain
    task, not the check's), and for the commit order the run had (update_p1 first) it names an exception
    Delta raised on merge_p1."""
    result = airflow["cli"]("delta-occ", "check", NAIVE, "--date", "2024-01-01", "-o", "json")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout)
    within = [p for p in report["conflicts"] if p["a"]["run"] == p["b"]["run"] == "2024-01-01"]  # one run, as here
    pairs = {frozenset((p["a"]["task_id"], p["b"]["task_id"])) for p in within}
    assert pairs == {p for p in CONFLICTING if "set_properties" not in p}
    assert not any(p["protected"] for p in report["conflicts"]) and report["unknown"] == []
    predicted = {o["exception"] for p in within for o in p["outcomes"]
                 if (o["winner"]["task_id"], o["loser"]["task_id"]) == ("update_p1", "merge_p1")}
    raised = {c["kind"] for c in (naive["xcom"].get("merge_p1") or {}).get("conflicts", [])}
    print("check predicted", predicted, "for update_p1 first; Delta raised on merge_p1:", raised)
    assert predicted and predicted <= raised, (predicted, raised)


# -- 3. a killed holder ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def killed(airflow: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
    gate, store, table = airflow["gate"], airflow["store"], str(airflow["lake"] / "kill")
    name = f"{KILL}.held_writer"

    def watch(log: dict[str, Any]) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not ((gate / f"{name}.reached").exists()
                   and any("/next_writer/" in r.owner for r in store.waiters(pool="e2e_kill"))):
            if time.monotonic() > deadline:
                return
            time.sleep(0.2)
        pid = int((gate / f"{name}.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        log["killed"] = time.time()
        # The killed job's commit is still held in the Connect server; let it go once next_writer committed.
        while not _commits_of(table, "next_writer") and time.monotonic() < deadline:
            time.sleep(0.2)
        log["next_committed"] = time.time()
        (gate / f"{name}.release").touch()
        time.sleep(3)  # the late commit's conflict check runs in the server

    result = airflow["run"](KILL, watch)
    return {**result, "table": table, "events": _audit(store, "e2e_kill")}


def test_a_killed_holders_lease_expires_and_the_next_writer_runs(killed: dict[str, Any]) -> None:
    assert killed["tis"]["held_writer"]["state"] == "failed"
    assert killed["tis"]["next_writer"]["state"] == "success", killed["tis"]
    events = killed["events"]
    expired = [e for e in events if e.kind is AuditKind.EXPIRE and "/held_writer/" in e.owner]
    granted = [e for e in events if e.kind is AuditKind.GRANT and "/next_writer/" in e.owner]
    assert expired and granted, [(e.kind, e.owner) for e in events]
    # On the store's clock: the dead holder's lease had the pool file's TTL and was honoured until one TTL after
    # its last heartbeat; the next writer was granted after that, not before.
    dead = [e for e in events if e.request_id == expired[0].request_id]
    request = LeaseRequest.from_json(json.loads(next(e.detail for e in dead if e.kind is AuditKind.REQUEST)))
    last_beat = max(e.at for e in dead if e.kind in (AuditKind.GRANT, AuditKind.RENEW))
    assert request.ttl == KILL_TTL, request.ttl
    assert expired[0].at >= last_beat + KILL_TTL - 1e-3, (last_beat, expired)
    assert granted[0].at >= expired[0].at, (expired, granted)
    delay = granted[0].at - killed["watched"]["killed"]
    # When the resumed task was next seen running (the triggerer's event, the scheduler, a new task process).
    running = [t for t in killed["sampler"].seen("next_writer", "running") if t > granted[0].at]
    resumed = f"{running[0] - killed['watched']['killed']:.1f} s" if running else "not sampled"
    print(f"next writer granted {delay:.2f} s after the kill (TTL {KILL_TTL} s, heartbeat {KILL_HEARTBEAT} s); "
          f"seen running again {resumed} after it")
    # In real time only "nothing hung" (the grant waits for the triggerer's next poll, which a busy machine delays):
    # the default TTL of 10 minutes, or a lease that never expired, would take far longer than this.
    assert 0 < delay <= KILL_TTL + KILL_HEARTBEAT + 60, delay
    assert killed["xcom"]["next_writer"]["lease"]["waited_for"], killed["xcom"]["next_writer"]


def test_the_killed_jobs_late_commit_was_refused(killed: dict[str, Any]) -> None:
    ops = [(c["operation"], c["meta"].get("airflow", {}).get("task_id")) for c in _commits(killed["table"])]
    assert ops[1:] == [("UPDATE", "next_writer")], ops
