"""One physical table, one lease key: every spelling of a table names it once, and different tables never share
a key. Covers every scheme docs/pools.md and docs/object-storage.md list (s3/s3a/s3n, abfs/abfss, gs, hdfs, local
paths and file:, catalog names)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_delta_occ.hooks.leases import pooled_table
from airflow_delta_occ.operators.lineage import dataset_name_for_location
from airflow_delta_occ.pools.config import Pool, normalize_table
from airflow_delta_occ.pools.leases.base import LeaseStore
from airflow_delta_occ.pools.leases.memory import MemoryLeaseStore

from .contract import Request

pytestmark = pytest.mark.unit

AZ = "dfs.core.windows.net"

SAME = [
    # HDFS: the namenode's default RPC port is 8020; host names are case-insensitive.
    ("hdfs://namenode:8020/x", "hdfs://namenode/x"),
    ("hdfs://namenode:8020/x", "hdfs://NameNode/x"),
    ("hdfs://namenode:8020/x", "HDFS://NAMENODE:8020/x/"),
    ("hdfs://namenode:8020/x", "hdfs://namenode:08020//x"),
    ("hdfs://nn:9000/x", "hdfs://NN:9000/x"),
    # ADLS: account names (and container names, which Azure keeps in lower case) are case-insensitive;
    # abfs:// is the same container without TLS, and 443 / 80 are the default ports of abfss / abfs.
    (f"abfss://c@acct.{AZ}/t", f"abfss://c@ACCT.{AZ}/t"),
    (f"abfss://c@acct.{AZ}/t", "abfss://C@Acct.DFS.Core.Windows.Net/t/"),
    (f"abfss://c@acct.{AZ}/t", f"abfss://c@acct.{AZ}:443/t"),
    (f"abfss://c@acct.{AZ}/t", f"abfs://c@acct.{AZ}:80/t"),
    (f"abfss://c@acct.{AZ}/t", f"ABFS://c@acct.{AZ}/t"),
    ("abfss://c@acct.dfs.core.chinacloudapi.cn/t", "abfss://c@ACCT.dfs.core.chinacloudapi.cn/t"),
    # S3: one bucket whichever connector names it; bucket names are DNS names.
    ("s3://lake/t", "s3a://lake/t"),
    ("s3://lake/t", "s3n://lake/t/"),
    ("s3://lake/t", "S3A://Lake/t"),
    ("s3://lake/t", "s3://LAKE//t"),
    # GCS
    ("gs://bucket/t", "GS://Bucket/t/"),
    # Local paths
    ("/data/t", "file:///data/t"),
    ("/data/t", "file://localhost/data/t/"),
    ("/data/t", "FILE://LOCALHOST/data/t"),
    # Catalog names
    ("main.sales.orders", "`Main`.SALES.orders"),
]

DIFFERENT = [
    ("s3://lake/t", "s3://lake2/t"),             # another bucket
    ("s3://lake/t", "s3://lake/T"),              # paths are case-sensitive
    ("s3://lake/t", "gs://lake/t"),              # another store
    ("gs://bucket/t", "gs://bucket/T"),
    ("hdfs://nn:8020/x", "hdfs://nn:9000/x"),    # another namenode port
    ("hdfs://nn1/x", "hdfs://nn2/x"),
    ("hdfs://nn/x", "hdfs://nn/X"),
    (f"abfss://c1@acct.{AZ}/t", f"abfss://c2@acct.{AZ}/t"),    # another container
    (f"abfss://c@acct1.{AZ}/t", f"abfss://c@acct2.{AZ}/t"),    # another account
    (f"abfss://c@acct.{AZ}/t", "abfss://c@acct.dfs.core.chinacloudapi.cn/t"),  # another cloud
    (f"abfss://c@acct.{AZ}/t", f"abfss://c@acct.{AZ}/T"),
    (f"abfss://c@acct.{AZ}:10000/t", f"abfss://c@acct.{AZ}/t"),  # an emulator's port
    ("/data/t", "/data/T"),
    ("/data/t", "/data/t2"),
    ("main.sales.orders", "main.sales.orders2"),
]


@pytest.mark.parametrize(("a", "b"), SAME)
def test_spellings_of_one_table_have_one_key(a: str, b: str) -> None:
    assert normalize_table(a) == normalize_table(b)


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_different_tables_have_different_keys(a: str, b: str) -> None:
    assert normalize_table(a) != normalize_table(b)


@pytest.mark.parametrize(("table", "key"), [
    # Keys already in lease stores keep their form.
    ("s3a://lake/sales", "s3://lake/sales"),
    ("/data/sales", "file:///data/sales"),
    ("hdfs://nn:8020/warehouse/t/", "hdfs://nn:8020/warehouse/t"),
    (f"abfss://c@acct.{AZ}/t", f"abfss://c@acct.{AZ}/t"),
    ("gs://bucket/t", "gs://bucket/t"),
    # The forms every other spelling comes to.
    ("hdfs://NameNode/x", "hdfs://namenode:8020/x"),
    (f"abfs://C@ACCT.{AZ}:80/t", f"abfss://c@acct.{AZ}/t"),
    ("s3n://LAKE/Sales/", "s3://lake/Sales"),
])
def test_the_key_form(table: str, key: str) -> None:
    assert normalize_table(table) == key
    assert normalize_table(key) == key


@pytest.mark.parametrize(("pattern", "table"), [
    ("hdfs://namenode/warehouse/**", "hdfs://NameNode:8020/warehouse/t"),
    ("hdfs://nn?/warehouse/*", "hdfs://nn1/warehouse/t"),
    ("hdfs://*/warehouse/*", "hdfs://nn:9000/warehouse/t"),  # a host wildcard ending in * still covers ports
    (f"abfss://*@ACCT.{AZ}/**", f"abfss://c@acct.{AZ}:443/t"),
    ("s3a://Lake/**", "s3://lake/t"),
])
def test_patterns_are_normalized_like_tables(pattern: str, table: str) -> None:
    pool = Pool("p", (pattern,))
    assert pool.matching_pattern(normalize_table(table)) is not None


@pytest.mark.parametrize("bad", ["hdfs://nn:xx/x", "hdfs://nn:99999/x", "https://host:-1/x"])
def test_a_port_that_is_not_a_port_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="port"):
        normalize_table(bad)


@pytest.mark.parametrize(("a", "b"), [pair for pair in SAME if "/" in pair[0]])
def test_lineage_names_one_table_once(a: str, b: str) -> None:
    """OpenLineage datasets use the lease key's normal form (local paths and file: URIs too), so consumers
    join one table's runs whatever the spelling, and a dataset is the table a lease was taken on."""
    assert dataset_name_for_location(a) == dataset_name_for_location(b)
    name = dataset_name_for_location(a)
    assert normalize_table(a) == (f"file://{name.name}" if name.namespace == "file" else
                                  f"{name.namespace}/{name.name.lstrip('/')}".rstrip("/"))


@pytest.mark.parametrize(("a", "b"), [pair for pair in DIFFERENT if "/" in pair[0]])
def test_lineage_keeps_different_tables_apart(a: str, b: str) -> None:
    assert dataset_name_for_location(a) != dataset_name_for_location(b)


# --- what the lease store grants -------------------------------------------------------------------

@pytest.fixture
def store() -> Iterator[LeaseStore]:
    with MemoryLeaseStore() as memory:
        yield memory


@pytest.mark.parametrize(("first", "second"), [
    ("hdfs://namenode:8020/warehouse/sales", "hdfs://NameNode/warehouse/sales/"),
    (f"abfss://lake@ACCT.{AZ}/sales", f"abfs://lake@acct.{AZ}/sales"),
    ("s3a://Lake/sales", "s3://lake/sales"),
])
def test_two_updates_of_one_partition_under_two_spellings_are_not_both_granted(
        store: LeaseStore, request_for: Request, first: str, second: str) -> None:
    pool = Pool("sales", ("hdfs://namenode/warehouse/**", f"abfss://lake@acct.{AZ}/**", "s3://lake/**"))
    a = store.acquire(request_for("a", "UPDATE", "country = 'DE'", table_key=pooled_table(pool, first)))
    b = store.acquire(request_for("b", "UPDATE", "country = 'DE'", table_key=pooled_table(pool, second)))
    assert a.granted
    assert not b.granted
