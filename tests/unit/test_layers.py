"""What each layer may import: pure folders neither Airflow nor Spark; the Airflow side no pyarrow
or numpy until a table is read (operators are parsed by the DAG processor, policies run in the
scheduler, triggers in the triggerer)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import airflow_delta_occ.engine
import airflow_delta_occ.jobs
import airflow_delta_occ.pools

pytestmark = pytest.mark.unit

PURE = sorted([f"airflow_delta_occ.engine.{m.name}" for m in pkgutil.iter_modules(airflow_delta_occ.engine.__path__)]
              + [f"airflow_delta_occ.jobs.{m.name}" for m in pkgutil.iter_modules(airflow_delta_occ.jobs.__path__)]
              + [m.name for m in pkgutil.walk_packages(airflow_delta_occ.pools.__path__, "airflow_delta_occ.pools.")]
              + ["airflow_delta_occ.retry.classify", "airflow_delta_occ.retry.policy",
                 "airflow_delta_occ.exceptions"])
AIRFLOW_SIDE = ["airflow_delta_occ.operators.delta", "airflow_delta_occ.hooks.delta",
                "airflow_delta_occ.hooks.leases", "airflow_delta_occ.operators.retry_policy",
                "airflow_delta_occ.config", "airflow_delta_occ.get_provider_info", "airflow_delta_occ.cli",
                "airflow_delta_occ.triggers.lease", "airflow_delta_occ.sensors.conflict", "airflow_delta_occ.policy"]


def _loaded_after_import(modules: list[str], roots: tuple[str, ...]) -> list[str]:
    code = (f"import importlib, sys; [importlib.import_module(m) for m in {modules!r}]; "
            f"print(sorted({{m.split('.')[0] for m in sys.modules if m.split('.')[0] in {roots!r}}}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return list(eval(out.stdout.strip().splitlines()[-1]))  # a printed list of names


def test_pure_layers_import_neither_airflow_nor_spark() -> None:
    assert len(PURE) > 25  # every engine and jobs module is in the list
    assert _loaded_after_import(PURE, ("airflow", "pyspark", "delta", "py4j")) == []


def test_the_airflow_side_loads_no_pyarrow_numpy_or_spark_until_a_table_is_read() -> None:
    assert _loaded_after_import(AIRFLOW_SIDE, ("pyarrow", "numpy", "pyspark", "py4j", "delta")) == []


def test_footprint_and_verdict_types_load_without_pyarrow_or_numpy() -> None:
    """Pools, sensors and triggers judge footprints and verdicts; only a checkpoint's rows need the arrays."""
    code = (
        "import sys\n"
        "from airflow_delta_occ.engine.planner import Footprint, Operation, TableState, Verdict, can_conflict,"
        " plan_footprint, verdict\n"
        "from airflow_delta_occ.engine.conflicts import IsolationLevel, PendingCommit, WinningCommit,"
        " check_winning_commit\n"
        "from airflow_delta_occ.engine.transaction import CommitResult, Transaction\n"
        "from airflow_delta_occ.engine.errors import ConflictKind, DeltaConcurrentModificationException\n"
        "from airflow_delta_occ.engine.expressions import Expr\n"
        "from airflow_delta_occ.engine.predicates import bind, file_may_match\n"
        "from airflow_delta_occ.engine.expr_json import expr_from_json, expr_to_json\n"
        "import airflow_delta_occ.engine as engine\n"
        "[getattr(engine, name) for name in engine.__all__]\n"
        "print(sorted(m for m in ('pyarrow', 'numpy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
