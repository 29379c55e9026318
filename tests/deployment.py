"""An Airflow deployment the way platform teams run one, on 127.0.0.1: the CeleryExecutor with a Redis
broker, metadata on PostgreSQL, two "hosts" each with a scheduler, a triggerer and a Celery worker of
its own, and one DAG processor and API server. Used by the Celery e2e test and ``make bench-scale``.

Each host has its own AIRFLOW_HOME (config, log folder, log-server ports), as two machines would; what
they share is what machines share: the metadata database, the broker, the API server's URL and the
secrets every component must agree on (the JWT secret the API server checks task tokens with, the
Fernet key). Every process runs in its own process group, so ``kill(host, role)`` takes a component
down with the task processes it started (SIGKILL: a host losing that component, no clean-up), and
``stop()`` ends everything. Logs: ``work/logs/<host>-<role>.log``.

Nothing here is a mock: the DAG processor parses the DAG files, the schedulers queue tasks through
Redis, the workers run them (and the Delta jobs on the Spark the environment names), the triggerers
run deferred waits.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_delta_occ.demo.airflow_run import stop_process_group
from airflow_delta_occ.ports import free_port, free_ports

from .pg import PostgresServer
from .servers import airflow_api_answers

#: Processes of host "a" (the first): every component; the other hosts run a scheduler, a triggerer and a worker.
FIRST_HOST_ROLES = ("api-server", "dag-processor", "scheduler", "triggerer", "worker")
OTHER_HOST_ROLES = ("scheduler", "triggerer", "worker")
REDIS_HINT = "install it with `apt-get update && apt-get install -y redis-server` (Debian/Ubuntu)"
STARTUP_SECONDS = 240.0


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError(f"redis-server (the Celery broker) not found on PATH: {REDIS_HINT}")
    return found


def parent_of(pid: int) -> int:
    """The parent process id, from ``/proc/PID/stat`` (the field after the state)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def descendants(pid: int) -> list[int]:
    """Every living process started by ``pid``, its children's children included."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError):
                children.setdefault(parent_of(int(entry.name)), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@dataclass
class Host:
    """One stand-in machine: its name, AIRFLOW_HOME and environment, and its running processes by role."""

    name: str
    home: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)


class CeleryDeployment:
    """Start with ``with CeleryDeployment(...) as deployment:``; see the module docstring.

    ``settings`` are Airflow environment variables every host gets (``AIRFLOW__DELTA_OCC__POOL_FILE``,
    connections, ...). ``worker_concurrency`` is each Celery worker's number of task slots.
    """

    def __init__(self, work: Path, postgres: PostgresServer, dags_folder: Path, *, settings: Mapping[str, str],
                 hosts: int = 2, worker_concurrency: int = 4, database: str = "airflow") -> None:
        self.work, self.postgres, self.dags_folder = work, postgres, dags_folder
        self.settings, self.worker_concurrency = dict(settings), worker_concurrency
        self.host_count, self.database = hosts, database
        self.logs = work / "logs"
        self.hosts: list[Host] = []
        self.redis: subprocess.Popen[bytes] | None = None
        self.api_port = 0

    # -- lifecycle -------------------------------------------------------------------------------------
    def __enter__(self) -> CeleryDeployment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        broker_port = free_port()
        self.redis = subprocess.Popen(
            [redis_server_binary(), "--port", str(broker_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "no"],
            stdout=open(self.logs / "redis.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
        metadata_url = self.postgres.create_database(self.database)
        self.metadata_dsn = dict(host="127.0.0.1", port=self.postgres.port, user="delta_occ", dbname=self.database)
        # Every port of the deployment picked together (picked one by one, two could be one port).
        ports = iter(free_ports(1 + 3 * self.host_count))
        self.api_port = next(ports)
        shared = {
            **self.settings,
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
            "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:{broker_port}/0",
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + metadata_url,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.worker_concurrency),
            "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
            # What every component must agree on, as a platform sets it once for all its machines.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.api_port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        for index in range(self.host_count):
            name = chr(ord("a") + index)
            home = self.work / f"host-{name}"
            home.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, **shared, "AIRFLOW_HOME": str(home),
                   "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(next(ports)),
                   "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(next(ports)),
                   "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(next(ports))}
            self.hosts.append(Host(name, home, env))
        self.cli("db", "migrate", timeout=600)
        for host in self.hosts:
            for role in FIRST_HOST_ROLES if host is self.hosts[0] else OTHER_HOST_ROLES:
                self.spawn(host, role)

    def spawn(self, host: Host, role: str) -> subprocess.Popen[bytes]:
        """Start ``role`` on ``host`` (again, after a kill) in its own process group."""
        args = {"worker": ["celery", "worker", "--celery-hostname", f"worker-{host.name}@%h",
                           "--concurrency", str(self.worker_concurrency)],
                "api-server": ["api-server", "--port", str(self.api_port)]}.get(role, [role])
        log = open(self.logs / f"{host.name}-{role}.log", "a")
        process = subprocess.Popen([sys.executable, "-m", "airflow", *args], env=host.env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True, cwd=host.home)
        host.processes[role] = process
        host.killed.discard(role)
        return process

    def stop(self) -> None:
        """Workers first (their tasks still reach the API server), then everything else, Redis last."""
        order = ("worker", "triggerer", "scheduler", "dag-processor", "api-server")
        try:
            for role in order:
                for host in self.hosts:
                    process = host.processes.get(role)
                    if process is None or process.poll() is not None:
                        continue   # killed and not started again: its pid may belong to someone else now
                    left = descendants(process.pid)   # task processes may run in process groups of their own
                    stop_process_group(process)
                    for pid in left:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
        finally:
            if self.redis is not None:
                stop_process_group(self.redis)
                self.redis = None

    def kill(self, host: str, role: str) -> int:
        """SIGKILL ``role`` on ``host`` with every process it started, its task processes included even in a
        process group of their own (a host losing that component: no clean-up anywhere); returns the
        number of processes killed."""
        process = self.host(host).processes[role]
        self.host(host).killed.add(role)   # first: check_alive in another thread must not call it a crash
        doomed = [process.pid, *descendants(process.pid)]   # listed first: the dead's children are re-parented
        os.killpg(process.pid, signal.SIGKILL)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(30)
        return len(doomed)

    def host_running(self, pid: int, role: str = "worker") -> Host:
        """The host whose ``role`` process started process ``pid`` (a task process under a Celery worker:
        its parent chain leads to the worker; the task may sit in a process group of its own)."""
        roots = {h.processes[role].pid: h for h in self.hosts if role in h.processes}
        current = pid
        while current > 1:
            if current in roots:
                return roots[current]
            current = parent_of(current)
        raise LookupError(f"process {pid} was not started by any host's {role}")

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def check_alive(self) -> None:
        """RuntimeError naming the log of any component that exited without being killed by the test."""
        for host in self.hosts:
            for role, process in host.processes.items():
                if role not in host.killed and process.poll() is not None:
                    raise RuntimeError(f"{role} on host {host.name} exited with {process.returncode}; "
                                       f"see {self.logs / f'{host.name}-{role}.log'}")
        if self.redis is not None and self.redis.poll() is not None:
            raise RuntimeError(f"redis-server exited; see {self.logs / 'redis.log'}")

    # -- using it --------------------------------------------------------------------------------------
    def cli(self, *args: str, host: str = "a", timeout: float = 300.0) -> str:
        """``airflow ARGS`` on ``host``; its stdout. RuntimeError with the output if it fails."""
        done = subprocess.run([sys.executable, "-m", "airflow", *args], env=self.host(host).env,
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode:
            raise RuntimeError(f"airflow {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout

    def query(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        """Rows of the metadata database (PostgreSQL; ``%s`` placeholders); a fresh connection each call,
        so a restarted server costs nothing but a retry."""
        import psycopg2
        import psycopg2.extras

        for attempt in range(30):
            try:
                conn = psycopg2.connect(**self.metadata_dsn, connect_timeout=5)
            except psycopg2.OperationalError:
                if attempt == 29:
                    raise
                time.sleep(1)
                continue
            try:
                conn.autocommit = True
                with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
                    cur.execute(sql, params)
                    return [dict(r) for r in cur.fetchall()]
            finally:
                conn.close()
        return []

    def wait_for_dags(self, *dag_ids: str, timeout: float = STARTUP_SECONDS) -> None:
        """Until the DAG processor has serialized ``dag_ids``, a scheduler and a triggerer per host are
        running (their jobs heartbeat) and the API server answers (a task process that finds no API
        server fails its try)."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            found = {r["dag_id"] for r in self.query("SELECT dag_id FROM serialized_dag WHERE dag_id = ANY(%s)",
                                                      list(dag_ids))}
            jobs = self.query("SELECT job_type, count(*) AS n FROM job WHERE state = 'running' GROUP BY job_type")
            running = {j["job_type"]: j["n"] for j in jobs}
            if (found == set(dag_ids) and running.get("SchedulerJob", 0) >= self.host_count
                    and running.get("TriggererJob", 0) >= self.host_count and airflow_api_answers(self.api_port)):
                return
            if time.monotonic() > deadline:
                errors = self.query("SELECT filename, stacktrace FROM import_error")
                raise RuntimeError(f"DAGs {sorted(set(dag_ids) - found)} or jobs {running} not up in {timeout:.0f} s; "
                                   f"import errors: {errors}; see {self.logs}")
            time.sleep(1)

    def trigger(self, dag_id: str, run_id: str) -> float:
        """Trigger a manual run; returns the wall time just before the command ran."""
        started = time.time()
        self.cli("dags", "trigger", dag_id, "-r", run_id)
        return started

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        rows = self.query("SELECT state FROM dag_run WHERE dag_id = %s AND run_id = %s", dag_id, run_id)
        return rows[0]["state"] if rows else None

    def wait_for_run(self, dag_id: str, run_id: str, *, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (state := self.run_state(dag_id, run_id)) not in ("success", "failed"):
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{dag_id} run {run_id} did not finish in {timeout:.0f} s (state {state}); "
                                   f"see {self.logs}")
            time.sleep(1)
        return str(state)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return self.query(
            "SELECT task_id, map_index, state, try_number, hostname, start_date, end_date, queued_dttm "
            "FROM task_instance WHERE dag_id = %s AND run_id = %s ORDER BY task_id, map_index", dag_id, run_id)

    def xcoms(self, dag_id: str, run_id: str) -> dict[tuple[str, int], Any]:
        """Every ``return_value`` XCom of the run, decoded, by (task_id, map_index)."""
        rows = self.query("SELECT task_id, map_index, value FROM xcom WHERE dag_id = %s AND run_id = %s "
                          "AND key = 'return_value'", dag_id, run_id)
        out: dict[tuple[str, int], Any] = {}
        for row in rows:
            value = row["value"]
            while isinstance(value, str | bytes):
                value = json.loads(value)
            out[(row["task_id"], row["map_index"])] = value
        return out

    def task_logs(self, dag_id: str, run_id: str, task_id: str) -> str:
        """Every attempt log of ``task_id`` in the run, from every host's log folder."""
        parts = []
        for host in self.hosts:
            folder = host.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
            parts += [p.read_text(errors="replace") for p in sorted(folder.rglob("attempt=*.log"))]
        return "\n".join(parts)
