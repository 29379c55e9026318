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
