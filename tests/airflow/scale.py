"""The backfill scenario of ``celery_dags/delta_occ_scale.py``, shared by the Celery e2e test and
``make bench-scale``: its tables, its Airflow settings, and what its parts recorded (the Delta log,
the lease store's audit), read back as typed facts.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.pools.requests import AuditEvent, AuditKind

HERE = Path(__file__).resolve().parent
DAGS = HERE / "celery_dags"
DATED, FLAT = "delta_occ_scale_dated", "delta_occ_scale_flat"
POOL = "scale"


def write_table(path: Path, columns: list[tuple[str, str]], partitions: list[str]) -> None:
    """An empty Delta table (one commit: protocol and metadata) at ``path``."""
    (path / "_delta_log").mkdir(parents=True)
    now = int(time.time() * 1000)
    schema = {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}}
                                           for n, t in columns]}
    actions = [
        {"commitInfo": {"timestamp": now, "operation": "CREATE TABLE"}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": {"id": f"scale-{path.name}", "format": {"provider": "parquet", "options": {}},
                      "schemaString": json.dumps(schema), "partitionColumns": partitions, "configuration": {},
                      "createdTime": now}},
    ]
    (path / "_delta_log" / f"{0:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def write_tables(root: Path) -> None:
    write_table(root / "dated", [("id", "long"), ("day", "date"), ("v", "string")], ["day"])
    write_table(root / "flat", [("id", "long"), ("v", "string")], [])
    (root / "gate").mkdir()


def pool_file(root: Path, path: Path, *, ttl: float, heartbeat: float) -> Path:
    path.write_text(f'[pools.{POOL}]\ntables = ["{root}/dated", "{root}/flat"]\n'
                    f'lease_ttl = "{ttl:g}s"\nheartbeat = "{heartbeat:g}s"\n')
    return path


def airflow_settings(root: Path, pools: Path, *, spark_url: str, lease_url: str, days: int, writers: int,
                     hold: str = "") -> dict[str, str]:
    """Airflow environment every host gets: the pool file, the connections, the scenario's size, and
    failure detection quick enough for a test (a dead task is noticed in 20 s, a dead scheduler or
    triggerer in 15 s)."""
    return {
        "AIRFLOW__DELTA_OCC__POOL_FILE": str(pools),
        "AIRFLOW_CONN_DELTA_OCC_DEFAULT": json.dumps({"conn_type": "delta_occ",
                                                      "extra": {"mode": "connect", "connect_url": spark_url}}),
        "AIRFLOW_CONN_DELTA_OCC_LEASES": json.dumps({"conn_type": "delta_occ_leases", "extra": {"url": lease_url}}),
        "AIRFLOW__CORE__PARALLELISM": "64",
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "1024",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "15",
        "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "15",
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
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


@dataclass(frozen=True)
class LeaseSpan:
    """One request's lease: who held it, for which table, from its grant to its release or expiry."""

    owner: str
    table: str
    granted: float
    ended: float
    how: AuditKind
    requested: float


def lease_spans(events: list[AuditEvent]) -> list[LeaseSpan]:
    requested = {e.request_id: e.at for e in events if e.kind is AuditKind.REQUEST}
    ends = {e.request_id: e for e in events if e.kind in (AuditKind.RELEASE, AuditKind.EXPIRE)}
    spans = []
    for e in events:
        if e.kind is AuditKind.GRANT:
            end = ends.get(e.request_id)
            spans.append(LeaseSpan(e.owner, e.table, e.at, end.at if end else float("inf"),
                                   end.kind if end else AuditKind.GRANT, requested.get(e.request_id, e.at)))
    return sorted(spans, key=lambda s: s.granted)


def overlapping(spans: list[LeaseSpan]) -> list[tuple[LeaseSpan, LeaseSpan]]:
    """Pairs of spans held at the same time."""
    return [(a, b) for i, a in enumerate(spans) for b in spans[i + 1:]
            if min(a.ended, b.ended) > max(a.granted, b.granted)]


def owner_key(owner: str) -> tuple[str, int]:
    """(dag_id, map_index) of a lease owner ``dag/task/run/map/try``."""
    dag_id, _task, _run, map_index, _try = owner.split("/")
    return dag_id, int(map_index)
