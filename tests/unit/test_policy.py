"""The cluster policy (``airflow_delta_occ.policy``): Delta tasks routed to their conflict pool's Airflow pool,
on constructed operators and through Airflow's own ``DagBag`` (which calls the policy registered by the
``airflow.policy`` entry point)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import DAG, BaseOperator

from airflow_delta_occ import policy
from airflow_delta_occ.exceptions import PoolConfigError, ProviderConfigError
from airflow_delta_occ.operators.delta import DeltaOptimizeOperator, DeltaUpdateOperator

pytestmark = pytest.mark.unit

POOLS = '''
[pools.sales]
tables = ["s3://lake/sales/**", "main.sales.*"]
airflow_pool = "delta_sales"

[pools.events]
tables = ["/lake/events/*"]
'''


@pytest.fixture
def pools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "pools.toml"
    path.write_text(POOLS)
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(path))
    monkeypatch.delenv("AIRFLOW__DELTA_OCC__ASSIGN_POOLS", raising=False)
    monkeypatch.delenv("AIRFLOW__DELTA_OCC__ENFORCE_POOLS", raising=False)
    return path


@pytest.fixture
def assign(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__ASSIGN_POOLS", "True")


@pytest.fixture
def broken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "broken.toml"
    path.write_text('[pools.sales]\ntables = ["s3://lake/sales/**"]\nmax_writers = 0\n')
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(path))
    return path


class SensorLike(BaseOperator):
    """Stands for ``DeltaConflictSensor``: a ``conflict_pool`` and a ``table``, and no routing of its own."""

    def __init__(self, *, table: str, conflict_pool: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.table = table
        self.conflict_pool = conflict_pool


def _update(**kwargs: Any) -> DeltaUpdateOperator:
    return DeltaUpdateOperator(task_id=kwargs.pop("task_id", "u"), table=kwargs.pop("table", "s3a://lake/sales/t"),
                               set={"v": "1"}, **kwargs)


def _state(task: Any) -> tuple[Any, Any]:
    return task.conflict_pool, task.pool


# -- a task that names its conflict pool ------------------------------------------------------------
def test_a_task_of_a_conflict_pool_left_in_default_pool_is_routed(pools: Path) -> None:
    sensor = SensorLike(task_id="s", table="s3://lake/sales/t", conflict_pool="sales")
    assert sensor.pool == policy.DEFAULT_AIRFLOW_POOL
    policy.task_policy(sensor)
    assert _state(sensor) == ("sales", "delta_sales")
    explicit_default = SensorLike(task_id="s2", table="/lake/events/e", conflict_pool="events", pool="default_pool")
    policy.task_policy(explicit_default)  # default_pool counts as no choice
    assert _state(explicit_default) == ("events", "delta_occ_events")


def test_an_operator_parsed_without_the_pool_file_is_routed_by_the_policy(pools: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", "")
    op = _update(conflict_pool="sales")
    assert op.pool == policy.DEFAULT_AIRFLOW_POOL  # the operator could not look the pool up
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(pools))
    assert policy.route_task(op) == "sales"
    assert _state(op) == ("sales", "delta_sales")


def test_an_explicit_pool_is_kept_with_a_warning_unless_pools_are_enforced(
        pools: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    op = _update(conflict_pool="sales", pool="team_pool")
    with caplog.at_level(logging.WARNING, logger=policy.__name__):
        policy.task_policy(op)
    assert _state(op) == ("sales", "team_pool")
    assert "task 'u' of conflict pool 'sales' runs in Airflow pool 'team_pool'" in caplog.text
    assert "enforce_pools" in caplog.text

    monkeypatch.setenv("AIRFLOW__DELTA_OCC__ENFORCE_POOLS", "true")
    policy.task_policy(op)
    assert _state(op) == ("sales", "delta_sales")
    dag_wide = _update(conflict_pool="sales", default_args={"pool": "dag_wide"})
    policy.task_policy(dag_wide)
    assert dag_wide.pool == "delta_sales"


def test_no_pool_file_leaves_a_named_task_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", "")
    sensor = SensorLike(task_id="s", table="s3://lake/sales/t", conflict_pool="sales")
    assert policy.route_task(sensor) == "sales"
    assert sensor.pool == policy.DEFAULT_AIRFLOW_POOL


def test_an_unknown_pool_fails_naming_the_task_and_the_file(pools: Path) -> None:
    sensor = SensorLike(task_id="watch", table="s3://lake/sales/t", conflict_pool="nope")
    with pytest.raises(PoolConfigError, match=r"task 'watch' \(airflow-delta-occ cluster policy\): .*pools.toml: "
                                              r"unknown pool 'nope'"):
        policy.task_policy(sensor)


# -- a task that names none: assign_pools ---------------------------------------------------------
def test_without_assign_pools_a_task_without_conflict_pool_is_left(pools: Path) -> None:
    op = _update()
    policy.task_policy(op)
    assert _state(op) == (None, policy.DEFAULT_AIRFLOW_POOL)


def test_assign_pools_gives_a_literal_table_its_pool(pools: Path, assign: None) -> None:
    op = _update(table="s3a://lake/sales//fact/")  # normalized: s3://lake/sales/fact
    events = DeltaOptimizeOperator(task_id="o", table="/lake/events/e1")
    sensor = SensorLike(task_id="s", table="main.sales.orders")  # a catalog name matched by a catalog pattern
    for task in (op, events, sensor):
        policy.task_policy(task)
    assert _state(op) == ("sales", "delta_sales")
    assert _state(events) == ("events", "delta_occ_events")
    assert _state(sensor) == ("sales", "delta_sales")


def test_assign_pools_keeps_an_explicit_pool_unless_enforced(pools: Path, assign: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    op = _update(pool="team_pool")
    policy.task_policy(op)
    assert _state(op) == ("sales", "team_pool")  # leased in the pool; the author's Airflow pool is kept
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__ENFORCE_POOLS", "1")
    policy.task_policy(op)
    assert _state(op) == ("sales", "delta_sales")


@pytest.mark.parametrize("kwargs", [
    {"table": "s3://lake/sales/{{ params.t }}"},     # templated: only known at run time
    {"table": "{% if true %}s3://lake/sales/t{% endif %}"},
    {"table": "s3://lake/other/t"},                   # in no pool
    {"table": None, "table_name": "main.sales.t"},    # a catalog table: its location is resolved at run time
])
def test_assign_pools_leaves_what_cannot_be_matched_at_parse_time(pools: Path, assign: None,
                                                                  kwargs: dict[str, Any]) -> None:
    op = DeltaUpdateOperator(task_id="u", set={"v": "1"}, **kwargs)
    assert policy.route_task(op) is None
    assert _state(op) == (None, policy.DEFAULT_AIRFLOW_POOL)


def test_a_relative_table_is_left(pools: Path, assign: None) -> None:
    sensor = SensorLike(task_id="s", table="lake/sales/t")
    assert policy.route_task(sensor) is None
    assert _state(sensor) == (None, policy.DEFAULT_AIRFLOW_POOL)


def test_mapped_delta_tasks(pools: Path, assign: None) -> None:
    with DAG("d", schedule=None):
        static = DeltaUpdateOperator.partial(task_id="static", table="s3://lake/sales/t").expand(set=[{"v": "1"}])
        expanded = DeltaUpdateOperator.partial(task_id="expanded", set={"v": "1"}).expand(
            table=["s3://lake/sales/a", "s3://lake/sales/b"])
        named = SensorLike.partial(task_id="named", conflict_pool="events").expand(table=["/lake/events/e"])
    for task in (static, expanded, named):
        policy.task_policy(task)
    assert (static.partial_kwargs["conflict_pool"], static.pool) == ("sales", "delta_sales")
    assert ("conflict_pool" not in expanded.partial_kwargs, expanded.pool) == (True, policy.DEFAULT_AIRFLOW_POOL)
    assert named.pool == "delta_occ_events"
    # The worker builds each mapped task from the partial kwargs: the unmapped operator takes leases.
    assert static.unmap({"set": {"v": "1"}}).conflict_pool == "sales"


def test_the_policy_is_idempotent(pools: Path, assign: None) -> None:
    tasks = [_update(task_id="a"), _update(task_id="b", conflict_pool="sales", pool="mine"),
             SensorLike(task_id="c", table="/lake/events/x")]
    for _ in range(2):
        for task in tasks:
            policy.task_policy(task)
        assert [_state(t) for t in tasks] == [("sales", "delta_sales"), ("sales", "mine"),
                                             ("events", "delta_occ_events")]


# -- other tasks, errors --------------------------------------------------------------------------
def test_other_tasks_are_never_touched_nor_is_the_pool_file_read(broken: Path, assign: None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk import task

    monkeypatch.setenv("AIRFLOW__DELTA_OCC__ENFORCE_POOLS", "True")
    with DAG("d", schedule=None):
        plain = BaseOperator(task_id="plain", pool="x")
        with_table = BaseOperator(task_id="with_table")
        with_table.table = "s3://lake/sales/t"  # type: ignore[attr-defined]

        @task(pool="y")
        def f(v: int) -> None:
            pass

        mapped = f.expand(v=[1, 2]).operator
    for t in (plain, with_table, mapped):
        assert policy.route_task(t) is None
    assert (plain.pool, with_table.pool, mapped.pool) == ("x", policy.DEFAULT_AIRFLOW_POOL, "y")
    assert not hasattr(with_table, "conflict_pool")


def test_a_broken_pool_file_fails_only_when_a_delta_task_needs_it(broken: Path, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    op = _update()
    policy.task_policy(op)  # assign_pools is off: the file is not needed
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__ASSIGN_POOLS", "True")
    with pytest.raises(PoolConfigError, match=rf"task 'u' .*{broken}.*pools.sales.max_writers: expected a positive"):
        policy.task_policy(op)


def test_a_malformed_option_names_it(pools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__ASSIGN_POOLS", "sometimes")
    with pytest.raises(ProviderConfigError, match=r"\[delta_occ\] assign_pools is 'sometimes'; expected True or "
                                                  "False"):
        policy.task_policy(_update())


# -- through Airflow: the entry point and DagBag ---------------------------------------------------
DAG_FILE = '''
import datetime as dt
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow_delta_occ.operators.delta import DeltaUpdateOperator

with DAG(dag_id="policy_dag", schedule=None, start_date=dt.datetime(2024, 1, 1)):
    DeltaUpdateOperator(task_id="assigned", table="s3://lake/sales/t", set={"v": "1"})
    EmptyOperator(task_id="plain")
'''


def test_the_entry_point_registers_the_policy_with_airflow() -> None:
    from airflow import settings

    plugins = [impl.plugin for impl in settings.get_policy_plugin_manager().hook.task_policy.get_hookimpls()]
    assert policy in plugins


def test_dagbag_applies_the_policy_and_reports_a_broken_pool_file_as_an_import_error(
        pools: Path, assign: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag

    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "policy_dag.py").write_text(DAG_FILE)
    bag = DagBag(dag_folder=str(folder))
    assert bag.import_errors == {}
    dag = bag.dags["policy_dag"]  # (get_dag would ask the metadata database)
    tasks = {t.task_id: t for t in dag.tasks}
    assert _state(tasks["assigned"]) == ("sales", "delta_sales")
    assert tasks["plain"].pool == policy.DEFAULT_AIRFLOW_POOL

    bad = tmp_path / "bad.toml"
    bad.write_text("[pools.sales\n")
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(bad))
    bag = DagBag(dag_folder=str(folder))
    assert "policy_dag" not in bag.dags
    [error] = bag.import_errors.values()
    assert "AirflowClusterPolicyError" in error and "task 'assigned'" in error and f"{bad}: not valid TOML" in error


def test_the_policy_module_loads_no_pyarrow_numpy_or_spark() -> None:
    code = textwrap.dedent("""
        import sys
        import airflow_delta_occ.policy
        print(sorted({m.split('.')[0] for m in sys.modules} & {'pyarrow', 'numpy', 'pyspark', 'py4j', 'delta'}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
