"""``make demo``: six writers into one Delta table through a real Airflow scheduler and a conflict pool.

``python -m airflow_delta_occ.demo`` starts Airflow (``airflow standalone``: scheduler with the
LocalExecutor, DAG processor, triggerer, API server, SQLite) in a throwaway AIRFLOW_HOME with a conflict
pool and a SQLite lease store, runs ``dags_examples/delta_conflict_pool.py`` once with every task's job
on one local Spark Connect server started before Airflow (``--spark embedded``: each task starts its
own Spark session instead; ``spark_server``), and prints what ran in parallel, what was serialized and
why, the conflicts avoided and the final table (``scenario``, ``summary``). ``airflow_run`` (a
throwaway Airflow) and ``metadata`` (reading its SQLite database) serve the tests and benchmarks too.
"""

from __future__ import annotations

from airflow_delta_occ.ports import free_port

from .airflow_run import DagRunOutcome, airflow_cli, airflow_env, run_dag, standalone
from .scenario import DemoRun, check_dags_folder, run_demo
from .spark_server import SPARK_MODES, DemoSpark, demo_spark

__all__ = ["SPARK_MODES", "DagRunOutcome", "DemoRun", "DemoSpark", "airflow_cli", "airflow_env", "check_dags_folder",
           "demo_spark", "free_port", "run_dag", "run_demo", "standalone"]
