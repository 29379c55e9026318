"""What users of the official Spark and Databricks providers expect of an operator (issue #24): the
run-time settings are templated (``SparkSubmitOperator`` templates its ``conf``), the parse-time ones
say why they are not, and the retries a Delta task gets are stated."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_delta_occ.exceptions import JobSpecError
from airflow_delta_occ.jobs.spec import SourceRef
from airflow_delta_occ.operators.delta import (
    DeltaAppendOperator,
    DeltaMergeOperator,
    DeltaOverwritePartitionsOperator,
    DeltaUpdateOperator,
)


def _merge(**kwargs: Any) -> DeltaMergeOperator:
    return DeltaMergeOperator(task_id="m", table=kwargs.pop("table", "/lake/t"), merge_condition="t.id = s.id",
                              source=kwargs.pop("source", "/lake/src"), **kwargs)


def test_spark_conf_connection_and_source_format_are_rendered(tmp_path: Path) -> None:
    with DAG("conventions", schedule=None):
        merge = _merge(spark_conf={"spark.sql.shuffle.partitions": "{{ params.n }}"},
                       delta_conn_id="delta_{{ params.env }}", source_format="{{ params.fmt }}")
    merge.render_template_fields({"params": {"n": 4, "env": "prod", "fmt": "parquet"}})  # type: ignore[arg-type]
    assert merge.spark_conf == {"spark.sql.shuffle.partitions": "4"}
    assert (merge.delta_conn_id, merge.source_format) == ("delta_prod", "parquet")
    for operator in (DeltaMergeOperator, DeltaAppendOperator, DeltaOverwritePartitionsOperator):
        assert "source_format" in operator.template_fields, operator
    assert {"spark_conf", "delta_conn_id"} <= set(DeltaUpdateOperator.template_fields)
    assert DeltaMergeOperator.template_fields_renderers["spark_conf"] == "json"


@pytest.mark.parametrize(("field", "value"), [
    ("conflict_pool", "{{ params.pool }}"),
    ("conflict_policies", {"ConcurrentAppendException": {"max_attempts": "{{ params.n }}"}}),
])
def test_a_template_in_a_parse_time_field_says_why_it_is_not_rendered(field: str, value: Any) -> None:
    with pytest.raises(JobSpecError, match=rf"{field} is not templated: .*when the DAG is parsed"):
        _merge(**{field: value})


@pytest.mark.parametrize("value", ["", "delta; DROP", "json`", "../x", 3, None])
def test_a_source_format_that_names_no_data_source_is_refused(value: Any) -> None:
    with pytest.raises(JobSpecError, match="source_format"):
        _merge(source_format=value)
    with pytest.raises(JobSpecError, match="format"):
        SourceRef(path="/lake/src", format=value)   # a rendered value is checked when the job is built


@pytest.mark.parametrize("value", ["delta", "parquet", "json", "org.apache.spark.sql.avro.AvroFileFormat"])
def test_data_source_names_and_classes_are_accepted(value: str) -> None:
    assert _merge(source_format=value).source_format == value
    assert SourceRef(path="/lake/src", format=value).format == value


def test_spark_conf_must_be_a_mapping_of_names() -> None:
    with pytest.raises(JobSpecError, match="spark_conf must be a mapping"):
        _merge(spark_conf="spark.x=1")
    with pytest.raises(JobSpecError, match="spark_conf"):
        _merge(spark_conf={3: "1"})


def test_the_provider_default_retries_are_documented_where_authors_look() -> None:
    doc = DeltaMergeOperator.__mro__[1].__doc__ or ""
    assert ":param retries:" in doc and "[delta_occ] task_retries" in doc


def test_conflict_policies_nested_too_deep_is_a_typed_error() -> None:
    deep: Any = {"max_attempts": 3}
    for _ in range(5000):
        deep = {"x": deep}
    with pytest.raises(JobSpecError, match="conflict_policies"):
        _merge(conflict_policies={"ConcurrentAppendException": deep})


def test_jinja_statements_count_as_templates_at_parse_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``{% ... %}`` and ``{# ... #}`` are templates as much as ``{{ ... }}``: checked once rendered."""
    pools = tmp_path / "pools.toml"
    pools.write_text('[pools.other]\ntables = ["s3://lake/other/**"]\n')
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(pools))
    statement = "{% if params.x %}s3://lake/other/t{% else %}s3://lake/other/u{% endif %}"
    assert _merge(table=statement, conflict_pool="other").table == statement
    assert _merge(source_format="{% if params.csv %}csv{% else %}parquet{% endif %}").source_format.startswith("{%")
    assert _merge(source_format="parquet{# the landing zone's #}").source_format.endswith("#}")


def test_a_mapped_table_is_checked_when_it_is_known(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``partial(table=<an XComArg>)`` is resolved at run time: nothing to check when the DAG is parsed."""
    from airflow.sdk import DAG, task

    pools = tmp_path / "pools.toml"
    pools.write_text('[pools.other]\ntables = ["s3://lake/other/**"]\n')
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(pools))

    @task
    def where() -> str:
        return "s3://lake/other/t"

    with DAG("mapped_tables", schedule=None):
        DeltaUpdateOperator.partial(task_id="u", table=where(), conflict_pool="other").expand(
            set=[{"name": "'x'"}])


def test_sparks_own_placeholders_in_spark_conf_say_how_to_write_them() -> None:
    """Spark fills ``{{APP_ID}}`` itself; Jinja renders spark_conf first and would fail on it, undefined."""
    with pytest.raises(JobSpecError, match=r"\{\{APP_ID\}\} is Spark's own placeholder.*\{% raw %\}"):
        _merge(spark_conf={"spark.executor.extraJavaOptions": "-Xlog:gc:/tmp/gc-{{APP_ID}}.log"})
    with DAG("raw_conf", schedule=None):
        merge = _merge(spark_conf={"spark.executor.extraJavaOptions": "-Xlog:gc:/tmp/gc-{{ '{{APP_ID}}' }}.log"})
    merge.render_template_fields({"params": {}})  # type: ignore[arg-type]
    assert merge.spark_conf == {"spark.executor.extraJavaOptions": "-Xlog:gc:/tmp/gc-{{APP_ID}}.log"}


def test_a_secret_spark_conf_is_masked_once_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow.sdk.log

    masked: list[str] = []
    monkeypatch.setattr(airflow.sdk.log, "mask_secret", lambda value, name=None: masked.append(value))
    with DAG("secret_conf", schedule=None):
        merge = _merge(spark_conf={"spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net": "{{ params.key }}",
                                   "spark.sql.shuffle.partitions": "4"})
    merge.render_template_fields({"params": {"key": "s3cr3t=="}})  # type: ignore[arg-type]
    assert masked == ["s3cr3t=="]


def test_a_raw_block_keeps_sparks_placeholder() -> None:
    with DAG("raw_block", schedule=None):
        merge = _merge(spark_conf={"spark.executor.extraJavaOptions": "{% raw %}-Dapp={{APP_ID}}{% endraw %}"})
    merge.render_template_fields({"params": {}})  # type: ignore[arg-type]
    assert merge.spark_conf == {"spark.executor.extraJavaOptions": "-Dapp={{APP_ID}}"}


@pytest.mark.parametrize("key", ["spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion",
                                 "spark.databricks.delta.commitInfo.userMetadata"])
def test_a_spark_conf_that_names_the_commits_is_refused_when_the_dag_is_parsed(key: str) -> None:
    """The runner names each commit after the task run (userMetadata; txnAppId/txnVersion when idempotent). A task's
    own txnAppId would make Delta skip a write the provider believes it makes (early abort would judge a commit
    that never comes), and its own userMetadata would be replaced without a word."""
    with pytest.raises(JobSpecError, match=rf"spark_conf sets {re.escape(key)}: the provider names each commit"):
        _merge(spark_conf={key: "nightly", "spark.sql.shuffle.partitions": "4"})
    _merge(spark_conf={"spark.databricks.delta.write.txnVersion.autoReset.enabled": "true"})  # not an identity
