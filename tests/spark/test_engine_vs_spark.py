"""The engine against real delta-spark on tables delta-spark wrote.

At every version the engine's live file set equals the files Spark's reader scans, and for each
predicate the engine's file set contains every file Spark reads after partition pruning and data
skipping (and equals it when the predicate constrains only partition columns).
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.expressions import is_partition_only

from .conftest import TABLE_SPECS
from .tables import TableSpec, engine_relative_paths, spark_files

NAMES = [s.name for s in TABLE_SPECS]

PREDICATES = [
    "date = '2024-01-01'",
    "country = 'DE'",
    "country IS NULL",
    "country = 'a b/c=d\\'e'",
    "date IN ('2024-01-02', '2024-01-03') AND country <> 'FR'",
    "NOT (date = DATE'2024-01-01') OR country IS NULL",
    "date BETWEEN '2024-01-02' AND '2024-01-05'",
    "country NOT IN ('DE', 'FR')",
    "id = 100",
    "id > 150 AND date = '2024-01-03'",
    "id < 10 OR name = 'late'",
    "amount >= 50.25",
    "ts > TIMESTAMP'2024-03-01 12:00:00'",
    "name IS NULL",
    "flag = true AND id BETWEEN 30 AND 60",
    "id IN (3, 77, 1009) OR country = 'FR'",
    "upper(name) = 'LATE'",
    "rand() < 0.5",
    "rand() < 0.5 AND country = 'DE'",
    "upper(name) = 'LATE' AND date = '2024-01-01'",
    "(upper(name) = 'LATE' OR id = 1) AND date IN ('2024-01-02', '2024-01-03')",
]


def _table(built_tables: dict[str, tuple[str, TableSpec]], name: str) -> tuple[str, TableSpec]:
    return built_tables[name]


@pytest.mark.parametrize("name", NAMES)
def test_active_files_equal_sparks_at_every_version(spark: Any, built_tables: Any, name: str) -> None:
    path, _ = _table(built_tables, name)
    log = DeltaLog.for_table(path)
    latest = log.latest_version()
    assert latest >= 25
    for version in range(latest + 1):
        snapshot = log.snapshot(version)
        assert snapshot.version == version
        assert engine_relative_paths(snapshot.file_paths()) == spark_files(spark, path, version), version


@pytest.mark.parametrize("name", NAMES)
def test_tables_really_cover_the_layouts(built_tables: Any, name: str) -> None:
    """Guard against a builder silently producing an easier log than the test claims."""
    path, spec = _table(built_tables, name)
    names = os.listdir(os.path.join(path, "_delta_log"))
    pattern = {
        "classic": r"^\d{20}\.checkpoint\.parquet$",
        "multipart": r"^\d{20}\.checkpoint\.\d{10}\.\d{10}\.parquet$",
        "v2-json": r"^\d{20}\.checkpoint\.[0-9a-f-]{36}\.json$",
        "v2-parquet": r"^\d{20}\.checkpoint\.[0-9a-f-]{36}\.parquet$",
    }[spec.checkpoint]
    assert any(re.match(pattern, n) for n in names), names
    if spec.checkpoint.startswith("v2"):
        assert os.listdir(os.path.join(path, "_delta_log", "_sidecars"))
    snapshot = DeltaLog.for_table(path).snapshot()
    operations = {c.commit_info.operation for c in DeltaLog.for_table(path).history() if c.commit_info}
    assert {"WRITE", "MERGE", "UPDATE", "DELETE", "OPTIMIZE"} <= operations
    zorder = [c for c in DeltaLog.for_table(path).history()
              if c.commit_info and c.commit_info.operation == "OPTIMIZE"
              and c.commit_info.operation_parameters.get("zOrderBy") not in (None, "[]")]
    assert zorder, "no OPTIMIZE ZORDER BY commit"
    assert snapshot.deletion_vectors_enabled is spec.deletion_vectors
    if spec.deletion_vectors:
        assert "deletionVectors" in snapshot.reader_features
        history_dvs = [a for c in DeltaLog.for_table(path).history() for a in c.actions
                       if getattr(a, "deletion_vector", None) is not None]
        assert history_dvs, "DV table without any deletion vector in its log"
    if spec.column_mapping:
        assert "columnMapping" in snapshot.reader_features
        assert any(f.physical_name != f.name for f in snapshot.schema)
    assert snapshot.partition_columns == (("date", "country") if spec.partitioned else ())


@pytest.mark.parametrize("predicate", PREDICATES)
@pytest.mark.parametrize("name", NAMES)
def test_files_matching_covers_sparks_scan(spark: Any, built_tables: Any, name: str, predicate: str) -> None:
    path, spec = _table(built_tables, name)
    log = DeltaLog.for_table(path)
    latest = log.latest_version()
    for version in (latest, latest - 9):
        snapshot = log.snapshot(version)
        ours = engine_relative_paths([f.path for f in snapshot.files_matching(predicate)])
        theirs = spark_files(spark, path, version, predicate)
        missing = theirs - ours
        assert not missing, f"engine misses files Spark reads for {predicate!r} at v{version}: {missing}"
        bound = snapshot.bind(predicate)
        if spec.partitioned and is_partition_only(bound, snapshot.partition_columns):
            assert ours == theirs, f"partition predicate {predicate!r} at v{version}: extra {ours - theirs}"


@pytest.mark.parametrize("name", NAMES)
def test_metadata_history_and_changes_match_spark(spark: Any, built_tables: Any, name: str) -> None:
    path, _ = _table(built_tables, name)
    log = DeltaLog.for_table(path)
    snapshot = log.snapshot()
    df = spark.read.format("delta").load(path)
    assert [f.name for f in snapshot.schema] == df.schema.names
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0]
    assert snapshot.metadata.id == detail["id"]
    assert list(snapshot.partition_columns) == list(detail["partitionColumns"])
    assert snapshot.num_files == detail["numFiles"]
    assert snapshot.protocol.min_reader_version == detail["minReaderVersion"]
    assert snapshot.protocol.min_writer_version == detail["minWriterVersion"]
    assert snapshot.reader_features == frozenset(detail["tableFeatures"]) & snapshot.reader_features
    spark_history = {
        int(r["version"]): (r["operation"], r["readVersion"], r["isolationLevel"], r["isBlindAppend"])
        for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    }
    ours = {c.version: (c.commit_info.operation, c.commit_info.read_version, c.commit_info.isolation_level,
                        c.commit_info.is_blind_append) for c in log.history() if c.commit_info}
    assert ours == spark_history
    middle = snapshot.version - 7
    commits = log.commits_after(middle)
    assert [c.version for c in commits] == list(range(middle + 1, snapshot.version + 1))
    assert [c.commit_info.operation for c in commits] == [spark_history[c.version][0] for c in commits]


@pytest.mark.parametrize("name", NAMES)
def test_update_from_each_older_version_matches_full_load(spark: Any, built_tables: Any, name: str,
                                                          tmp_path: Any) -> None:
    path, _ = _table(built_tables, name)
    copy = str(tmp_path / "copy")
    shutil.copytree(path, copy)
    log = DeltaLog.for_table(copy)
    old = [log.snapshot(v) for v in (3, 12, 20)]
    spark.sql(f"INSERT INTO delta.`{copy}` SELECT * FROM delta.`{copy}` LIMIT 3")
    spark.sql(f"DELETE FROM delta.`{copy}` WHERE id < 50")
    latest = log.snapshot()
    expected = spark_files(spark, copy, latest.version)
    for snapshot in old:
        updated = snapshot.update()
        assert updated.version == latest.version
        assert engine_relative_paths(updated.file_paths()) == expected
