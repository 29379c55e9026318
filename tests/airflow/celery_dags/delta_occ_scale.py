"""Backfills through one conflict pool on a Celery deployment (``tests/deployment.py``): the Celery e2e
test runs them with a few dozen tasks, ``make bench-scale`` with a thousand.

* ``delta_occ_scale_dated``: one ``DeltaOverwritePartitionsOperator`` mapped over DAYS dates, each
  replacing its own ``day`` partition of ``ROOT/dated`` with three rows. No two conflict: the pool
  must let them all run side by side.
* ``delta_occ_scale_flat``: WRITERS MERGEs mapped over one unpartitioned table ``ROOT/flat``, each
  inserting its own row. Every MERGE reads the whole table, so every pair conflicts: the pool runs
  them one at a time while the others wait (deferred, in the triggerers).

A writer named in ``DELTA_OCC_SCALE_HOLD`` (``flat:3``: map index 3 of the flat DAG; ``flat:first``: the
first MERGE to reach Spark, so every other one waits behind it) arms the test
LogStore's gate as its first try hands its job to Spark, with that try's identity and its process id, so
the test can hold its commit and kill what runs it; ``held.index`` names it (the Connect server's
``occ.armed.dir`` is ``ROOT/gate``).

Environment: ``DELTA_OCC_SCALE_ROOT``, ``DELTA_OCC_SCALE_DAYS``, ``DELTA_OCC_SCALE_WRITERS``,
``DELTA_OCC_SCALE_HOLD``; Spark comes from the ``delta_occ_default`` connection.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from airflow.sdk import DAG

from airflow_delta_occ.operators.delta import DeltaMergeOperator, DeltaOverwritePartitionsOperator

ROOT = Path(os.environ.get("DELTA_OCC_SCALE_ROOT", os.path.join(tempfile.gettempdir(), "delta-occ-scale")))
DAYS = int(os.environ.get("DELTA_OCC_SCALE_DAYS", "24"))
WRITERS = int(os.environ.get("DELTA_OCC_SCALE_WRITERS", "8"))
HOLD = os.environ.get("DELTA_OCC_SCALE_HOLD", "")
POOL = "scale"
FIRST_DAY = dt.date(2021, 1, 1)
ROWS_PER_DAY = 3
DEFAULTS = {"retry_delay": dt.timedelta(seconds=2)}


def day(index: int) -> str:
    return (FIRST_DAY + dt.timedelta(days=index)).isoformat()


class Holdable:
    """Arms the gate for the writer ``DELTA_OCC_SCALE_HOLD`` names (see the module docstring), in the
    process that hands the job to Spark: after a deferral that is the resumed task's, not the first one's."""

    def _run_in_spark(self, prepared: Any) -> Any:
        run = prepared.spec.run
        dag = run.dag_id.rsplit("_", 1)[-1]
        if HOLD in (f"{dag}:{run.map_index}", f"{dag}:first") and run.try_number == 1 and self._claim(run.map_index):
            gate = ROOT / "gate"
            (gate / "held.pid").write_text(str(os.getpid()))
            (gate / "held.arm").write_text(json.dumps(run.user_metadata())[1:-1])
        return super()._run_in_spark(prepared)  # type: ignore[misc]

    @staticmethod
    def _claim(map_index: int) -> bool:
        """Whether this writer is the one held: the first to create ``held.index`` (one writer only)."""
        try:
            fd = os.open(ROOT / "gate" / "held.index", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as out:
            out.write(str(map_index))
        return True


class HoldableOverwrite(Holdable, DeltaOverwritePartitionsOperator):
    pass


class HoldableMerge(Holdable, DeltaMergeOperator):
    pass


with DAG(dag_id="delta_occ_scale_dated", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False,
         max_active_tasks=64, default_args=DEFAULTS, tags=["delta", "test"], doc_md=__doc__):
    HoldableOverwrite.partial(task_id="write_day", table=str(ROOT / "dated"), conflict_pool=POOL).expand_kwargs(
        [{"partitions": {"day": day(i)},
          "source_query": f"SELECT CAST({i * 10} + id AS BIGINT) AS id, DATE'{day(i)}' AS day, 'd{i}' AS v "
                          f"FROM range({ROWS_PER_DAY})"} for i in range(DAYS)])

with DAG(dag_id="delta_occ_scale_flat", schedule=None, start_date=dt.datetime(2024, 1, 1), catchup=False,
         max_active_tasks=WRITERS, default_args=DEFAULTS, tags=["delta", "test"], doc_md=__doc__):
    HoldableMerge.partial(task_id="merge_one", table=str(ROOT / "flat"), conflict_pool=POOL,
                          merge_condition="t.id = s.id").expand(
        source_query=[f"SELECT CAST({j} AS BIGINT) AS id, 'w{j}' AS v" for j in range(WRITERS)])
