"""Commits written by the engine are read by delta-spark, which commits on top of them; and the
engine's verdict on a concurrent table creation matches delta-spark's."""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_delta_occ.engine import DeltaLog, ProtocolChangedException, Transaction, check_winning_commit
from airflow_delta_occ.engine.actions import AddFile, parse_json_actions
from airflow_delta_occ.engine.conflicts import WinningCommit

from .differential.harness import run_interleaved
from .tables import engine_relative_paths, spark_files


def _parquet_file(table: str, partition_dir: str, ids: list[int]) -> AddFile:
    """Write a Parquet data file with pyarrow and describe it as Delta's add action would."""
    os.makedirs(os.path.join(table, partition_dir), exist_ok=True)
    rel = f"{partition_dir}/part-engine-{uuid.uuid4()}.parquet"
    data = pa.table({"id": pa.array(ids, pa.int32()), "v": pa.array([0] * len(ids), pa.int32())})
    pq.write_table(data, os.path.join(table, rel))
    stats = {"numRecords": len(ids), "minValues": {"id": min(ids), "v": 0}, "maxValues": {"id": max(ids), "v": 0},
             "nullCount": {"id": 0, "v": 0}}
    return AddFile(path=rel, partition_values={"p": partition_dir.split("=", 1)[1]},
                   size=os.path.getsize(os.path.join(table, rel)), modification_time=int(time.time() * 1000),
                   data_change=True, stats=json.dumps(stats))


def test_spark_reads_and_builds_on_engine_commits(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{path}` (id INT, p INT, v INT) USING delta PARTITIONED BY (p)")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES (1, 1, 0), (2, 2, 0)")

    meta = Transaction.start(path, operation="SET TBLPROPERTIES")
    meta.set_table_properties({"delta.isolationLevel": "WriteSerializable", "team": "ingest"})
    assert meta.commit().version == 2
    props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()}
    assert props["delta.isolationLevel"] == "WriteSerializable" and props["team"] == "ingest"

    append = Transaction.start(path, operation="WRITE")
    append.add_files([_parquet_file(path, "p=3", [30, 31, 32])])
    result = append.commit()
    assert (result.version, result.is_blind_append) == (3, True)
    rows = sorted(tuple(r) for r in spark.sql(f"SELECT id, p, v FROM delta.`{path}`").collect())
    assert rows == [(1, 1, 0), (2, 2, 0), (30, 3, 0), (31, 3, 0), (32, 3, 0)]
    assert spark.sql(f"SELECT count(*) FROM delta.`{path}` WHERE p = 3 AND id > 30").collect()[0][0] == 2

    spark.sql(f"UPDATE delta.`{path}` SET v = 9 WHERE p = 3 AND id = 31")
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    assert [h["operation"] for h in history][-3:] == ["SET TBLPROPERTIES", "WRITE", "UPDATE"]
    assert history[-1]["isolationLevel"] == "WriteSerializable"
    snapshot = DeltaLog.for_table(path).snapshot()
    assert snapshot.version == 4
    assert engine_relative_paths(snapshot.file_paths()) == spark_files(spark, path, 4, None)


def test_concurrent_first_write_to_an_empty_path_matches_delta_spark(spark: Any, tmp_path: Any) -> None:
    path = str(tmp_path / "new")

    def first_write(session: Any) -> None:
        df = session.createDataFrame([(1, 1)], "id INT, p INT")
        df.write.format("delta").mode("append").partitionBy("p").save(path)

    result = run_interleaved(spark, first_write, first_write)
    assert result.b_outcome is None and result.a_staged is not None
    assert result.a_outcome == "ProtocolChangedException", result.a_error

    body = "\n".join(json.dumps(x) for x in result.a_staged if "commitInfo" not in x).encode()
    log = DeltaLog.for_table(path)
    txn = Transaction(log, None, operation="WRITE")
    txn.stage(*parse_json_actions(body, "<staged by A>"))
    pending, level = txn.prepare()
    winner = WinningCommit.of(log.commits_after(-1)[0])
    try:
        check_winning_commit(pending, winner, level)
    except ProtocolChangedException as exc:
        assert "same path" in str(exc)
    else:
        raise AssertionError("the engine let a second CREATE TABLE commit")
