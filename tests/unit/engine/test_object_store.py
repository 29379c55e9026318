"""Object-store URIs as Spark users write them, and the pyarrow filesystems the engine opens for them."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from airflow_delta_occ.engine import DeltaLog, UnsupportedStorageError
from airflow_delta_occ.engine.object_store import (
    AzureCredentials,
    GcsCredentials,
    S3Credentials,
    StoreKind,
    canonical_location,
    open_filesystem,
    parse_table_uri,
    store_scheme,
)
from airflow_delta_occ.engine.storage import LocalStorage, PyArrowStorage, resolve_table


@pytest.mark.parametrize(("uri", "kind", "authority", "root"), [
    ("s3a://lake/sales", StoreKind.S3, "lake", "lake/sales"),
    ("s3://lake/db/sales/", StoreKind.S3, "lake", "lake/db/sales"),
    ("s3n://lake/sales", StoreKind.S3, "lake", "lake/sales"),
    ("S3A://lake/a b", StoreKind.S3, "lake", "lake/a b"),
    ("abfss://data@acct.dfs.core.windows.net/sales", StoreKind.AZURE, "acct", "data/sales"),
    ("abfs://data@acct.dfs.core.windows.net/", StoreKind.AZURE, "acct", "data"),
    ("gs://bucket/sales", StoreKind.GCS, "bucket", "bucket/sales"),
    ("hdfs://namenode:8020/warehouse/sales", StoreKind.HDFS, "namenode:8020", "/warehouse/sales"),
])
def test_uris_map_to_their_store(uri: str, kind: StoreKind, authority: str, root: str) -> None:
    location = parse_table_uri(uri)
    assert (location.kind, location.authority, location.root) == (kind, authority, root)
    assert store_scheme(uri) == uri.split(":")[0].lower()


def test_azure_keeps_the_endpoint_the_uri_names() -> None:
    public = parse_table_uri("abfss://data@acct.dfs.core.windows.net/t")
    china = parse_table_uri("abfss://data@Acct.dfs.core.chinacloudapi.cn/t")
    assert (public.authority, public.host) == ("acct", "acct.dfs.core.windows.net")
    assert (china.authority, china.host) == ("acct", "acct.dfs.core.chinacloudapi.cn")


@pytest.mark.parametrize("uri", ["/lake/sales", "file:///lake/sales", "sales", "ftp://host/sales", "C:/x"])
def test_local_and_unknown_schemes_are_not_stores(uri: str) -> None:
    assert store_scheme(uri) is None


@pytest.mark.parametrize(("uri", "message"), [
    ("ftp://host/sales", "scheme 'ftp' is not supported"),
    ("s3a:///sales", "names no bucket"),
    ("abfss://acct.dfs.core.windows.net/sales", "container@account"),
    ("gs:///x", "names no bucket"),
    # Spark (Hadoop's Path) would resolve these to another table than the one the engine reads.
    ("s3a://lake/sales/../hr", "'\\.\\.' segments"),
    ("s3a://lake/./sales", "segments are ambiguous"),
    # Hadoop keeps these in the key ('%' escaped), the engine would read a query, a fragment or an
    # escape: two names for one URI.
    ("abfss://c@a.dfs.core.windows.net/x/%2E%2E/y", "holds %"),
    ("s3a://lake/a%20b", "holds %"),
    ("s3a://lake/sales?v=1", "holds \\?"),
    ("gs://lake/sales#x", "holds #"),
    # A secret in the URI would be logged with the table name.
    ("s3a://AKIA:SECRET@lake/sales", "credentials do not belong"),
    ("hdfs://user@namenode/x", "credentials do not belong"),
    ("s3a://lake:9000/sales", "not a bucket name"),
    # Azure: the container and the account's dfs endpoint, nothing else.
    ("abfss://c:key@acct.dfs.core.windows.net/x", "container@account"),
    ("abfss://c@acct.blob.core.windows.net/x", "container@account"),
    ("abfss://c@evil.example/x", "container@account"),
    ("s3a:lake/sales", "expected s3a://"),
])
def test_malformed_or_unknown_uris_are_refused(uri: str, message: str) -> None:
    with pytest.raises(UnsupportedStorageError, match=message):
        parse_table_uri(uri)


def test_unknown_scheme_is_refused_before_anything_is_read() -> None:
    with pytest.raises(UnsupportedStorageError, match="s3a://"):
        DeltaLog.for_table("ftp://host/sales")


def test_s3a_opens_an_s3_filesystem_with_the_endpoint_and_keys() -> None:
    storage, root = resolve_table("s3a://lake/sales", S3Credentials(
        access_key="AKIA", secret_key="SECRET", region="eu-west-1", endpoint="http://127.0.0.1:9000",
        path_style=True))
    assert isinstance(storage, PyArrowStorage) and root == "lake/sales"
    fs = storage._fs
    assert isinstance(fs, pafs.S3FileSystem)
    assert fs.region == "eu-west-1"
    # pyarrow keeps the endpoint in its pickled form; the secret never shows in repr.
    assert "127.0.0.1:9000" in repr(fs.__reduce__())


def test_secrets_are_not_in_repr() -> None:
    text = repr(S3Credentials(access_key="AKIA", secret_key="SECRET", session_token="TOKEN"))
    text += repr(AzureCredentials(account_name="a", account_key="KEY")) + repr(GcsCredentials(access_token="TOK"))
    for secret in ("SECRET", "TOKEN", "KEY", "TOK'"):
        assert secret not in text


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"access_key": "a"}, "both an access key and a secret key"),
    ({"secret_key": "s"}, "both an access key and a secret key"),
    ({"session_token": "t"}, "session token needs"),
    ({"endpoint": "127.0.0.1:9000"}, "http\\(s\\) URL"),
    ({"endpoint": "ftp://x"}, "http\\(s\\) URL"),
])
def test_incomplete_s3_credentials_are_refused(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(UnsupportedStorageError, match=message):
        S3Credentials(**kwargs)


def test_half_a_service_principal_is_refused() -> None:
    with pytest.raises(UnsupportedStorageError, match="tenant_id, client_id and client_secret"):
        AzureCredentials(account_name="a", client_id="c")


def test_credentials_for_another_store_are_refused() -> None:
    with pytest.raises(UnsupportedStorageError, match="on S3 but the storage credentials are for AZURE"):
        open_filesystem(parse_table_uri("s3a://lake/t"), AzureCredentials(account_name="a", account_key="k"))
    with pytest.raises(UnsupportedStorageError, match="local path"):
        resolve_table("/lake/t", S3Credentials())


def test_azure_account_must_match_the_uri() -> None:
    with pytest.raises(UnsupportedStorageError, match="account 'acct' but the credentials are for account 'other'"):
        open_filesystem(parse_table_uri("abfss://data@acct.dfs.core.windows.net/t"),
                        AzureCredentials(account_name="other", account_key="a2V5"))


def test_azure_and_gcs_filesystems_are_built() -> None:
    fs = open_filesystem(parse_table_uri("abfss://data@acct.dfs.core.windows.net/t"),
                         AzureCredentials(account_key="a2V5"))
    assert isinstance(fs, pafs.AzureFileSystem)
    fs = open_filesystem(parse_table_uri("gs://bucket/t"), GcsCredentials(access_token="tok", project_id="p",
                                                                          endpoint="http://127.0.0.1:4443"))
    assert isinstance(fs, pafs.GcsFileSystem)


def test_local_paths_keep_the_fast_local_storage(tmp_path: object) -> None:
    storage, root = resolve_table(f"file://{tmp_path}")
    assert isinstance(storage, LocalStorage) and root == str(tmp_path)


# --- one spelling per table ------------------------------------------------------------------------

@pytest.mark.parametrize(("uri", "canonical"), [
    ("s3a://Lake/db//Sales/", "s3://lake/db/Sales"),
    ("S3N://lake/t", "s3://lake/t"),
    ("abfs://Data@ACCT.dfs.core.windows.net:80/t", "abfss://data@acct.dfs.core.windows.net/t"),
    ("abfss://data@acct.dfs.core.windows.net:443/t", "abfss://data@acct.dfs.core.windows.net/t"),
    ("abfss://data@acct.dfs.core.windows.net:10000/t", "abfss://data@acct.dfs.core.windows.net:10000/t"),
    ("gs://Bucket/T/", "gs://bucket/T"),
    ("hdfs://NameNode/warehouse/T", "hdfs://namenode:8020/warehouse/T"),
    ("hdfs://nn:9000/x", "hdfs://nn:9000/x"),
    ("hdfs://[::1]/x", "hdfs://[::1]:8020/x"),
    ("hdfs:///x", "hdfs:///x"),
    ("HTTPS://Host:443/x", "https://host/x"),
    ("https://host:8443/x", "https://host:8443/x"),
    ("s3://lake", "s3://lake"),
])
def test_canonical_location(uri: str, canonical: str) -> None:
    assert canonical_location(uri) == canonical
    assert canonical_location(canonical) == canonical


@pytest.mark.parametrize(("uri", "message"), [
    ("s3a://AKIA:SECRET@lake/t", "user info"),
    ("hdfs://user@nn/x", "user info"),
    ("abfss://c:key@acct.dfs.core.windows.net/t", "user info"),
    ("hdfs://nn:xx/x", "port 'xx'"),
    ("hdfs://nn:65536/x", "port '65536'"),
    ("s3://lake/a%20b", "'%'"),
    ("s3://lake/../b", "'\\.\\.'"),
    ("/local/path", "expected <scheme>://"),
])
def test_canonical_location_refuses(uri: str, message: str) -> None:
    with pytest.raises(UnsupportedStorageError, match=message):
        canonical_location(uri)


def test_an_hdfs_port_that_is_not_a_number_is_refused_before_anything_is_opened() -> None:
    with pytest.raises(UnsupportedStorageError, match="port 'xx'"):
        parse_table_uri("hdfs://namenode:xx/warehouse/t")
