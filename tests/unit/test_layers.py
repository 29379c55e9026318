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


#: The floors of the package, lowest first: a module may import its own folder and the floors below
#: it, never one beside or above it (so no import circle can span folders, and each floor can be read
#: knowing only what is under it). Top-level modules count as folders of their own.
FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"engine", "ports"}),
    frozenset({"exceptions"}),
    frozenset({"retry", "pools"}),
    frozenset({"jobs", "config"}),
    frozenset({"spark", "demo", "policy"}),
    frozenset({"hooks"}),
    frozenset({"triggers"}),
    frozenset({"operators", "sensors"}),
    frozenset({"dagcheck"}),
    frozenset({"cli"}),
)
APART = frozenset({"get_provider_info", "__init__"})   # read by Airflow by name; imports nothing of ours


def _folder_imports() -> list[tuple[str, str, str]]:
    """(importing file, its folder, the folder it imports) for every import of the package by the
    package, at any depth (function-level and ``TYPE_CHECKING`` imports are dependencies too)."""
    import ast
    from pathlib import Path

    root = Path(airflow_delta_occ.engine.__file__).parent.parent
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        folder = relative.parts[0].removesuffix(".py")
        package = ".".join(("airflow_delta_occ", *relative.parts[:-1]))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    names = [".".join([*base, node.module] if node.module else base)]
                    if node.module is None:
                        names = [f"{names[0]}.{alias.name}" for alias in node.names]
                else:
                    names = [node.module or ""]
            for name in names:
                parts = name.split(".")
                if parts[0] == "airflow_delta_occ" and len(parts) > 1:
                    found.append((str(relative), folder, parts[1]))
    return found


def test_every_import_between_the_packages_folders_points_down() -> None:
    rank = {name: i for i, floor in enumerate(FLOORS) for name in floor}
    imports = _folder_imports()
    folders = {folder for _, folder, _ in imports} | {target for _, _, target in imports}
    assert folders - APART <= set(rank), f"a folder without a floor: {sorted(folders - APART - set(rank))}"
    # The provider's info is the floor below all: read by Airflow by name, it imports nothing of ours, and
    # a hook may take its connection form from it.
    assert [target for _, folder, target in imports if folder == "get_provider_info"] == []
    wrong = sorted(f"{file} imports {target} ({'beside' if rank[target] == rank[folder] else 'above'} it)"
                   for file, folder, target in imports
                   if folder not in APART and target != "get_provider_info" and target != folder
                   and rank[target] >= rank[folder])
    assert wrong == []
    assert any(target == "engine" for _, folder, target in imports if folder == "operators")  # it read imports
