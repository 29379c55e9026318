"""``airflow delta-occ check``: the pairs of Delta tasks that can conflict, judged before anything runs.

The DAGs are parsed by Airflow's own DagBag and rendered by the Task SDK; the tables are real Delta logs
(written here, read by the engine). The cases (``check_dags/delta_occ_check_cases.py``): a pair that
conflicts with nothing between, the same pair behind a dependency, in a conflict pool and in an Airflow
pool of one slot, a disjoint pair, mapped instances, two runs at once, pairs across DAGs, and what
cannot be judged. The e2e DAGs' verdicts are compared with what Delta raised when they ran
(``CONFLICTING`` of ``test_pool_e2e.py``, and its naive run).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.dagcheck import check_dags
from airflow_delta_occ.dagcheck.report import CheckReport, ConflictingPair, Separation

from .conftest import AIRFLOW, REPO
from .test_pool_e2e import CONFLICTING, WRITERS, _write_table

HERE = Path(__file__).resolve().parent
CASES = HERE / "check_dags" / "delta_occ_check_cases.py"
E2E_DAGS = HERE / "dags" / "delta_occ_pool_e2e.py"
DAY = "2024-03-01"


def _field(name: str, kind: str) -> dict[str, Any]:
    return {"name": name, "type": kind, "nullable": True, "metadata": {}}


def _write_log(path: Path, fields: list[dict[str, Any]], partitions: list[str],
               files: list[dict[str, str]]) -> None:
    """A Delta table's first commit (the engine reads only the log: the data files are never opened)."""
    (path / "_delta_log").mkdir(parents=True)
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": now, "operation": "CREATE TABLE"}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": {"id": f"check-{path.name}", "format": {"provider": "parquet", "options": {}},
                      "schemaString": json.dumps({"type": "struct", "fields": fields}),
                      "partitionColumns": partitions, "configuration": {}, "createdTime": now}}]
    for i, values in enumerate(files):
        folder = "/".join(f"{k}={v}" for k, v in values.items())
        actions.append({"add": {"path": f"{folder}/part-{i}.parquet".lstrip("/"), "partitionValues": values,
                                "size": 1000, "modificationTime": now, "dataChange": True}})
    (path / "_delta_log" / f"{0:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory, airflow_env: dict[str, str]) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("check")
    _write_log(root / "sales", [_field("id", "long"), _field("amount", "double"), _field("date", "date"),
                                _field("country", "string")], ["date", "country"],
               [{"date": d, "country": c} for d in ("2024-03-01", "2024-03-02", "2024-03-03")
                for c in ("DE", "FR", "IT")])
    _write_log(root / "events", [_field("id", "long")], [], [{}, {}])
    pools = root / "pools.toml"
    pools.write_text(f'[pools.check]\ntables = ["{(root / "sales").as_uri()}"]\n')
    e2e = root / "e2e"
    for name in ("pooled", "naive", "kill"):
        _write_table(e2e / name)
    (e2e / "pools.toml").write_text(f'[pools.e2e]\ntables = ["{(e2e / "pooled").as_uri()}"]\n'
                                    f'[pools.e2e_kill]\ntables = ["{(e2e / "kill").as_uri()}"]\n')
    # Only while the DAGs are parsed (their pooled literal tables are checked then): the session's airflow_env,
    # built from os.environ when first asked for, must not take this module's pool file (CI: the example DAGs
    # then failed to import in test_example_dags.py).
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DELTA_OCC_CHECK_ROOT", str(root))
        patch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(pools))
        from airflow.dag_processing.dagbag import DagBag

        bag = DagBag(dag_folder=str(CASES))
    assert bag.import_errors == {}
    yield {"root": root, "pools": pools, "dags": bag.dags, "e2e": e2e}


def _check(lake: dict[str, Any], *dag_ids: str, **kwargs: Any) -> CheckReport:
    from airflow_delta_occ.pools.config import load_pool_config

    kwargs.setdefault("pools", load_pool_config(lake["pools"]))
    return check_dags([lake["dags"][d] for d in dag_ids], date=_date(DAY), **kwargs)


def _date(text: str) -> Any:
    import datetime as dt

    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def _names(pair: ConflictingPair) -> frozenset[str]:
    return frozenset((f"{pair.a.task_id}[{pair.a.map_index}]@{pair.a.run}",
                      f"{pair.b.task_id}[{pair.b.map_index}]@{pair.b.run}"))


def _tasks(pair: ConflictingPair) -> frozenset[str]:
    return frozenset((pair.a.task_id, pair.b.task_id))


# -- the four cases of the issue ------------------------------------------------------------------
def test_a_pair_that_conflicts_with_nothing_between_is_unprotected_and_fails_the_gate(lake: dict[str, Any]) -> None:
    report = _check(lake, "check_unprotected")
    assert report.judged == 3 and report.unknown == ()
    assert [_tasks(p) for p in report.conflicts] == [frozenset({"fix_de", "purge_de"})]
    (pair,) = report.unprotected
    # Either commit order fails the later one: each rewrites files of the other's partition.
    assert {(o.winner.task_id, o.loser.task_id) for o in pair.outcomes} == {("fix_de", "purge_de"),
                                                                            ("purge_de", "fix_de")}
    assert all(o.exact and o.exception for o in pair.outcomes)
    assert "partition [date=2024-03-01, country=DE]" in pair.outcomes[0].reason
    assert pair.advice is not None and "conflict_pool='check'" in pair.advice and "fix_de >> purge_de" in pair.advice
    assert report.disjoint == 2          # fix_fr with each: another partition
    assert report.exit_code() == 1


def test_the_same_pair_behind_a_dependency_is_kept_apart(lake: dict[str, Any]) -> None:
    report = _check(lake, "check_dependency")
    (pair,) = report.conflicts
    assert pair.kept_apart is not None and pair.kept_apart.by is Separation.DEPENDENCY
    assert pair.kept_apart.detail == "fix_de is upstream of purge_de"
    assert report.unprotected == () and report.exit_code() == 0


def test_a_dependency_on_a_task_that_runs_always_keeps_nothing_apart(lake: dict[str, Any]) -> None:
    (pair,) = _check(lake, "check_always").conflicts
    assert not pair.protected


def test_a_task_that_starts_after_one_of_its_parents_is_not_kept_apart_from_the_others(
        lake: dict[str, Any]) -> None:
    """Review: with ``one_success`` purge_de may start once fix_fr is done, while fix_de still writes DE."""
    (pair,) = _check(lake, "check_one_success").conflicts
    assert _tasks(pair) == {"fix_de", "purge_de"} and not pair.protected


def test_two_manual_runs_of_a_dag_without_a_schedule_meet(lake: dict[str, Any]) -> None:
    report = _check(lake, "check_manual_runs")
    assert report.runs == (DAY, f"{DAY}#2")
    (pair,) = report.conflicts
    assert pair.a.task_id == pair.b.task_id == "compact_de" and pair.a.run != pair.b.run and not pair.protected
    assert "max_active_tis_per_dag=1 on compact_de" in (pair.advice or "")


def test_the_same_pair_in_a_conflict_pool_is_kept_apart(lake: dict[str, Any]) -> None:
    report = _check(lake, "check_pooled")
    (pair,) = report.conflicts
    assert pair.kept_apart is not None and pair.kept_apart.by is Separation.CONFLICT_POOL
    assert report.exit_code() == 0


def test_an_airflow_pool_keeps_them_apart_only_with_one_slot(lake: dict[str, Any]) -> None:
    one = _check(lake, "check_airflow_pool", pool_slots={"single": 1})
    two = _check(lake, "check_airflow_pool", pool_slots={"single": 2})
    unread = _check(lake, "check_airflow_pool")
    assert one.conflicts[0].kept_apart is not None and one.conflicts[0].kept_apart.by is Separation.AIRFLOW_POOL
    assert two.exit_code() == 1 and unread.exit_code() == 1   # slots not known: not counted as one


def test_mapped_instances_are_paired_with_their_siblings(lake: dict[str, Any]) -> None:
    report = _check(lake, "check_mapped")
    assert report.judged == 9 and report.unknown == ()
    by_task: dict[str, list[ConflictingPair]] = {}
    for pair in report.conflicts:
        assert pair.a.task_id == pair.b.task_id, pair    # no pair across the three tasks (other partitions)
        by_task.setdefault(pair.a.task_id, []).append(pair)
    assert "by_day" not in by_task                      # three days: disjoint
    assert len(by_task["same_day"]) == 3 and not any(p.protected for p in by_task["same_day"])
    assert "max_active_tis_per_dagrun=1" in (by_task["same_day"][0].advice or "")
    limited = by_task["same_day_limited"]
    assert len(limited) == 3 and all(p.kept_apart and p.kept_apart.by is Separation.TASK_LIMIT for p in limited)


def test_scheduled_runs_meet_only_where_the_days_do_not_confine_them(lake: dict[str, Any]) -> None:
    """Three consecutive runs: max_active_runs=1 does not keep them apart (a backfill's runs count against the
    backfill's own limit), so the whole-table OPTIMIZEs of any two of them meet; `day` never does."""
    report = _check(lake, "check_daily")
    assert report.runs == ("2024-03-01", "2024-03-02", "2024-03-03") and report.judged == 6
    assert {frozenset((p.a.run, p.b.run)) for p in report.conflicts} == {
        frozenset(r) for r in (("2024-03-01", "2024-03-02"), ("2024-03-01", "2024-03-03"),
                               ("2024-03-02", "2024-03-03"))}
    assert all(_tasks(p) == {"compact_events"} and not p.protected for p in report.conflicts)
    # Review: depends_on_past does not keep a backfill's first run (or a manual one) from the run before.
    assert len(_check(lake, "check_daily_in_order").unprotected) == 3
    one_at_a_time = _check(lake, "check_daily_one_at_a_time")
    assert len(one_at_a_time.conflicts) == 3 and all(
        p.kept_apart is not None and p.kept_apart.by is Separation.TASK_LIMIT for p in one_at_a_time.conflicts)
    assert _check(lake, "check_daily", runs=2).runs == ("2024-03-01", "2024-03-02")


def test_several_runs_a_day_are_told_apart(lake: dict[str, Any]) -> None:
    """Review: two runs of one day had one label and were judged as one run (a dependency kept them apart)."""
    report = _check(lake, "check_twice_a_day")
    assert report.runs == ("2024-03-01T00:00:00+00:00", "2024-03-01T12:00:00+00:00", "2024-03-02T00:00:00+00:00")
    assert len(report.unprotected) == 3


def test_a_task_that_may_start_when_a_parent_failed_is_not_kept_apart_from_the_parents_parents(
        lake: dict[str, Any]) -> None:
    """Review: ``cleanup`` (all_done) starts once purge_de is done, and purge_de is upstream_failed at once when
    validate fails, while fix_de may still write DE."""
    report = _check(lake, "check_failed_parent")
    by_pair = {_tasks(p): p for p in report.conflicts}
    assert not by_pair[frozenset({"fix_de", "cleanup"})].protected
    assert by_pair[frozenset({"purge_de", "cleanup"})].protected    # a direct parent has ended
    assert by_pair[frozenset({"fix_de", "purge_de"})].protected     # all_success: fix_de succeeded first


def test_tasks_in_different_dags_on_one_table_are_paired(lake: dict[str, Any]) -> None:
    report = _check(lake, "check_daily", "check_other_dag")
    across = [p for p in report.conflicts if p.a.dag_id != p.b.dag_id]
    assert {_tasks(p) for p in across} == {frozenset({"compact_events", "trim_events"})}
    assert len(across) == 3 and not any(p.protected for p in across)   # with each run's compaction


def test_what_cannot_be_judged_is_listed_as_unknown_never_as_safe(lake: dict[str, Any]) -> None:
    report = _check(lake, "check_unknowns")
    reasons = {u.task.task_id: u.reason for u in report.unknown}
    assert set(reasons) == {"from_upstream", "by_name", "missing_table", "needs_a_variable",
                            "variable_in_a_macro", "outside_its_pool"}, reasons
    assert "another task's output" in reasons["from_upstream"]
    assert "catalog name" in reasons["by_name"]
    assert "TableNotFoundError" in reasons["missing_table"]
    # Review: a Variable read with a default rendered the default, so the verdict depended on the CLI's host;
    # likewise through a user macro that calls Variable.get.
    for task in ("needs_a_variable", "variable_in_a_macro"):
        assert "did not render" in reasons[task] and "a Variable" in reasons[task], reasons[task]
    assert "PoolConfigError" in reasons["outside_its_pool"] and "not in conflict pool" in reasons["outside_its_pool"]
    assert report.judged == 0 and report.conflicts == () and report.disjoint == 0
    assert report.exit_code() == 0 and report.exit_code(fail_on_unknown=True) == 1
    # A pooled task whose pool cannot be read would fail when it runs: not judged as kept apart.
    unpooled = _check(lake, "check_pooled", pools=None)
    assert unpooled.conflicts == () and {u.task.task_id for u in unpooled.unknown} == {"fix_de", "purge_de"}


def test_mapped_instances_beyond_the_limit_are_not_judged_and_say_so(lake: dict[str, Any]) -> None:
    report = _check(lake, "check_mapped", max_mapped=2)
    cut = {u.task.task_id: u.reason for u in report.unknown}
    assert set(cut) == {"by_day", "same_day", "same_day_limited"}
    assert cut["by_day"] == "map indexes 2 to 2 of its 3 were not judged (--max-mapped)"
    assert report.exit_code(fail_on_unknown=True) == 1


# -- the e2e DAGs: what the check says against what Delta raised ------------------------------------
def test_the_e2e_dags_verdicts_are_the_pairs_delta_failed(lake: dict[str, Any]) -> None:
    """``test_pool_e2e.py``'s CONFLICTING pairs (the ones its naive run saw Delta fail, and its pooled run kept
    apart) among the provider's own writers are exactly the pairs the check reports; the other writers, which
    the pooled run saw write side by side, are disjoint."""
    from airflow.dag_processing.dagbag import DagBag

    from airflow_delta_occ.pools.config import load_pool_config

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DELTA_OCC_E2E_ROOT", str(lake["e2e"]))
        patch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(lake["e2e"] / "pools.toml"))
        bag = DagBag(dag_folder=str(E2E_DAGS))
    pools = load_pool_config(lake["e2e"] / "pools.toml")
    delta_pairs = {p for p in CONFLICTING if "set_properties" not in p}   # a plain task: not the check's
    for dag_id, protected in (("delta_occ_e2e_naive", False), ("delta_occ_e2e_pooled", True)):
        report = check_dags([bag.dags[dag_id]], date=_date(DAY), pools=pools)
        assert report.runs == (DAY, f"{DAY}#2")     # no schedule: two manual runs may overlap
        assert report.judged == 2 * (len(WRITERS) - 1) and report.unknown == ()
        within = [p for p in report.conflicts if p.a.run == p.b.run == DAY]   # the run the e2e made
        assert {_tasks(p) for p in within} == delta_pairs
        assert all(p.protected == protected for p in report.conflicts)
        assert report.exit_code() == (0 if protected else 1)


# -- the command ----------------------------------------------------------------------------------
def _cli(airflow_env: dict[str, str], lake: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**airflow_env, "DELTA_OCC_CHECK_ROOT": str(lake["root"]),
           "AIRFLOW__DELTA_OCC__POOL_FILE": str(lake["pools"])}
    return subprocess.run([*AIRFLOW, "delta-occ", "check", *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_the_command_gates_on_unprotected_pairs_and_prints_json(airflow_env: dict[str, str],
                                                                lake: dict[str, Any]) -> None:
    failing = _cli(airflow_env, lake, "check_unprotected", "-S", str(CASES), "--date", DAY, "-o", "json")
    assert failing.returncode == 1, failing.stderr[-2000:]
    found = json.loads(failing.stdout)
    assert found["unprotected"] == 1 and found["disjoint_pairs"] == 2
    (pair,) = found["conflicts"]
    assert {pair["a"]["task_id"], pair["b"]["task_id"]} == {"fix_de", "purge_de"} and pair["protected"] is False
    assert pair["exceptions"] and all(o["on_the_table_as_it_is"] for o in pair["outcomes"])
    passing = _cli(airflow_env, lake, "check_pooled", "-S", str(CASES), "--date", DAY)
    assert passing.returncode == 0, passing.stderr[-2000:]
    assert "kept apart by conflict_pool: both in conflict pool 'check'" in passing.stdout
    assert "CAN CONFLICT, NOTHING KEEPS THEM APART" not in passing.stdout


def test_the_command_reads_the_airflow_pools_of_the_metadata_database(airflow_env: dict[str, str],
                                                                     lake: dict[str, Any]) -> None:
    made = subprocess.run([*AIRFLOW, "pools", "set", "single", "1", "one at a time"], env=airflow_env,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    result = _cli(airflow_env, lake, "check_airflow_pool", "-S", str(CASES), "--date", DAY)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert "kept apart by airflow_pool: both in Airflow pool 'single', which has one slot" in result.stdout


def test_with_all_a_dag_file_that_does_not_import_is_not_judged(airflow_env: dict[str, str], lake: dict[str, Any],
                                                                 tmp_path: Path) -> None:
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "broken.py").write_text("from airflow.sdk import DAG\nraise RuntimeError('cannot reach the lake')\n")
    result = _cli(airflow_env, lake, "--all", "-S", str(folder), "--fail-on-unknown", "-o", "json")
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    (broken,) = json.loads(result.stdout)["unknown"]
    assert broken["task"]["dag_id"].endswith("broken.py>")
    assert broken["reason"] == "the DAG file did not import: RuntimeError: cannot reach the lake"


def test_with_all_an_empty_or_mistyped_folder_is_a_usage_error(airflow_env: dict[str, str], lake: dict[str, Any],
                                                                tmp_path: Path) -> None:
    result = _cli(airflow_env, lake, "--all", "-S", str(tmp_path / "no_such_folder"))
    assert result.returncode == 2 and "no DAG files under" in result.stderr, result.stderr[-2000:]


def test_what_a_dag_file_prints_does_not_spoil_the_json(airflow_env: dict[str, str], lake: dict[str, Any],
                                                        tmp_path: Path) -> None:
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "chatty.py").write_text(CASES.read_text().replace("from __future__ import annotations",
                                                                "from __future__ import annotations\nprint('hello')"))
    result = _cli(airflow_env, lake, "check_pooled", "-S", str(folder), "-o", "json")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["unprotected"] == 0 and "hello" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("no_such_dag",), "no DAG 'no_such_dag'"),
    (("check_pooled", "--date", "03/01/2024"), "--date: expected a date as YYYY-MM-DD"),
    (("check_pooled", "--all"), "give a DAG_ID or --all"),
    (("check_pooled", "--max-mapped", "0"), "--max-mapped must be at least 1"),
    (("check_pooled", "--runs", "0"), "--runs must be at least 1"),
])
def test_the_command_refuses_bad_arguments_with_exit_2(airflow_env: dict[str, str], lake: dict[str, Any],
                                                       args: tuple[str, ...], message: str) -> None:
    result = _cli(airflow_env, lake, *args, "-S", str(CASES))
    assert result.returncode == 2 and message in result.stderr, (result.returncode, result.stderr[-2000:])
