"""The example DAGs parse, and run end to end through Airflow with real Spark and delta-spark."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from airflow_delta_occ.engine import DeltaLog

from .conftest import AIRFLOW, REPO


def _json_output(text: str) -> object:
    """The JSON document a CLI printed (Airflow may print log lines to stdout before it)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(("[{", "[]", "{")) or line == "[":
            return json.loads("\n".join(lines[i:]))
    raise AssertionError(f"no JSON in CLI output: {text[-2000:]}")


def test_example_dags_parse_without_errors(airflow_env: dict[str, str]) -> None:
    out = subprocess.run([*AIRFLOW, "dags", "list-import-errors", "--local", "--output", "json"], env=airflow_env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert _json_output(out.stdout) == []
    listed = subprocess.run([*AIRFLOW, "dags", "list", "--local", "--output", "json"], env=airflow_env,
                            capture_output=True, text=True, timeout=300)
    names = {d["dag_id"] for d in _json_output(listed.stdout)}  # type: ignore[attr-defined]
    expected = {p.stem for p in (REPO / "dags_examples").glob("*.py")}
    assert expected <= names


def test_concurrent_merges_dag_runs(airflow_env: dict[str, str], tmp_path: Path) -> None:
    """The example DAG under ``airflow dags test``, with the OpenLineage provider recording its events
    to a file (and handing the parent job to the Spark jobs)."""
    events_file = tmp_path / "openlineage.jsonl"
    env = {**airflow_env, "DELTA_OCC_DEMO_ROOT": str(tmp_path),
           "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events_file),
                                                          "append": True}),
           "AIRFLOW__OPENLINEAGE__NAMESPACE": "delta-occ-tests",
           "AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO": "True"}
    run = subprocess.run([*AIRFLOW, "dags", "test", "delta_concurrent_merges", "2024-01-01"], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "state=success" in run.stdout + run.stderr

    log = DeltaLog.for_table(str(tmp_path / "sales"))
    history = [c.commit_info for c in reversed(log.history()) if c.commit_info is not None]
    operations = [i.operation for i in history]
    # OPTIMIZE commits only when a partition has several files to compact.
    assert operations[:5] == ["CREATE TABLE", "MERGE", "MERGE", "MERGE", "MERGE"]
    assert operations[5:] in ([], ["OPTIMIZE"])
    tags = [json.loads(i.user_metadata or "{}").get("airflow", {}) for i in history if i.operation == "MERGE"]
    assert sorted(t["map_index"] for t in tags) == [0, 1, 2, 3]
    assert {t["task_id"] for t in tags} == {"merge_country"}
    snapshot = log.snapshot()
    assert {str(snapshot.partition_values(f)["country"]) for f in snapshot.files()} == {"DE", "FR", "IT", "ES"}
    # `dags test DAG 2024-01-01` gives the run that logical date (its run_after is "now"): the DAG writes that day.
    assert {str(snapshot.partition_values(f)["date"]) for f in snapshot.files()} == {"2024-01-01"}
    assert snapshot.num_files >= 4
    _assert_lineage(events_file, tmp_path / "sales", log, run.stdout + run.stderr)


def _assert_lineage(events_file: Path, table: Path, log: DeltaLog, output: str) -> None:
    """Each MERGE task's COMPLETE event names the table as its output, with the schema and the version
    its own commit has in the Delta log; its run is the parent the task handed to its Spark job."""
    import re

    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    merges = [e for e in events if e.get("eventType") == "COMPLETE"
              and e["job"]["name"] == "delta_concurrent_merges.merge_country"]
    assert len(merges) == 4, [(e.get("eventType"), e["job"]["name"]) for e in events]
    merge_versions = {c.version for c in log.history() if c.commit_info and c.commit_info.operation == "MERGE"}
    columns = [f.name for f in log.snapshot().schema.fields]
    versions = set()
    for event in merges:
        [output_dataset] = event["outputs"]
        assert (output_dataset["namespace"], output_dataset["name"]) == ("file", str(table))
        assert [f["name"] for f in output_dataset["facets"]["schema"]["fields"]] == columns
        versions.add(int(output_dataset["facets"]["version"]["datasetVersion"]))
    assert versions == merge_versions
    parents = set(re.findall(r"OpenLineage: the Spark job runs as a child of run ([0-9a-f-]{36})", output))
    # Every MERGE task's run is the parent its Spark job got; every parent handed over is a Delta task's run
    # (the DAG's OPTIMIZE hands over its own).
    assert {e["run"]["runId"] for e in merges} <= parents, (parents, output[-3000:])
    assert parents <= {e["run"]["runId"] for e in events if e.get("eventType") == "COMPLETE"}


def test_provider_is_registered_with_its_config_and_connection_type(airflow_env: dict[str, str]) -> None:
    providers = subprocess.run([*AIRFLOW, "providers", "list", "--output", "json"], env=airflow_env,
                               capture_output=True, text=True, timeout=300)
    names = {p["package_name"] for p in _json_output(providers.stdout)}  # type: ignore[attr-defined]
    assert "airflow-delta-occ" in names
    mode = subprocess.run([*AIRFLOW, "config", "get-value", "delta_occ", "default_mode"], env=airflow_env,
                          capture_output=True, text=True, timeout=300)
    assert mode.stdout.strip().splitlines()[-1] == "embedded"
    hooks = subprocess.run([*AIRFLOW, "providers", "hooks", "--output", "json"], env=airflow_env,
                           capture_output=True, text=True, timeout=300)
    registered = {h["connection_type"]: h["class"] for h in _json_output(hooks.stdout)}  # type: ignore[attr-defined]
    assert registered.get("delta_occ") == "airflow_delta_occ.hooks.delta.DeltaSparkHook"


def test_merges_run_concurrently_under_the_scheduler(tmp_path: Path) -> None:
    """The demo's path: a real scheduler with the LocalExecutor runs the mapped MERGEs side by side."""
    from airflow_delta_occ.demo import run_with_scheduler

    result = run_with_scheduler(tmp_path, dags_folder=REPO / "dags_examples", timeout=1200)
    assert result["state"] == "success", f"see {tmp_path / 'airflow-standalone.log'}"
    merges = [t for t in result["tasks"] if t["task_id"] == "merge_country"]
    assert len(merges) == 4 and all(t["state"] == "success" for t in merges)
    latest_start = max(t["start_date"] for t in merges)
    earliest_end = min(t["end_date"] for t in merges)
    assert latest_start < earliest_end, "the scheduler did not run the MERGE tasks at the same time"

    log = DeltaLog.for_table(result["table"])
    commits = [c for c in reversed(log.history()) if c.commit_info and c.commit_info.operation == "MERGE"]
    assert [c.version for c in commits] == [1, 2, 3, 4]
    tags = [json.loads(c.commit_info.user_metadata or "{}")["airflow"] for c in commits]  # type: ignore[union-attr]
    assert sorted(t["map_index"] for t in tags) == [0, 1, 2, 3]
    # Triggered without a logical date: the DAG writes the day of the run's run_after, one day for all tasks.
    snapshot = log.snapshot()
    assert {str(snapshot.partition_values(f)["date"]) for f in snapshot.files()} == {result["run_after"][:10]}


def test_demo_refuses_a_dags_folder_without_the_example_dag(tmp_path: Path) -> None:
    from airflow_delta_occ.demo import check_dags_folder

    assert check_dags_folder(REPO / "dags_examples") == (REPO / "dags_examples").resolve()
    with pytest.raises(FileNotFoundError, match=r"does not hold delta_concurrent_merges\.py"):
        check_dags_folder(tmp_path)
