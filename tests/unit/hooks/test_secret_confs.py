"""Which Spark confs are secrets: kept off every command line (embedded and spark-submit) and hidden by
Spark's redaction in its UI and event logs."""

from __future__ import annotations

import re

import pytest

from airflow_delta_occ.hooks.delta import DeltaSparkHook
from airflow_delta_occ.spark.storage import REDACTION_CONF, REDACTION_REGEX, is_secret_conf, split_secret_confs

# What the OpenLineage provider's inject_transport_information_into_spark_properties writes for an
# HTTP transport with an API key and custom headers, alone and nested in a composite transport.
OPENLINEAGE_SECRETS = [
    "spark.openlineage.transport.auth.apiKey",
    "spark.openlineage.transport.auth.type",
    "spark.openlineage.transport.headers.Authorization",
    "spark.openlineage.transport.headers.X-Custom-Key",
    "spark.openlineage.transport.transports.backend.auth.apiKey",
    "spark.openlineage.transport.transports.backend.headers.Authorization",
]
NOT_SECRETS = [
    "spark.openlineage.transport.url",
    "spark.openlineage.transport.endpoint",
    "spark.openlineage.transport.type",
    "spark.openlineage.parentJobName",
    "spark.openlineage.parentRunId",
    "spark.hadoop.fs.s3a.endpoint",
    "spark.app.name",
    "spark.sql.shuffle.partitions",
]


@pytest.mark.parametrize("key", [
    *OPENLINEAGE_SECRETS,
    "spark.hadoop.fs.s3a.secret.key",
    "spark.hadoop.fs.s3a.session.token",
    "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net",
    "spark.hadoop.fs.azure.sas.fixed.token.acct.dfs.core.windows.net",
    "spark.hadoop.fs.azure.account.oauth2.client.secret.acct.dfs.core.windows.net",
])
def test_secret_keys_are_secret_and_redacted(key: str) -> None:
    assert is_secret_conf(key)
    # Spark applies the same pattern (java.util.regex find) to hide the value in its UI and event logs.
    assert re.search(REDACTION_REGEX, key)


@pytest.mark.parametrize("key", NOT_SECRETS)
def test_ordinary_keys_are_not_secret(key: str) -> None:
    assert not is_secret_conf(key)


def test_split_secret_confs_keeps_order_and_values() -> None:
    conf = {"spark.app.name": "a", "spark.openlineage.transport.headers.Authorization": "Bearer x",
            "spark.hadoop.fs.s3a.secret.key": "s"}
    public, secrets = split_secret_confs(conf)
    assert public == {"spark.app.name": "a"}
    assert secrets == {"spark.openlineage.transport.headers.Authorization": "Bearer x",
                       "spark.hadoop.fs.s3a.secret.key": "s"}


def test_a_job_with_an_openlineage_header_gets_the_widened_redaction_pattern() -> None:
    """Spark's default pattern misses an ``Authorization`` header: the job's confs widen it so the
    header's value is hidden in the Spark UI and event log; a pattern of the user's own wins."""
    hook = DeltaSparkHook(None, mode="spark-submit",
                          spark_conf={"spark.openlineage.transport.headers.Authorization": "Bearer t0k"})
    assert hook._conf_with_storage({})[REDACTION_CONF] == REDACTION_REGEX
    own = DeltaSparkHook(None, mode="spark-submit",
                         spark_conf={"spark.openlineage.transport.auth.apiKey": "k", REDACTION_CONF: "(?i)mine|key"})
    assert own._conf_with_storage({})[REDACTION_CONF] == "(?i)mine|key"
    plain = DeltaSparkHook(None, mode="spark-submit", spark_conf={"spark.sql.shuffle.partitions": "3"})
    assert REDACTION_CONF not in plain._conf_with_storage({})
