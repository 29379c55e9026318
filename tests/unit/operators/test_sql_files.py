"""SQL text fields from ``.sql`` files (rendered through a real DAG's template search path), and the
renderers the UI shows them with."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.sdk import DAG

from airflow_delta_occ.exceptions import JobSpecError
from airflow_delta_occ.operators.delta import DeltaMergeOperator, DeltaUpdateOperator


def _dag(folder: Path) -> DAG:
    return DAG("sql_files", schedule=None, template_searchpath=[str(folder)], params={"n": 3})


def test_sql_fields_are_read_from_files_and_rendered(tmp_path: Path) -> None:
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "on.sql").write_text("t.id = s.id AND t.v < {{ params.n }}\n")
    (tmp_path / "sql" / "src.sql").write_text("SELECT id, v FROM landing WHERE day = '{{ ds }}'")
    (tmp_path / "where.sql").write_text("id > {{ params.n }}")
    with _dag(tmp_path):
        merge = DeltaMergeOperator(task_id="m", table="/lake/t", merge_condition="sql/on.sql",
                                   source_query="sql/src.sql")
        # `s.sql` is column `sql` of the source: an expression, never a file.
        update = DeltaUpdateOperator(task_id="u", table="/lake/t", where="where.sql", set={"v": "s.sql"})
    context = {"params": {"n": 3}, "ds": "2024-01-01"}
    merge.render_template_fields(context)  # type: ignore[arg-type]
    update.render_template_fields(context)  # type: ignore[arg-type]
    assert merge.merge_condition.strip() == "t.id = s.id AND t.v < 3"
    assert merge.source_query == "SELECT id, v FROM landing WHERE day = '2024-01-01'"
    assert update.where == "id > 3" and update.set == {"v": "s.sql"}


def test_a_missing_sql_file_names_the_field_and_the_file(tmp_path: Path) -> None:
    with _dag(tmp_path):
        op = DeltaUpdateOperator(task_id="u", table="/lake/t", where="missing/where.sql", set={"v": "1"})
    with pytest.raises(JobSpecError, match=r"where: cannot read the SQL file 'missing/where\.sql'"):
        op.render_template_fields({"params": {}})  # type: ignore[arg-type]


def test_an_expression_ending_in_sql_is_still_checked_at_parse_time() -> None:
    with pytest.raises(JobSpecError):
        DeltaUpdateOperator(task_id="u", table="/lake/t", where="id > AND s.sql", set={"v": "1"})


def test_sql_fields_render_as_sql_in_the_ui() -> None:
    renderers = DeltaMergeOperator.template_fields_renderers
    assert renderers["merge_condition"] == renderers["where"] == renderers["source_query"] == "sql"
    assert renderers["partitions"] == renderers["clauses"] == renderers["set"] == "json"
