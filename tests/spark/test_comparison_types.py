"""A comparison of a column with a literal of another type: the engine reads the files Spark reads.

Spark (ANSI on, as the provider pins it) converts both sides of a comparison to a common type: a
FLOAT column against a DECIMAL or DOUBLE literal compares as DOUBLE, a BIGINT against a DOUBLE as
DOUBLE, an INT against a DECIMAL as a wider DECIMAL, a DATE against a TIMESTAMP as TIMESTAMP, a
STRING against a number as that number. One table partitioned by a column of every type, one file
per row; for each predicate the engine's ``files_matching`` must hold every file Spark's scan
reads, and equal it where the engine models the comparison (partition-only, nothing Unknown).
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.expressions import is_partition_only

from .tables import engine_relative_paths, spark_files

COLUMNS = {
    "f": ("FLOAT", ["0.1", "1.0", "1.5", "2.5", "16777216", "'5.2363342E10'", "'NaN'", None]),
    "d": ("DOUBLE", ["0.1D", "0.10000000149011612D", "1.0D", "1.5D", "2.5D", "'NaN'", "-0.0D", None]),
    "l": ("BIGINT", ["1", "2", "9007199254740992", "9007199254740993", "-1", "9007199254740994", "0", None]),
    "i": ("INT", ["1", "2", "3", "-1", "0", "2147483647", "1", None]),
    "s": ("SMALLINT", ["1", "2", "127", "-1", "0", "32767", "1", None]),
    "y": ("TINYINT", ["1", "2", "127", "-1", "0", "-128", "1", None]),
    "dec": ("DECIMAL(5,2)", ["0.10", "1.00", "1.50", "2.50", "0.00", "999.99", "-1.55", None]),
    "dbig": ("DECIMAL(20,0)", ["1", "9007199254740992", "9007199254740993", "0", "2", "9007199254740994", "-1",
                               None]),
    "dt": ("DATE", ["'2024-01-01'", "'2024-01-02'", "'2023-12-31'", "'2024-01-01'", "'2024-01-03'", "'2024-01-02'",
                    "'2024-01-01'", None]),
    "ts": ("TIMESTAMP", ["'2024-01-01 00:00:00'", "'2024-01-01 12:00:00'", "'2024-01-02 00:00:00'",
                         "'2023-12-31 23:59:59.999999'", "'2024-01-01 00:00:00.000001'", "'2024-01-01 12:00:00'",
                         "'2024-01-01 00:00:00'", None]),
    "ntz": ("TIMESTAMP_NTZ", ["'2024-01-01 00:00:00'", "'2024-01-01 12:00:00'", "'2024-01-02 00:00:00'",
                              "'2023-12-31 22:00:00'", "'2024-01-01 00:00:00'", "'2024-01-01 12:00:00'",
                              "'2024-01-01 00:00:00'", None]),
    "str": ("STRING", ["'1'", "'01'", "'2'", "' 1'", "'3'", "'10'", "'2'", None]),
}
ROWS = 8

PREDICATES = [
    # FLOAT column: DECIMAL, DOUBLE, integral and string literals compare as DOUBLE; FLOAT literals as FLOAT.
    "f > 0.1", "f = 0.1", "f <= 0.1", "f != 0.1", "NOT (f > 0.1)", "f = 0.1F", "f = 0.1000000001F", "f >= 0.1F",
    "f <=> 0.1F", "NOT (f = 0.1F)", "f = 1.5BD", "f = 1e0", "f = 1", "f = '1'", "f < 2.5", "f IN (1, 2.5)",
    "f NOT IN (1, 2.5)", "f IN (0.1F, 2.5)", "f = 16777217", "f = 5.236334E10F", "f = 5.2363342E10F",
    "f > 5.236334E10", "f > 1.5D", "f = 'NaN'", "f > 3.5e38D", "f < -3.5e38D", "0.1 < f", "f IN (0.1, NULL)",
    # DOUBLE column: a FLOAT literal is widened exactly.
    "d = 0.1F", "d = 0.1", "d > 0.1F", "d = 1", "d = '0.1'", "d IN (0.1F, 1)", "d = 0", "d <=> 0.0D",
    # BIGINT and narrower integral columns.
    "l = 9007199254740992.0D", "NOT (l = 9007199254740992.0D)", "l <=> 9007199254740992.0D",
    "l != 9007199254740992.0D", "l >= 9007199254740992.0D", "l > 9007199254740992.0D", "l < 9007199254740994.0D",
    "l = 9007199254740993", "l IN (9007199254740993, 1.5D)", "l = 1.5", "l > 1.5", "l < 2.5", "l = 1e0", "l = '1'",
    "l = 1.0F", "l = 9007199254740993.0F",
    "i = 1.5", "NOT (i = 1.5)", "i IN (1, 2.5)", "i < 2.5", "i = 1e0", "i = '1'", "i > 1.5F", "i = 10000000000",
    "i < 10000000000", "i IN (2.5, '2')", "2.5 > i", "i = 2147483647.0F",
    "s = 1.5D", "s <= 1000", "s > 32767.5", "y = 1000", "y < 1000", "y > -1000", "y = '1'", "y >= 126.5",
    # DECIMAL columns: integral and DECIMAL literals compare exactly; DOUBLE, FLOAT and string ones as DOUBLE.
    "dec = 1", "dec = 1.5", "dec = 1.555", "dec > 1.555", "dec = 1e0", "dec = 1.5F", "dec = '1.5'", "dec = 0.1F",
    "dec < 0.1F", "dec >= 0.1D", "dec > 1000", "dec < -1.555", "dec IN (1, '2.5')",
    "dbig = 9007199254740992.0D", "dbig IN (9007199254740993, 1.5D)", "dbig > 9007199254740992.0D",
    "dbig = 9007199254740993",
    # DATE against TIMESTAMP (session time zone UTC) and TIMESTAMP_NTZ; timestamps against dates and strings.
    "dt = '2024-01-01'", "dt = DATE'2024-01-01'", "dt = TIMESTAMP'2024-01-01 00:00:00'",
    "dt = TIMESTAMP'2024-01-01 12:00:00'", "NOT (dt = TIMESTAMP'2024-01-01 12:00:00')",
    "dt > TIMESTAMP'2024-01-01 12:00:00'", "dt >= TIMESTAMP'2024-01-01 12:00:00'",
    "dt < TIMESTAMP'2024-01-01 12:00:00'", "dt <= TIMESTAMP'2024-01-01 00:00:00'",
    "dt > TIMESTAMP'2024-01-01 00:00:00+02:00'", "dt = TIMESTAMP_NTZ'2024-01-01 00:00:00'",
    "dt < TIMESTAMP_NTZ'2024-01-01 00:00:01'", "dt IN ('2024-01-02', TIMESTAMP'2024-01-01 00:00:00')",
    "ts = DATE'2024-01-01'", "ts > '2024-01-01'", "ts = TIMESTAMP_NTZ'2024-01-01 12:00:00'", "ts < DATE'2024-01-01'",
    "ntz = TIMESTAMP'2024-01-01 12:00:00'", "ntz < TIMESTAMP'2024-01-01 00:00:00+02:00'", "ntz = DATE'2024-01-01'",
    # STRING against numbers: Spark casts the column (BIGINT, DOUBLE); the engine may only widen.
    "str = '1'", "str = 1", "str = 1.0", "str = 1e0", "str IN (1, 2)", "str > 1", "NOT (str = 1)",
]


SCANNED = ["f > 0.1", "l = 9007199254740992.0D", "NOT (f > 0.1)", "i IN (1, 2.5)",
           "dt > TIMESTAMP'2024-01-01 12:00:00'"]


@pytest.fixture(scope="module")
def typed_table(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, set[str]]]:
    """The table's path, and per predicate the files of the rows Spark's ``SELECT ... WHERE`` selects.

    Every row is a partition of its own, so a row's file is its partition's: one query evaluates
    all predicates on all rows (a scan per predicate would take a minute).
    """
    path = str(tmp_path_factory.mktemp("comparison_types") / "t")
    names = list(COLUMNS)
    schema = ", ".join(f"{n} {t}" for n, (t, _) in COLUMNS.items())
    spark.sql(f"CREATE TABLE delta.`{path}` (id INT, {schema}) USING delta PARTITIONED BY ({', '.join(names)})")
    rows = []
    for r in range(ROWS):
        values = [f"CAST({vals[r]} AS {t})" if vals[r] is not None else f"CAST(NULL AS {t})"
                  for t, vals in COLUMNS.values()]
        rows.append(f"({r}, {', '.join(values)})")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES {', '.join(rows)}")
    version = DeltaLog.for_table(path).latest_version()
    files = {r: spark_files(spark, path, version, f"id = {r}") for r in range(ROWS)}
    assert all(len(f) == 1 for f in files.values()) and len(set().union(*files.values())) == ROWS, files
    frame = spark.read.format("delta").load(path)
    truth = frame.selectExpr("id", *(f"({p}) AS c{k}" for k, p in enumerate(PREDICATES))).collect()
    selected = {p: set().union(*(files[row["id"]] for row in truth if row[f"c{k}"] is True))
                for k, p in enumerate(PREDICATES)}
    return path, selected


@pytest.mark.parametrize("predicate", PREDICATES)
def test_engine_files_cover_sparks_for_mixed_type_comparisons(typed_table: tuple[str, dict[str, set[str]]],
                                                              predicate: str) -> None:
    path, selected = typed_table
    snapshot = DeltaLog.for_table(path).snapshot()
    ours = engine_relative_paths([f.path for f in snapshot.files_matching(predicate)])
    theirs = selected[predicate]
    missing = theirs - ours
    assert not missing, f"the engine misses files Spark reads for {predicate!r}: {sorted(missing)}"
    if is_partition_only(snapshot.bind(predicate), snapshot.partition_columns):
        assert ours == theirs, f"{predicate!r}: the engine reads more files than Spark: {sorted(ours - theirs)}"


@pytest.mark.parametrize("predicate", SCANNED)
def test_sparks_scan_prunes_to_the_rows_it_selects(spark: Any, typed_table: tuple[str, dict[str, set[str]]],
                                                   predicate: str) -> None:
    """Partition pruning reads the files of the selected rows: the row-level answer above is the scan's."""
    path, selected = typed_table
    version = DeltaLog.for_table(path).latest_version()
    assert spark_files(spark, path, version, predicate) == selected[predicate]
