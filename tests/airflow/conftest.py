"""The ``airflow`` tier: real Airflow (CLI, DAG processor, task runner) in a throwaway AIRFLOW_HOME."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
AIRFLOW = [sys.executable, "-m", "airflow"]


@pytest.hookimpl(tryfirst=True)  # before tests/conftest.py checks that every test has its tier
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under this folder is in the ``airflow`` tier (``make test-airflow``: ``pytest tests -m airflow``)."""
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.airflow)


@pytest.fixture(scope="session")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment of an Airflow installation with a migrated SQLite database and the example DAGs."""
    home = tmp_path_factory.mktemp("airflow_home")
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags_examples")}
    subprocess.run([*AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return env
