"""Storage connections -> typed credentials -> the Hadoop settings the Spark job gets, and the S3 LogStore check."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_delta_occ.engine.object_store import AzureCredentials, GcsCredentials, S3Credentials
from airflow_delta_occ.exceptions import ProviderConfigError, StorageConnectionError, UnsafeLogStoreError
from airflow_delta_occ.hooks.delta import DeltaSparkHook
from airflow_delta_occ.hooks.storage import credentials_for, credentials_from_fields, storage_credentials
from airflow_delta_occ.spark.storage import (
    MULTI_DRIVER_LOG_STORE,
    check_s3_commits,
    hadoop_version,
    storage_settings,
    unsafe_s3_commit,
)


def _conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


def test_aws_connection_gives_keys_endpoint_and_path_style(monkeypatch: pytest.MonkeyPatch) -> None:
    _conn(monkeypatch, "lake_s3", conn_type="aws", login="AKIA", password="SECRET",
          extra={"region_name": "eu-west-1", "endpoint_url": "http://127.0.0.1:9000"})
    creds = storage_credentials("lake_s3")
    assert creds == S3Credentials(access_key="AKIA", secret_key="SECRET", region="eu-west-1",
                                  endpoint="http://127.0.0.1:9000", path_style=True)


def test_aws_connection_as_the_amazon_provider_nests_it() -> None:
    creds = credentials_from_fields("aws", login=None, password=None, host=None, extra={
        "service_config": {"s3": {"endpoint_url": "https://s3.internal"}},
        "config_kwargs": {"s3": {"addressing_style": "virtual"}}, "aws_session_token": None})
    assert creds == S3Credentials(endpoint="https://s3.internal", path_style=False)


@pytest.mark.parametrize(("extra", "message"), [
    ({"role_arn": "arn:aws:iam::1:role/x"}, "role_arn"),
    ({"config_kwargs": {"s3": {"addressing_style": "sideways"}}}, "addressing_style"),
    ({"region_name": 5}, "must be text"),
    ({"endpoint_url": "127.0.0.1:9000"}, "http\\(s\\) URL"),
])
def test_unusable_aws_settings_are_refused(monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any],
                                           message: str) -> None:
    _conn(monkeypatch, "bad_s3", conn_type="aws", login="AKIA", password="SECRET", extra=extra)
    with pytest.raises(StorageConnectionError, match=f"'bad_s3'.*{message}"):
        storage_credentials("bad_s3")


def test_the_s3_service_endpoint_wins_over_the_connection_wide_one() -> None:
    creds = credentials_from_fields("aws", login=None, password=None, host=None, extra={
        "endpoint_url": "https://sts.internal", "service_config": {"s3": {"endpoint_url": "https://s3.internal"}}})
    assert isinstance(creds, S3Credentials) and creds.endpoint == "https://s3.internal"


@pytest.mark.parametrize(("conn_type", "extra"), [
    ("wasb", {"connection_string": "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=k"}),
    ("wasb", {"shared_access_key": "k"}),
    ("adls", {"managed_identity_client_id": "mi"}),
    ("google_cloud_platform", {"keyfile_dict": '{"type": "service_account"}'}),
    ("google_cloud_platform", {"extra__google_cloud_platform__key_secret_name": "sa-key"}),
    ("google_cloud_platform", {"impersonation_chain": "sa@p.iam.gserviceaccount.com"}),
    ("aws", {"assume_role_method": "assume_role"}),
])
def test_ways_of_authenticating_the_job_would_not_use_are_refused(conn_type: str, extra: dict[str, Any]) -> None:
    # Ignoring them would read and write the table as the workers' default identity, without a word.
    with pytest.raises(StorageConnectionError, match="is not supported for Delta tables"):
        credentials_from_fields(conn_type, login="acct", password="x", host="acct", extra=extra)


def test_missing_or_foreign_connections_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(StorageConnectionError, match="'nope' does not exist"):
        storage_credentials("nope")
    _conn(monkeypatch, "pg", conn_type="postgres", host="db")
    with pytest.raises(StorageConnectionError, match="'postgres' holds no storage credentials"):
        storage_credentials("pg")


def test_azure_connections() -> None:
    assert credentials_from_fields("wasb", login="acct", password="KEY", host=None, extra={}) == \
        AzureCredentials(account_name="acct", account_key="KEY")
    assert credentials_from_fields("wasb", login="acct", password=None, host=None, extra={"sas_token": "sv=1"}) == \
        AzureCredentials(account_name="acct", sas_token="sv=1")
    assert credentials_from_fields("adls", login="cid", password="csecret", host="acct.dfs.core.windows.net",
                                   extra={"tenant_id": "tid"}) == \
        AzureCredentials(account_name="acct", tenant_id="tid", client_id="cid", client_secret="csecret")


def test_gcp_connection() -> None:
    assert credentials_from_fields("google_cloud_platform", login=None, password=None, host=None,
                                   extra={"key_path": "/keys/sa.json", "project": "p"}) == \
        GcsCredentials(keyfile_path="/keys/sa.json", project_id="p")


def test_credentials_apply_only_to_their_store(monkeypatch: pytest.MonkeyPatch) -> None:
    _conn(monkeypatch, "lake_s3", conn_type="aws", login="AKIA", password="SECRET")
    assert credentials_for("/lake/sales", "lake_s3") is None
    assert credentials_for("gs://b/sales", "lake_s3") is None
    assert credentials_for("s3a://b/sales", None) is None
    assert credentials_for("s3a://b/sales", "lake_s3") == S3Credentials(access_key="AKIA", secret_key="SECRET")


def test_s3_settings_for_the_s3a_connector() -> None:
    creds = S3Credentials(access_key="AKIA", secret_key="SECRET", region="eu-west-1",
                          endpoint="http://127.0.0.1:9000", path_style=True)
    settings = storage_settings(["s3://lake/sales", "/tmp/source"], creds)
    assert dict(settings.hadoop) == {
        "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "fs.s3a.access.key": "AKIA", "fs.s3a.secret.key": "SECRET",
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "fs.s3a.endpoint.region": "eu-west-1", "fs.s3a.endpoint": "http://127.0.0.1:9000",
        "fs.s3a.connection.ssl.enabled": "false", "fs.s3a.path.style.access": "true"}
    assert settings.packages == (f"org.apache.hadoop:hadoop-aws:{hadoop_version()}",)
    assert settings.spark_conf()["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert "SECRET" not in repr(settings)


def test_temporary_s3_credentials_use_the_temporary_provider() -> None:
    settings = storage_settings(["s3a://lake/t"], S3Credentials(access_key="a", secret_key="s", session_token="t"))
    assert settings.hadoop["fs.s3a.session.token"] == "t"
    assert settings.hadoop["fs.s3a.aws.credentials.provider"].endswith("TemporaryAWSCredentialsProvider")


def test_azure_settings_are_per_account() -> None:
    host = "acct.dfs.core.windows.net"
    key = storage_settings([f"abfss://data@{host}/t"], AzureCredentials(account_key="KEY"))
    assert dict(key.hadoop) == {f"fs.azure.account.key.{host}": "KEY"}
    assert key.packages == (f"org.apache.hadoop:hadoop-azure:{hadoop_version()}",)
    # Spark's default redaction pattern misses account keys: widened so the UI and event logs hide it.
    import re

    pattern = key.spark_conf()["spark.redaction.regex"]
    assert re.search(pattern, f"spark.hadoop.fs.azure.account.key.{host}")
    assert re.search(pattern, "spark.hadoop.fs.s3a.secret.key") and not re.search(pattern, "spark.app.name")
    assert "spark.redaction.regex" not in storage_settings(["s3a://b/t"], S3Credentials()).spark_conf()
    principal = storage_settings([f"abfss://data@{host}/t"],
                                 AzureCredentials(tenant_id="tid", client_id="cid", client_secret="cs"))
    assert principal.hadoop[f"fs.azure.account.oauth2.client.endpoint.{host}"] == \
        "https://login.microsoftonline.com/tid/oauth2/token"


def test_local_jobs_need_no_storage_settings_even_with_a_platform_connection() -> None:
    settings = storage_settings(["/lake/sales"], S3Credentials(access_key="a", secret_key="s"))
    assert not settings and settings.packages == ()


@pytest.mark.parametrize(("uri", "mode", "conf", "unsafe"), [
    ("s3a://lake/t", "embedded", {}, True),
    ("s3://lake/t", "spark-submit", {}, True),
    ("s3a://lake/t", "spark-submit", {"spark.delta.logStore.s3a.impl": "io.delta.storage.S3SingleDriverLogStore"},
     True),
    ("s3a://lake/t", "spark-submit", {"spark.delta.logStore.s3a.impl": MULTI_DRIVER_LOG_STORE}, False),
    # The setting names the scheme: a DynamoDB store for s3a:// does not cover s3://.
    ("s3://lake/t", "embedded", {"spark.delta.logStore.s3a.impl": MULTI_DRIVER_LOG_STORE}, True),
    ("s3://lake/t", "embedded", {"spark.delta.logStore.class": MULTI_DRIVER_LOG_STORE}, False),
    # delta-spark reads the keys without the spark. prefix too, and never under spark.hadoop.
    ("s3a://lake/t", "embedded", {"delta.logStore.s3a.impl": MULTI_DRIVER_LOG_STORE}, False),
    ("s3a://lake/t", "embedded", {"delta.logStore.class": MULTI_DRIVER_LOG_STORE}, False),
    ("s3a://lake/t", "embedded", {"spark.hadoop.delta.logStore.s3a.impl": MULTI_DRIVER_LOG_STORE}, True),
    # An allowlist: a store not known to coordinate drivers (here a misspelling) is unsafe.
    ("s3a://lake/t", "embedded", {"spark.delta.logStore.s3a.impl": "io.delta.storage.S3DynamoDbLogStore"}, True),
    ("s3a://lake/t", "embedded", {"spark.delta.logStore.s3a.impl": "io.delta.storage.HDFSLogStore"}, True),
    ("s3a://lake/t", "connect", {}, False),
    ("abfss://c@a.dfs.core.windows.net/t", "embedded", {}, False),
    ("gs://b/t", "spark-submit", {}, False),
    ("/lake/t", "embedded", {}, False),
])
def test_s3_commits_that_could_be_lost_are_named(uri: str, mode: str, conf: dict[str, str], unsafe: bool) -> None:
    assert (unsafe_s3_commit(uri, mode, conf) is not None) == unsafe


@pytest.mark.parametrize("conf", [
    {"spark.delta.logStore.class": MULTI_DRIVER_LOG_STORE, "spark.delta.logStore.gs.impl": "x.GcsStore"},
    {"delta.logStore.class": MULTI_DRIVER_LOG_STORE, "spark.delta.logStore.s3a.impl": MULTI_DRIVER_LOG_STORE},
    {"spark.delta.logStore.s3a.impl": MULTI_DRIVER_LOG_STORE, "delta.logStore.s3a.impl": "io.delta.storage.Other"},
])
def test_log_store_settings_delta_refuses_are_refused_first(conf: dict[str, str]) -> None:
    with pytest.raises(ProviderConfigError, match="delta-spark refuses"):
        unsafe_s3_commit("s3a://lake/t", "embedded", conf)


def test_unsafe_s3_commits_are_refused_or_warned() -> None:
    with pytest.raises(UnsafeLogStoreError, match=r"S3DynamoDBLogStore.*nothing was written"):
        check_s3_commits("s3a://lake/t", "embedded", {}, "refuse")
    assert "one commit would be lost" in str(check_s3_commits("s3a://lake/t", "embedded", {}, "warn"))


def test_the_hook_refuses_unsafe_s3_commits_before_spark_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    hook = DeltaSparkHook(None, mode="embedded")
    with pytest.raises(UnsafeLogStoreError):
        hook.use_storage("s3a://lake/t")
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__UNSAFE_S3_COMMITS", "warn")
    hook.use_storage("s3a://lake/t")
    assert hook.storage.packages
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__UNSAFE_S3_COMMITS", "sometimes")
    from airflow_delta_occ.exceptions import ProviderConfigError

    with pytest.raises(ProviderConfigError, match="unsafe_s3_commits"):
        hook.use_storage("s3a://lake/t")


def test_submit_conf_joins_connector_jars_to_delta_and_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    _conn(monkeypatch, "lake_s3", conn_type="aws", login="AKIA", password="SECRET",
          extra={"endpoint_url": "http://127.0.0.1:9000"})
    hook = DeltaSparkHook(None, mode="spark-submit", storage_conn_id="lake_s3",
                          spark_conf={"spark.delta.logStore.s3a.impl": MULTI_DRIVER_LOG_STORE,
                                      "spark.jars.packages": "io.delta:delta-storage-s3-dynamodb:4.4.0"})
    hook.use_storage("s3a://lake/t")
    conf = hook._conf_with_storage({"spark.jars.packages": "io.delta:delta-spark_4.2_2.13:4.4.0"})
    assert conf["spark.jars.packages"].split(",") == [
        "io.delta:delta-spark_4.2_2.13:4.4.0", f"org.apache.hadoop:hadoop-aws:{hadoop_version()}",
        "io.delta:delta-storage-s3-dynamodb:4.4.0"]
    assert conf["spark.hadoop.fs.s3a.access.key"] == "AKIA"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"


@pytest.mark.parametrize("deploy_mode", ["client", "cluster"])
def test_secrets_stay_off_the_spark_submit_command_line_when_the_driver_runs_here(
        monkeypatch: pytest.MonkeyPatch, deploy_mode: str) -> None:
    """A command line is readable by every user of the worker (``ps``); a client-mode driver gets the
    secret confs through its environment instead. A driver on the cluster has no other way."""
    from airflow_delta_occ.hooks.transports.submit import _submit_hook_class
    from airflow_delta_occ.spark.storage import SECRET_CONF_ENV

    _conn(monkeypatch, "cluster", conn_type="spark", host="yarn", extra={"deploy-mode": deploy_mode})
    conf = {"spark.hadoop.fs.s3a.secret.key": "SECRET", "spark.hadoop.fs.azure.account.key.a.dfs.x": "KEY",
            "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000"}
    hook = _submit_hook_class()(conn_id="cluster", application="runner.py", conf=conf, name="job")
    command = " ".join(hook._build_spark_submit_command("runner.py"))
    assert "spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9000" in command
    if deploy_mode == "client":
        assert "SECRET" not in command and "KEY" not in command
        assert json.loads(hook.secret_env[SECRET_CONF_ENV]) == {k: v for k, v in conf.items() if "endpoint" not in k}
    else:
        assert "SECRET" in command and hook.secret_env == {}


def test_every_secret_is_registered_with_the_log_masker(monkeypatch: pytest.MonkeyPatch) -> None:
    import airflow.sdk.log as sdk_log

    masked: list[Any] = []
    monkeypatch.setattr(sdk_log, "mask_secret", masked.append)
    _conn(monkeypatch, "tmp_s3", conn_type="aws", login="AKIA", password="SECRET",
          extra={"aws_session_token": "TOKEN"})
    storage_credentials("tmp_s3")
    _conn(monkeypatch, "sas", conn_type="wasb", login="acct", extra={"sas_token": "sv=SAS"})
    storage_credentials("sas")
    strings = {m for m in masked if isinstance(m, str)}
    assert {"SECRET", "TOKEN", "sv=SAS"} <= strings


def test_a_catalog_lookup_before_the_location_is_known_already_reaches_the_store(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``table_name=`` is resolved in a session that must read the table's log on S3: the connection's
    store-wide settings and connector apply until ``use_storage`` names the location."""
    _conn(monkeypatch, "lake_s3", conn_type="aws", login="AKIA", password="SECRET",
          extra={"endpoint_url": "http://127.0.0.1:9000"})
    hook = DeltaSparkHook(None, mode="embedded", storage_conn_id="lake_s3")
    assert hook.storage.hadoop["fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert hook.storage.packages == (f"org.apache.hadoop:hadoop-aws:{hadoop_version()}",)
    assert not DeltaSparkHook(None, mode="embedded").storage
    _conn(monkeypatch, "adls", conn_type="adls", host="acct", password="KEY")
    assert dict(DeltaSparkHook(None, storage_conn_id="adls").storage.hadoop) == {
        "fs.azure.account.key.acct.dfs.core.windows.net": "KEY"}
