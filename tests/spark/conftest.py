"""Real local Spark with delta-spark for the ``spark`` tier: one session for the whole run.

Delta's jars come from Maven Central through Spark's Ivy resolution into a per-user cache
(``airflow_delta_occ.spark.session``). A missing Java or an unreachable repository fails the tier
loudly: a skipped real-Spark test proves nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_delta_occ.spark.session import local_delta_session

from .differential.harness import gate_session_conf
from .jobs import create_sales
from .tables import TableSpec, build_table

TABLE_SPECS = [
    TableSpec("partitioned_classic", partitioned=True, deletion_vectors=False, checkpoint="classic"),
    TableSpec("partitioned_dv_multipart_colmap", partitioned=True, deletion_vectors=True,
              checkpoint="multipart", column_mapping=True),
    TableSpec("unpartitioned_dv_v2json", partitioned=False, deletion_vectors=True, checkpoint="v2-json"),
    TableSpec("unpartitioned_v2parquet", partitioned=False, deletion_vectors=False, checkpoint="v2-parquet"),
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/spark/" in str(item.fspath):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    # The gate LogStore passes every commit through untouched unless a test sets its token.
    session = local_delta_session("airflow-delta-occ-tests", conf=gate_session_conf())
    yield session
    session.stop()


@pytest.fixture(scope="session")
def built_tables(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, TableSpec]]:
    """Every table of ``TABLE_SPECS`` built once per run: name -> (path, spec)."""
    root = tmp_path_factory.mktemp("delta_tables")
    tables = {}
    for spec in TABLE_SPECS:
        path = str(root / spec.name)
        history = build_table(spark, path, spec)
        assert len(history) >= 25, history
        tables[spec.name] = (path, spec)
    return tables


@pytest.fixture
def sales(spark: Any, tmp_path: Any) -> str:
    """A small table partitioned by (date, country), two rows per partition (see ``jobs.create_sales``)."""
    return create_sales(spark, str(tmp_path / "sales"))
