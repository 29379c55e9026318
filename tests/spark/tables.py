"""Real Delta tables built by delta-spark, for checking the engine against Spark's own reader.

Each builder runs 25+ commits mixing INSERT, MERGE, UPDATE, DELETE, OPTIMIZE and OPTIMIZE ZORDER,
with a checkpoint layout chosen by the caller:

- ``classic``: single-file Parquet checkpoints every 5 commits;
- ``multipart``: ``spark.databricks.delta.checkpoint.partSize`` small, so checkpoints split into parts;
- ``v2``: ``delta.checkpointPolicy = 'v2'``: UUID-named checkpoints with sidecar files (top-level
  file in JSON or Parquet, ``spark.databricks.delta.checkpointV2.topLevelFileFormat``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote

CheckpointLayout = Literal["classic", "multipart", "v2-json", "v2-parquet"]

COLUMNS = "id BIGINT, amount DECIMAL(10,2), name STRING, ts TIMESTAMP, flag BOOLEAN, date DATE, country STRING"
ODD_COUNTRY = "a b/c=d'e"


@dataclass(frozen=True)
class TableSpec:
    name: str
    partitioned: bool
    deletion_vectors: bool
    checkpoint: CheckpointLayout
    column_mapping: bool = False


@contextmanager
def _session_conf(spark: Any, conf: dict[str, str]) -> Iterator[None]:
    old = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def _rows(start: int, n: int, dates: list[str], countries: list[str | None]) -> str:
    values = []
    for i in range(start, start + n):
        country = countries[i % len(countries)]
        country_sql = "NULL" if country is None else "'" + country.replace("\\", "\\\\").replace("'", "\\'") + "'"
        values.append(
            f"({i}, CAST({i}.25 AS DECIMAL(10,2)), 'name-{i % 7}', TIMESTAMP'2024-03-01 10:00:00' + "
            f"INTERVAL {i} MINUTES, {str(i % 2 == 0).upper()}, DATE'{dates[i % len(dates)]}', {country_sql})"
        )
    return ", ".join(values)


def build_table(spark: Any, path: str, spec: TableSpec) -> list[tuple[int, str]]:
    """Create the table at ``path`` and run the scripted operations; returns (version, operation)."""
    props = {"delta.enableDeletionVectors": str(spec.deletion_vectors).lower(),
             "delta.checkpointInterval": "5"}
    if spec.checkpoint.startswith("v2"):
        props["delta.checkpointPolicy"] = "v2"
    if spec.column_mapping:
        props["delta.columnMapping.mode"] = "name"
    conf: dict[str, str] = {}
    if spec.checkpoint == "multipart":
        conf["spark.databricks.delta.checkpoint.partSize"] = "4"
    if spec.checkpoint.startswith("v2"):
        conf["spark.databricks.delta.checkpointV2.topLevelFileFormat"] = spec.checkpoint.split("-")[1]
    table = f"delta.`{path}`"
    partition_sql = "PARTITIONED BY (date, country)" if spec.partitioned else ""
    prop_sql = ", ".join(f"'{k}' = '{v}'" for k, v in props.items())
    dates = ["2024-01-01", "2024-01-02", "2024-01-03"]
    countries: list[str | None] = ["DE", "FR", None, ODD_COUNTRY]
    with _session_conf(spark, conf):
        spark.sql(f"CREATE TABLE {table} ({COLUMNS}) USING delta {partition_sql} TBLPROPERTIES ({prop_sql})")
        next_id = 0
        for _ in range(8):
            spark.sql(f"INSERT INTO {table} VALUES {_rows(next_id, 12, dates, countries)}")
            next_id += 12
        spark.sql(f"INSERT INTO {table} VALUES {_rows(next_id, 6, ['2024-01-04'], ['DE'])}")
        next_id += 6
        spark.createDataFrame([(i, f"merged-{i}") for i in range(0, 200, 9)], "id BIGINT, name STRING") \
            .createOrReplaceTempView("merge_source")
        spark.sql(f"""MERGE INTO {table} t USING merge_source s
                      ON t.id = s.id AND t.date = DATE'2024-01-01'
                      WHEN MATCHED THEN UPDATE SET t.name = s.name
                      WHEN NOT MATCHED THEN INSERT (id, name, date, country, amount, flag)
                        VALUES (s.id + 1000, s.name, DATE'2024-01-05', 'FR', 1.00, TRUE)""")
        spark.sql(f"UPDATE {table} SET amount = amount + 1 WHERE country = 'DE' AND id < 40")
        spark.sql(f"DELETE FROM {table} WHERE id % 5 = 0 AND date = DATE'2024-01-02'")
        spark.sql(f"OPTIMIZE {table}")
        for _ in range(4):
            spark.sql(f"INSERT INTO {table} VALUES {_rows(next_id, 10, dates, countries)}")
            next_id += 10
        spark.sql(f"OPTIMIZE {table} WHERE date = DATE'2024-01-01'" if spec.partitioned else f"OPTIMIZE {table}")
        spark.sql(f"DELETE FROM {table} WHERE id BETWEEN 20 AND 30")
        spark.sql(f"UPDATE {table} SET flag = NOT flag WHERE name = 'name-3'")
        spark.sql(f"""MERGE INTO {table} t USING merge_source s ON t.id = s.id
                      WHEN MATCHED AND s.id > 100 THEN DELETE
                      WHEN MATCHED THEN UPDATE SET t.amount = 0""")
        for _ in range(3):
            spark.sql(f"INSERT INTO {table} VALUES {_rows(next_id, 8, dates, countries)}")
            next_id += 8
        spark.sql(f"OPTIMIZE {table} ZORDER BY (id)")
        spark.sql(f"DELETE FROM {table} WHERE date = DATE'2024-01-04'")
        spark.sql(f"INSERT INTO {table} VALUES {_rows(next_id, 8, dates, countries)}")
        next_id += 8
        spark.sql(f"UPDATE {table} SET name = 'late' WHERE id > {next_id - 20}")
    history = spark.sql(f"DESCRIBE HISTORY {table}").select("version", "operation").collect()
    return sorted((int(r["version"]), str(r["operation"])) for r in history)


def spark_relative_paths(table_path: str, uris: list[str]) -> set[str]:
    """Spark's ``inputFiles()`` URIs as paths relative to the table root (Hive-escaped form)."""
    root = "file:" + os.path.abspath(table_path).rstrip("/") + "/"
    out = set()
    for uri in uris:
        if uri.startswith("file://"):
            uri = "file:" + uri[len("file://"):]
        assert uri.startswith(root), (uri, root)
        out.add(uri[len(root):])
    return out


def engine_relative_paths(paths: list[str]) -> set[str]:
    """Log paths are URL-encoded; decoding once gives the Hive-escaped form Spark reports."""
    return {unquote(p) for p in paths}


def spark_files(spark: Any, table_path: str, version: int, predicate: str | None = None) -> set[str]:
    """Files Spark's scan reads at ``version`` for ``predicate``, after partition pruning and data skipping."""
    df = spark.read.format("delta").option("versionAsOf", version).load(table_path)
    if predicate is not None:
        df = df.where(predicate)
    return spark_relative_paths(table_path, df.inputFiles())
