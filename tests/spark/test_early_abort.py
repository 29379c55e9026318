"""Early abort on real delta-spark, through the operator: a MERGE of several seconds, and a commit that lands
while it runs.

* In its partition: the MERGE is certain to fail at its commit, so its Spark work is cancelled within two watch
  intervals of the commit, nothing of it is committed, and the retry writes the exact table.
* In another partition: the MERGE commits on its first attempt, never cancelled, and the watch did see the
  commit (so the test is not passing on a watch that never ran).

* An UPDATE (certain to commit only once a row at its read version meets its condition) is stopped the same
  way, the row shown by the log's statistics; one that matches no row (Spark asked) is not watched.
* An OPTIMIZE of p=1 (four small files: its bin packing surely rewrites them all) is stopped when a commit takes
  its files out of the table, and never stopped by a metadata change, which fails its first commit attempt but
  not its retry (delta-spark's OPTIMIZE commits again while its files are all still there).

Every mode is watched: the doomed MERGE runs over Spark Connect (the tier's shared server) and through
spark-submit (the driver watches, reading the log through its Hadoop file system), the doomed UPDATE embedded.
Classic sessions and Connect tag, see and cancel a statement's Spark work differently.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.log_segment import commit_file_name
from airflow_delta_occ.operators.delta import (
    DeltaBaseOperator,
    DeltaMergeOperator,
    DeltaOptimizeOperator,
    DeltaUpdateOperator,
)

from .jobs import context, delta_conn

ROWS = 4_000_000
FILES = 4
INTERVAL = 0.5
WATCH_LOGGER = "airflow_delta_occ.spark.early_abort"
TaskLog = Callable[[], list[tuple[float, str]]]


@pytest.fixture(scope="module")
def big_base(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Partition p=1 with ROWS rows in FILES files (a MERGE touching every file rewrites them all: seconds of
    Spark work), partition p=2 with one row."""
    path = str(tmp_path_factory.mktemp("early_abort") / "base")
    spark.range(0, ROWS, 1, FILES).selectExpr("CAST(id AS INT) AS id", "1 AS p", "0 AS v") \
        .write.format("delta").partitionBy("p").save(path)
    spark.createDataFrame([(-1, 2, 0)], "id INT, p INT, v INT").write.format("delta").mode("append").save(path)
    return path


@pytest.fixture
def table(big_base: str, tmp_path: Any) -> str:
    path = str(tmp_path / "t")
    shutil.copytree(big_base, path)
    return path


def _source(spark: Any, tmp_path: Any) -> str:
    """One row in each file of p=1 (so every file is rewritten) and one new row."""
    path = str(tmp_path / "src")
    ids = [i * (ROWS // FILES) + 7 for i in range(FILES)] + [ROWS + 100]
    spark.createDataFrame([(i, 1, 5) for i in ids], "id INT, p INT, v INT").write.format("delta").save(path)
    return path


@pytest.fixture(params=["connect", "spark-submit"])
def conn_id(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The doomed MERGE's ``delta_conn_id``: a Connect connection to the tier's shared server, or a spark-submit
    connection to its standalone cluster (the watch then runs in the driver). The embedded mode is proven by the
    doomed UPDATE below (the same classic-session watch as a spark-submit driver's), and the embedded MERGE by
    ``make bench-early-abort``."""
    if request.param == "spark-submit":
        return delta_conn("spark-submit", request, monkeypatch)
    url = request.getfixturevalue("connect_server")["url"]
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_EARLY", json.dumps(
        {"conn_type": "delta_occ", "extra": {"mode": "connect", "connect_url": url}}))
    return "delta_occ_early"


def _stamp(_logger: Any, _method: str, event: Any) -> Any:
    event["received"] = time.time()
    return event


@pytest.fixture
def task_log(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], list[tuple[float, str]]]]:
    """What reaches the task log, as (when it arrived, line): the provider's loggers in this process, and the
    hook's lines (a spark-submit driver's output, where its watch logs)."""
    import structlog.testing

    caplog.set_level(logging.INFO, logger="airflow_delta_occ")
    with structlog.testing.capture_logs(processors=[_stamp]) as hook_lines:
        yield lambda: [(float(e["received"]), str(e["event"])) for e in list(hook_lines)] + \
            [(r.created, r.getMessage()) for r in list(caplog.records)]


def _merge(table: str, src: str, conn_id: str | None = None) -> DeltaMergeOperator:
    return DeltaMergeOperator(
        task_id="merge_p1", table=table, source=src, merge_condition="t.id = s.id", partitions={"p": 1},
        **({"delta_conn_id": conn_id} if conn_id else {}),
        clauses=[{"kind": "matched_update", "set": {"v": "s.v"}}, {"kind": "not_matched_insert_all"}],
        conflict_policies={"ConcurrentAppendException": {"initial_delay": 0.0, "jitter": 0.0}},
        early_abort=True, early_abort_interval=INTERVAL)


def _update(table: str, where: str, partition: int) -> DeltaUpdateOperator:
    return DeltaUpdateOperator(
        task_id="update", table=table, set={"v": "v + 1"}, where=where, partitions={"p": partition},
        conflict_policies={"ConcurrentAppendException": {"initial_delay": 0.0, "jitter": 0.0}},
        early_abort=True, early_abort_interval=INTERVAL)


def _race(spark: Any, table: str, job: DeltaBaseOperator, other_partition: int | str, lines: TaskLog
          ) -> tuple[dict[str, Any], int, float]:
    """Run the job in a thread; once its watch judges, commit one row into ``other_partition`` (or run that
    statement) from another session. Returns the job's result, the other commit's version and when its commit
    file was written."""
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["result"] = job.execute(context(job.task_id))
        except BaseException as exc:   # reported by the assertion below
            done["error"] = exc

    merge = threading.Thread(target=run)
    merge.start()
    deadline = time.monotonic() + 120
    while not any("Early abort judges this attempt" in line for _, line in lines()):
        assert merge.is_alive() and time.monotonic() < deadline, f"the watch never judged: {done}"
        time.sleep(0.05)
    statement = other_partition if isinstance(other_partition, str) else \
        f"INSERT INTO delta.`{table}` VALUES (-4242, {other_partition}, 0)"
    spark.newSession().sql(statement).collect()
    version = DeltaLog.for_table(table).latest_version()
    landed = os.path.getmtime(os.path.join(table, "_delta_log", commit_file_name(version)))
    merge.join(300)
    assert "error" not in done, done.get("error")
    return done["result"], version, landed


def _assert_cancelled_in_time(task_log: TaskLog, landed: float) -> None:
    """The first cancel reached the task log within two watch intervals of the commit file's write (plus the
    judge's and the log's own time)."""
    cancels = sorted(at for at, line in task_log() if "Early abort: version" in line)
    assert cancels, "no cancel was logged"
    assert cancels[0] - landed <= 2 * INTERVAL + 0.5, f"cancelled {cancels[0] - landed:.2f} s after the commit landed"


def test_a_merge_doomed_by_a_commit_in_its_partition_is_stopped_early(spark: Any, table: str, tmp_path: Any,
                                                                     task_log: TaskLog, conn_id: str) -> None:
    src = _source(spark, tmp_path)
    before = DeltaLog.for_table(table).latest_version()
    result, other, landed = _race(spark, table, _merge(table, src, conn_id), 1, task_log)

    history = [(c.version, c.commit_info.operation, c.commit_info.read_version)   # type: ignore[union-attr]
               for c in DeltaLog.for_table(table).commits_after(before)]
    assert result["attempts"] == 2 and result["confirmed"], (result["conflicts"], history, before)
    stopped = result["conflicts"][0]
    assert stopped["early"] and stopped["kind"] == "ConcurrentAppendException" and stopped["action"] == "retry"
    assert stopped["winning_version"] == other and stopped["winning_operation"] == "WRITE"
    _assert_cancelled_in_time(task_log, landed)
    # Nothing of the stopped attempt was committed: the log holds the other commit, then one MERGE.
    after = DeltaLog.for_table(table).commits_after(before)
    assert [c.commit_info.operation for c in after] == ["WRITE", "MERGE"]   # type: ignore[union-attr]
    assert result["version"] == other + 1
    # The retry wrote the exact table: every touched row updated once, the new row inserted once, the other
    # commit's row kept.
    got = spark.sql(f"SELECT count(*) AS n, sum(v) AS s, count(DISTINCT id) AS d FROM delta.`{table}`").collect()[0]
    assert (got["n"], got["s"], got["d"]) == (ROWS + 3, 5 * (FILES + 1), ROWS + 3)


def test_a_merge_beside_a_commit_in_another_partition_is_never_stopped(spark: Any, table: str, tmp_path: Any,
                                                                      task_log: TaskLog) -> None:
    src = _source(spark, tmp_path)
    result, other, _ = _race(spark, table, _merge(table, src), 2, task_log)

    assert result["attempts"] == 1 and result["conflicts"] == [] and result["version"] == other + 1
    assert not [line for _, line in task_log() if "Early abort: version" in line]
    watched = [line for _, line in task_log() if line.startswith("Early abort watched")]
    assert watched and "1 commit(s) landed" in watched[0], watched


def test_an_update_doomed_by_a_commit_in_its_partition_is_stopped_early(spark: Any, table: str,
                                                                       task_log: TaskLog) -> None:
    """An UPDATE commits only if a row meets its condition: the watch asks Spark at the pinned version first."""
    before = DeltaLog.for_table(table).latest_version()
    result, other, landed = _race(spark, table, _update(table, "v >= 0", 1), 1, task_log)

    # Every row of p=1 has v = 0 and no NULL (the files' statistics): the log shows a row meets `v >= 0`.
    assert any("Early abort watches this update: a row meets its condition" in line
               and "from the log's statistics" in line for _, line in task_log())
    assert result["attempts"] == 2 and result["confirmed"], result["conflicts"]
    stopped = result["conflicts"][0]
    assert stopped["early"] and stopped["kind"] == "ConcurrentAppendException" and stopped["winning_version"] == other
    _assert_cancelled_in_time(task_log, landed)
    after = DeltaLog.for_table(table).commits_after(before)
    assert [c.commit_info.operation for c in after] == ["WRITE", "UPDATE"]   # type: ignore[union-attr]
    # Every row of p=1 bumped once, the other commit's row (p=1, v=0) included; p=2 untouched.
    got = spark.sql(f"SELECT p, count(*) AS n, sum(v) AS s FROM delta.`{table}` GROUP BY p ORDER BY p").collect()
    assert [tuple(r) for r in got] == [(1, ROWS + 1, ROWS + 1), (2, 1, 0)]


def test_an_update_that_matches_no_row_is_not_watched(table: str, caplog: Any) -> None:
    """No row meets the condition at the pinned version: the UPDATE may commit no file (measured: it commits its
    transaction id alone), which is not the commit the judge knows, so it runs unwatched."""
    caplog.set_level(logging.INFO, logger=WATCH_LOGGER)
    result = _update(table, "v < 0", 2).execute(context("update"))
    assert result["attempts"] == 1 and result["conflicts"] == [] and result["metrics"]["numUpdatedRows"] == "0"
    assert any("Early abort does not watch this update: no row meets its condition" in r.getMessage()
               and "asked of Spark" in r.getMessage() for r in caplog.records)
    assert not any("Early abort judges this attempt" in r.getMessage() for r in caplog.records)


def _optimize(table: str) -> DeltaOptimizeOperator:
    # Retried here (a compaction's default is to skip once its files are gone) so the retry's outcome shows.
    return DeltaOptimizeOperator(
        task_id="optimize_p1", table=table, partitions={"p": 1},
        conflict_policies={"ConcurrentDeleteReadException": {"action": "retry", "initial_delay": 0.0, "jitter": 0.0}},
        early_abort=True, early_abort_interval=INTERVAL)


def test_an_optimize_whose_files_are_deleted_is_stopped_early(spark: Any, table: str, task_log: TaskLog) -> None:
    before = DeltaLog.for_table(table).latest_version()
    result, other, landed = _race(spark, table, _optimize(table), f"DELETE FROM delta.`{table}` WHERE p = 1", task_log)

    assert any("Early abort watches this optimize: it surely rewrites 4 file(s)" in line for _, line in task_log())
    stopped = result["conflicts"][0]
    assert stopped["early"] and stopped["kind"] == "ConcurrentDeleteReadException", result["conflicts"]
    assert stopped["winning_version"] == other and stopped["winning_operation"] == "DELETE"
    assert stopped["action"] == "retry" and result["attempts"] == 2
    _assert_cancelled_in_time(task_log, landed)
    # Nothing of the stopped attempt was committed, and the retry found nothing left to compact in p=1.
    after = DeltaLog.for_table(table).commits_after(before)
    assert [c.commit_info.operation for c in after] == ["DELETE"]   # type: ignore[union-attr]
    got = spark.sql(f"SELECT p, count(*) AS n FROM delta.`{table}` GROUP BY p ORDER BY p").collect()
    assert [tuple(r) for r in got] == [(2, 1)]


def test_an_optimize_is_never_stopped_by_a_change_its_retry_forgives(spark: Any, table: str,
                                                                     task_log: TaskLog) -> None:
    """A table property set while the OPTIMIZE runs fails its first commit attempt (MetadataChangedException),
    and delta-spark's OPTIMIZE then commits again, its files all still there: early abort must let it."""
    before = DeltaLog.for_table(table).latest_version()
    result, other, _ = _race(spark, table, _optimize(table),
                             f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('team' = 'compaction-test')", task_log)

    assert result["attempts"] == 1 and result["conflicts"] == [] and result["version"] == other + 1, result
    assert not [line for _, line in task_log() if "Early abort: version" in line]
    watched = [line for _, line in task_log() if line.startswith("Early abort watched")]
    assert watched and "1 commit(s) landed" in watched[0], watched
    after = DeltaLog.for_table(table).commits_after(before)
    assert [c.commit_info.operation for c in after] == ["SET TBLPROPERTIES", "OPTIMIZE"]   # type: ignore[union-attr]
    assert len(DeltaLog.for_table(table).snapshot().files()) == 2   # p=1 compacted into one file, p=2's one
