"""The cluster policy through the real ``airflow`` CLI: ``airflow dags reserialize`` parses a DAG folder in a
throwaway AIRFLOW_HOME (no ``airflow_local_settings`` anywhere: the installed package's ``airflow.policy``
entry point is the only policy), and the serialized DAG in the metadata database shows each task's pool.

``conflict_pool`` is not among the attributes Airflow serializes, so ``Probe`` (a Delta operator subclassed
in the DAG file) lists it as a template field: its value as the policy left it is then serialized too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import AIRFLOW

pytestmark = pytest.mark.airflow

DAG_FILE = '''
import datetime as dt
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow_delta_occ.operators.delta import DeltaUpdateOperator

class Probe(DeltaUpdateOperator):
    """Serializes conflict_pool (as a template field) so the test can read what the policy set."""
    template_fields = (*DeltaUpdateOperator.template_fields, "conflict_pool")

SET = {"v": "1"}
with DAG(dag_id="policy_dag", schedule=None, start_date=dt.datetime(2024, 1, 1)):
    DeltaUpdateOperator(task_id="assigned", table="s3a://lake/sales/t", set=SET)
    Probe(task_id="assigned_probe", table="s3://lake/sales/t2", set=SET)
    Probe(task_id="templated", table="s3://lake/sales/{{ ds }}", set=SET)
    Probe(task_id="other_table", table="s3://lake/other/t", set=SET)
    Probe(task_id="named_explicit", table="s3://lake/sales/t3", set=SET, conflict_pool="sales", pool="team")
    DeltaUpdateOperator.partial(task_id="mapped", table="s3://lake/sales/m").expand(set=[SET, SET])
    EmptyOperator(task_id="plain")
'''

POOLS = '''
[pools.sales]
tables = ["s3://lake/sales/**"]
airflow_pool = "delta_sales"
'''


def _reserialize(env: dict[str, str], **options: str) -> dict[str, dict[str, Any]]:
    """Run ``airflow dags reserialize`` with ``[delta_occ]`` options; each task's serialized attributes."""
    env = {**env, **{f"AIRFLOW__DELTA_OCC__{k.upper()}": v for k, v in options.items()}}
    done = subprocess.run([*AIRFLOW, "dags", "reserialize"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    db = Path(env["AIRFLOW_HOME"]) / "airflow.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        rows = con.execute("SELECT data FROM serialized_dag WHERE dag_id = 'policy_dag' "
                           "ORDER BY last_updated DESC LIMIT 1").fetchall()
    assert rows, done.stdout[-3000:] + done.stderr[-3000:]
    tasks = json.loads(rows[0][0])["dag"]["tasks"]
    return {t["__var"]["task_id"]: t["__var"] for t in tasks}


def _pools(tasks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each task's Airflow pool (Airflow leaves ``default_pool`` out of the serialized task)."""
    def pool(task: dict[str, Any]) -> Any:
        if "partial_kwargs" in task:
            return task["partial_kwargs"].get("pool", "default_pool")
        return task.get("pool", "default_pool")
    return {task_id: pool(task) for task_id, task in tasks.items()}


@pytest.fixture(scope="module")
def policy_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("policy_home")
    dags = home / "dags"
    dags.mkdir()
    (dags / "policy_dag.py").write_text(DAG_FILE)
    (home / "pools.toml").write_text(POOLS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__DELTA_OCC__")}
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW__DELTA_OCC__POOL_FILE": str(home / "pools.toml"),
                # each reserialize writes the DAG again (by default a DAG is rewritten at most every 30 s)
                "AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL": "0"})
    done = subprocess.run([*AIRFLOW, "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return env


def test_the_entry_point_policy_assigns_and_routes_delta_tasks(policy_env: dict[str, str]) -> None:
    # Nothing but the installed package provides a policy: no airflow_local_settings on any path Airflow adds.
    home = Path(policy_env["AIRFLOW_HOME"])
    assert not list(home.rglob("airflow_local_settings*"))
    assert importlib.util.find_spec("airflow_local_settings") is None
    assert "PYTHONPATH" not in policy_env or "airflow_local_settings" not in policy_env["PYTHONPATH"]

    on = _reserialize(policy_env, assign_pools="True")
    assert _pools(on) == {"assigned": "delta_sales", "assigned_probe": "delta_sales", "templated": "default_pool",
                          "other_table": "default_pool", "named_explicit": "team", "mapped": "delta_sales",
                          "plain": "default_pool"}
    assert on["assigned_probe"]["conflict_pool"] == "sales"       # the policy gave it the pool: it takes leases
    assert on["mapped"]["partial_kwargs"]["conflict_pool"] == "sales"
    assert on["named_explicit"]["conflict_pool"] == "sales"
    assert on["templated"].get("conflict_pool") is None           # a templated table is matched at run time only
    assert on["other_table"].get("conflict_pool") is None

    # assign_pools off: nothing is assigned; enforce_pools on: the author's pool= gives way to the pool's.
    off = _reserialize(policy_env, assign_pools="False", enforce_pools="True")
    assert _pools(off) == {"assigned": "default_pool", "assigned_probe": "default_pool", "templated": "default_pool",
                           "other_table": "default_pool", "named_explicit": "delta_sales",
                           "mapped": "default_pool", "plain": "default_pool"}
    assert off["assigned_probe"].get("conflict_pool") is None
    assert "conflict_pool" not in off["mapped"]["partial_kwargs"]


UNNAMED_DAG_FILE = '''
import datetime as dt
from airflow.sdk import DAG
from airflow_delta_occ.operators.delta import DeltaUpdateOperator

with DAG(dag_id="policy_unnamed", schedule=None, start_date=dt.datetime(2024, 1, 1)):
    DeltaUpdateOperator(task_id="assigned", table="s3://lake/sales/t", set={"v": "1"})
'''


def test_a_broken_pool_file_is_the_dags_import_error_naming_file_and_task(policy_env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    # A DAG whose Delta task names no pool: the operator never reads the pool file, the policy does.
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "policy_unnamed.py").write_text(UNNAMED_DAG_FILE)
    bad = tmp_path / "bad.toml"
    bad.write_text('[pools.sales]\ntables = ["s3://lake/sales/**"]\nmax_writers = 0\n')
    env = {**policy_env, "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "AIRFLOW__DELTA_OCC__POOL_FILE": str(bad),
           "AIRFLOW__DELTA_OCC__ASSIGN_POOLS": "True"}
    done = subprocess.run([*AIRFLOW, "dags", "reserialize"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    db = Path(env["AIRFLOW_HOME"]) / "airflow.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        errors = dict(con.execute("SELECT filename, stacktrace FROM import_error").fetchall())
    error = errors["policy_unnamed.py"]
    assert error.startswith("AirflowClusterPolicyError: task 'assigned' (airflow-delta-occ cluster policy): "), error
    assert f"{bad}: pools.sales.max_writers: expected a positive integer, got 0" in error
