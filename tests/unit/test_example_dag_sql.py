"""The SQL the demo DAG builds from its table path and the run's date stays a path and a date, whatever they hold."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from airflow_delta_occ.engine.sql_parser import parse_predicate

pytestmark = pytest.mark.unit

DAG_FILE = Path(__file__).resolve().parents[2] / "dags_examples" / "delta_conflict_pool.py"


def _dag_module(root: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("DELTA_OCC_DEMO_ROOT", root)
    spec = importlib.util.spec_from_file_location("delta_conflict_pool_under_test", DAG_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_hostile_run_date_is_refused_before_any_sql_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    dag = _dag_module("/lake", monkeypatch)
    assert dag.day_sql("2024-01-31") == "DATE'2024-01-31'"
    for hostile in ("2024-01-01' OR 1=1 --", "2024-01-01'", "", "None"):
        with pytest.raises(ValueError):
            dag.day_sql(hostile)


def test_a_backtick_in_the_table_path_cannot_end_the_identifier(monkeypatch: pytest.MonkeyPatch) -> None:
    dag = _dag_module("/lake/a`b` OR 1=1 --", monkeypatch)
    assert dag.table_sql() == "delta.`/lake/a``b`` OR 1=1 --/orders`"
    # Spark's grammar, as the engine's parser reads it: one column reference, nothing after it.
    parsed = parse_predicate(dag.table_sql().removeprefix("delta.") + " = 1")
    assert parsed.left.name == "/lake/a`b` OR 1=1 --/orders"  # type: ignore[attr-defined]
