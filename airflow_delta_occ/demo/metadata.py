"""Reading what a running Airflow recorded in its SQLite metadata database (the demo, tests, benchmarks).

Read-only connections, retried while the scheduler holds a write lock, so a reader never blocks or
breaks the installation it watches.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any


def query(db: Path, sql: str, *params: Any) -> list[dict[str, Any]]:
    """Rows of the metadata database (read-only; retried while the scheduler holds a write lock)."""
    for attempt in range(20):
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as con:
                con.row_factory = sqlite3.Row
                return [dict(r) for r in con.execute(sql, params)]
        except sqlite3.OperationalError:
            if attempt == 19:
                raise
            time.sleep(0.5)
    return []


def xcom(db: Path, dag_id: str, run_id: str, task_id: str) -> Any:
    """A task's return value (its ``return_value`` XCom), decoded; None when it pushed none."""
    rows = query(db, "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = ? AND key = "
                     "'return_value'", dag_id, run_id, task_id)
    if not rows:
        return None
    value = rows[0]["value"]
    while isinstance(value, str | bytes):
        value = json.loads(value)
    return value
