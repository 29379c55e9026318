"""Conflict pool configuration: the TOML format, its validation, table normalization and matching."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from airflow_delta_occ.exceptions import PoolConfigError, ProviderConfigError
from airflow_delta_occ.pools.config import (
    MODELS,
    Pool,
    PoolConfig,
    load_pool_config,
    matches,
    normalize_table,
    parse_duration,
)

pytestmark = pytest.mark.unit

VALID = """
[pools.sales]
tables = ["s3a://lake/sales/**", "main.sales.*"]
model = "databricks"
max_writers = 8
lease_ttl = "10m"
heartbeat = "30s"
airflow_pool = "delta_sales"
description = "Sales tables"

[pools.events]
tables = ["/data/events/*"]
"""


def write(tmp_path: Path, text: str, name: str = "pools.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load_error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(PoolConfigError) as info:
        load_pool_config(path)
    message = str(info.value)
    assert str(path) in message
    return message


# --- the file format ------------------------------------------------------------------------------

def test_valid_file_round_trip(tmp_path):
    path = write(tmp_path, VALID)
    config = load_pool_config(path)
    assert config.source == str(path)
    sales = config.get("sales")
    assert sales == Pool(name="sales", tables=("s3://lake/sales/**", "main.sales.*"), model="databricks",
                         max_writers=8, lease_ttl=600.0, heartbeat=30.0, airflow_pool="delta_sales",
                         description="Sales tables")
    events = config.get("events")
    assert events.tables == ("file:///data/events/*",)
    assert (events.model, events.max_writers, events.lease_ttl, events.heartbeat) == ("delta", None, 300.0, 30.0)
    assert events.airflow_pool == "delta_occ_events"
    assert config.to_json() == {"source": str(path), "pools": [sales.to_json(), events.to_json()]}
    assert sales.to_json() == {"name": "sales", "tables": ["s3://lake/sales/**", "main.sales.*"],
                               "model": "databricks", "max_writers": 8, "lease_ttl": 600.0, "heartbeat": 30.0,
                               "airflow_pool": "delta_sales", "description": "Sales tables"}
    # Rebuilding from the JSON gives the same pools: to_json is the whole configuration.
    rebuilt = PoolConfig(tuple(Pool(**{**p, "tables": tuple(p["tables"])}) for p in config.to_json()["pools"]),
                         source=str(path))
    assert rebuilt == config


def test_an_empty_file_defines_no_pools(tmp_path):
    config = load_pool_config(write(tmp_path, ""))
    assert config.pools == () and config.pool_for("s3://lake/sales") is None


def test_models_are_the_planners():
    from airflow_delta_occ.engine.planner import MODELS as PLANNER_MODELS

    assert MODELS == PLANNER_MODELS


def test_get_names_the_unknown_pool_and_the_known_ones(tmp_path):
    config = load_pool_config(write(tmp_path, VALID))
    with pytest.raises(PoolConfigError, match=r"unknown pool 'sale'.*known pools: events, sales"):
        config.get("sale")


def test_pool_config_error_is_a_provider_config_error():
    assert issubclass(PoolConfigError, ProviderConfigError)


@pytest.mark.parametrize(("text", "expected"), [
    ('[pools.s]\ntables = ["/t"]\nmax_writer = 3', r"pools\.s: unknown key 'max_writer'.*allowed: tables, model, "),
    ('[pool.s]\ntables = ["/t"]', r"unknown top-level key 'pool'; allowed: pools"),
    ('pools = 3', r"pools: expected a table"),
    ('pools = {s = 1}', r"pools\.s: expected a table"),
    ('[pools.s]\nmodel = "delta"', r"pools\.s\.tables: missing"),
    ('[pools.s]\ntables = []', r"pools\.s\.tables: expected at least one table pattern"),
    ('[pools.s]\ntables = "/t"', r"pools\.s\.tables: expected an array of strings, got '/t'"),
    ('[pools.s]\ntables = ["/t", 3]', r"pools\.s\.tables\[1\]: expected a string, got 3"),
    ('[pools.s]\ntables = ["  "]', r"pools\.s\.tables\[0\]: "),
    ('[pools.s]\ntables = ["data/sales"]', r"pools\.s\.tables\[0\]: .*relative path"),
    ('[pools.s]\ntables = ["/t"]\nmodel = "spark"', r"pools\.s\.model: expected one of delta, databricks, maxcompute, "
                                                    r"got 'spark'"),
    ('[pools.s]\ntables = ["/t"]\nmax_writers = 0', r"pools\.s\.max_writers: expected a positive integer, got 0"),
    ('[pools.s]\ntables = ["/t"]\nmax_writers = true', r"pools\.s\.max_writers: expected a positive integer, got True"),
    ('[pools.s]\ntables = ["/t"]\nmax_writers = 2.5', r"pools\.s\.max_writers: expected a positive integer, got 2\.5"),
    ('[pools.s]\ntables = ["/t"]\nmax_writers = "8"', r"pools\.s\.max_writers: expected a positive integer, got '8'"),
    ('[pools.s]\ntables = ["/t"]\nlease_ttl = "10 minutes"', r"pools\.s\.lease_ttl: expected seconds .*'10 minutes'"),
    ('[pools.s]\ntables = ["/t"]\nlease_ttl = 0', r"pools\.s\.lease_ttl: .*positive.*got 0"),
    ('[pools.s]\ntables = ["/t"]\nheartbeat = "-5s"', r"pools\.s\.heartbeat: expected seconds .*'-5s'"),
    ('[pools.s]\ntables = ["/t"]\nheartbeat = true', r"pools\.s\.heartbeat: expected seconds .*got True"),
    ('[pools.s]\ntables = ["/t"]\nlease_ttl = "60s"\nheartbeat = "30s"',
     r"pools\.s\.lease_ttl: 60s is less than 3 times heartbeat \(30s\)"),
    ('[pools.s]\ntables = ["/t"]\nairflow_pool = "delta sales"', r"pools\.s\.airflow_pool: 'delta sales' .*letters"),
    ('[pools.s]\ntables = ["/t"]\nairflow_pool = 5', r"pools\.s\.airflow_pool: expected a string, got 5"),
    ('[pools.s]\ntables = ["/t"]\ndescription = 5', r"pools\.s\.description: expected a string, got 5"),
    ('[pools."sales team"]\ntables = ["/t"]', r"pools\.sales team: invalid pool name 'sales team'.*letters"),
    ('[pools.a]\ntables = ["/a"]\nairflow_pool = "shared"\n[pools.b]\ntables = ["/b"]\nairflow_pool = "shared"',
     r"pools\.b\.airflow_pool: 'shared' is already the Airflow pool of pools\.a"),
    ('[pools.a]\ntables = ["/a"]\nairflow_pool = "delta_occ_b"\n[pools.b]\ntables = ["/b"]',
     r"pools\.b\.airflow_pool: 'delta_occ_b' is already the Airflow pool of pools\.a"),
])
def test_validation_errors_name_the_file_and_the_entry(tmp_path, text, expected):
    assert re.search(expected, load_error(tmp_path, text)), load_error(tmp_path, text)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(PoolConfigError, match=re.escape(str(path)) + ".*cannot be read"):
        load_pool_config(path)


def test_unreadable_file(tmp_path):
    with pytest.raises(PoolConfigError, match=re.escape(str(tmp_path)) + ".*cannot be read"):
        load_pool_config(tmp_path)  # a directory


def test_invalid_toml_names_the_file_and_the_parsers_message(tmp_path):
    message = load_error(tmp_path, "[pools.s\ntables = [")
    assert "not valid TOML" in message and "line 1" in message


def test_invalid_utf8(tmp_path):
    path = tmp_path / "pools.toml"
    path.write_bytes(b'[pools.s]\ndescription = "\xff"\n')
    with pytest.raises(PoolConfigError, match=re.escape(str(path))):
        load_pool_config(path)


# --- durations ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "seconds"), [
    (45, 45.0), (2.5, 2.5), ("30s", 30.0), ("10m", 600.0), ("1h", 3600.0), ("1.5h", 5400.0), (" 90 s ", 90.0),
    ("0.5m", 30.0), ("2H", 7200.0),
])
def test_durations(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["", "10", "10d", "m", "-1s", "1e3s", "nan", True, None, [1], float("inf"), 0, -3])
def test_bad_durations(value):
    with pytest.raises(ValueError):
        parse_duration(value)


# --- normalization --------------------------------------------------------------------------------

@pytest.mark.parametrize(("table", "normalized"), [
    ("s3a://lake/sales", "s3://lake/sales"),
    ("s3n://lake/sales", "s3://lake/sales"),
    ("S3A://lake/sales/", "s3://lake/sales"),
    ("s3://lake//sales///2024//", "s3://lake/sales/2024"),
    ("abfss://c@acct.dfs.core.windows.net/t/", "abfss://c@acct.dfs.core.windows.net/t"),
    # abfs:// is the same container without TLS: one table, one pool, one set of leases.
    ("abfs://c@acct.dfs.core.windows.net/t", "abfss://c@acct.dfs.core.windows.net/t"),
    ("gs://bucket/t", "gs://bucket/t"),
    ("hdfs://nn:8020/warehouse/t/", "hdfs://nn:8020/warehouse/t"),
    ("/data/sales", "file:///data/sales"),
    ("/data/sales/", "file:///data/sales"),
    ("//data//sales", "file:///data/sales"),
    ("/data/x/../sales/./", "file:///data/sales"),
    ("file:///data/sales", "file:///data/sales"),
    ("file:/data/sales", "file:///data/sales"),
    ("FILE://localhost/data/../sales", "file:///sales"),
    ("/", "file:///"),
    ("main.sales.orders", "main.sales.orders"),
    ("Main.Sales.Orders", "main.sales.orders"),
    ("`main`.`Sales`.orders", "main.sales.orders"),
    ("  sales.orders ", "sales.orders"),
    ("orders", "orders"),
])
def test_normalize_table(table, normalized):
    assert normalize_table(table) == normalized


@pytest.mark.parametrize("table", ["", "   ", "data/sales", "./sales", "../sales", "main..orders", "main.",
                                   "`a.b`.c", "`main.orders", "main orders", "file:data/sales",
                                   "s3://lake/sales/../hr", "s3a://lake/./sales",
                                   # the engine refuses these table URIs, so no pool may name one
                                   "s3a://lake/a%20b", "s3://lake/sales#x", "s3a://key:secret@lake/sales"])
def test_unusable_table_identifiers(table):
    with pytest.raises(ValueError):
        normalize_table(table)


# --- matching -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("pattern", "table", "expected"), [
    ("s3://lake/sales/*", "s3a://lake/sales/orders", True),
    ("s3://lake/sales/*", "s3://lake/sales/orders/", True),
    ("s3://lake/sales/*", "s3://lake/sales/2024/orders", False),
    ("s3://lake/sales/**", "s3://lake/sales/2024/orders", True),
    ("s3://lake/sales/**", "s3://lake/sales", False),
    ("s3://lake/**/orders", "s3://lake/orders", True),
    ("s3://lake/**/orders", "s3://lake/a/b/orders", True),
    ("s3://lake/**/orders", "s3://lake/a/b/orders2", False),
    ("s3://lake/sales_?", "s3://lake/sales_1", True),
    ("s3://lake/sales_?", "s3://lake/sales_10", False),
    ("s3://lake/sales_[0-9]", "s3://lake/sales_7", True),
    ("s3://lake/sales_[!0-9]", "s3://lake/sales_7", False),
    ("s3://lake/sales_[!0-9]", "s3://lake/sales_x", True),
    ("s3://lake/sales_[!0-9]", "s3://lake/sales_/", False),
    ("s3a://lake/sales", "s3://lake/sales", True),
    ("gs://lake/sales", "s3://lake/sales", False),
    ("/data/*", "file:/data/sales", True),
    ("/data/*", "/data/x/../sales", True),
    ("main.sales.*", "main.sales.orders", True),
    ("main.sales.*", "MAIN.`Sales`.Orders", True),
    ("main.sales.*", "main.sales.orders.v2", False),
    ("main.**", "main.sales.orders", True),
    ("main.*", "main.sales.orders", False),
    ("MAIN.Sales.*", "main.sales.orders", True),
    ("*", "orders", True),
    ("*", "main.orders", False),
    ("**", "main.orders", True),
    ("s3://lake.x/*", "s3://lake.x/sales", True),
    # A location pattern never matches a catalog name, nor the reverse.
    ("**", "/data/sales", False),
    ("**", "s3://lake/sales", False),
    ("/**", "main.sales", False),
    ("s3://**", "main.sales", False),
    ("file:///**", "sales", False),
])
def test_matching(pattern, table, expected):
    assert matches(pattern, table) is expected


def test_pool_for(tmp_path):
    config = load_pool_config(write(tmp_path, VALID))
    assert config.pool_for("s3a://lake/sales/orders") is config.get("sales")
    assert config.pool_for("s3://lake/sales/2024/orders/") is config.get("sales")
    assert config.pool_for("`Main`.sales.ORDERS") is config.get("sales")
    assert config.pool_for("file:///data/events/clicks") is config.get("events")
    assert config.pool_for("/data/events/2024/clicks") is None
    assert config.pool_for("main.events.clicks") is None


# --- overlapping pools ----------------------------------------------------------------------------

@pytest.mark.parametrize(("a", "b"), [
    ("s3://lake/sales", "s3a://lake/sales/"),              # identical after normalization
    ("main.sales.*", "MAIN.`sales`.*"),
    ("s3://lake/sales/orders", "s3://lake/sales/*"),       # a literal matched by the other's pattern
    ("main.sales.orders", "main.**"),
    ("s3://lake/sales/**", "s3://lake/sales/2024/*"),      # one literal prefix starts with the other's
    ("s3://lake/*/orders", "s3://lake/sales/*"),
    ("/data/**", "/data/events/*"),
    ("main.sales.*", "main.sales.o*"),
    ("s3://lake/sales/*", "s3://lake/sales/*/archive/**"),  # disjoint, but ** hides the depth: refused
])
def test_overlapping_pools_are_rejected_at_load(tmp_path, a, b):
    message = load_error(tmp_path, f'[pools.a]\ntables = ["/x", "{a}"]\n[pools.b]\ntables = ["{b}"]')
    assert re.search(r"pools\.b\.tables\[0\]: .* could also match pools\.a\.tables\[1\]", message), message


@pytest.mark.parametrize(("a", "b"), [
    ("s3://lake/sales/**", "s3://lake/marketing/**"),      # literal prefixes diverge
    ("s3://lake/sales/*.gold", "s3://lake/sales/*.silver"),  # literal suffixes diverge
    ("s3://lake/sales/*", "s3://lake/sales/*/archive"),    # different depths, no **
    ("main.sales.*", "main.marketing.*"),
    ("main.sales.*", "s3://lake/main.sales/*"),            # a catalog name and a location never overlap
    ("**", "/**"),
    ("s3://lake/sales/orders", "s3://lake/sales/order?x"),
])
def test_disjoint_pools_load(tmp_path, a, b):
    path = write(tmp_path, f'[pools.a]\ntables = ["{a}"]\n[pools.b]\ntables = ["{b}"]')
    assert [p.name for p in load_pool_config(path).pools] == ["a", "b"]


def test_patterns_of_one_pool_may_overlap(tmp_path):
    path = write(tmp_path, '[pools.a]\ntables = ["s3://lake/**", "s3://lake/sales/*"]')
    assert load_pool_config(path).pool_for("s3://lake/sales/t").name == "a"


def test_pool_for_refuses_a_table_that_two_pools_match():
    # Built directly with the load-time check skipped: pool_for must still never pick one silently.
    config = PoolConfig.__new__(PoolConfig)
    object.__setattr__(config, "pools", (Pool("a", ("s3://lake/*/orders",)), Pool("b", ("s3://lake/sales/*",))))
    object.__setattr__(config, "source", "/etc/pools.toml")
    with pytest.raises(PoolConfigError, match=r"/etc/pools\.toml: table 's3://lake/sales/orders' matches pools a "
                                              r"\('s3://lake/\*/orders'\) and b \('s3://lake/sales/\*'\)"):
        config.pool_for("s3a://lake/sales/orders")


def test_pools_built_in_code_are_validated_too():
    with pytest.raises(PoolConfigError, match=r"pools\.a\.max_writers: expected a positive integer, got 0"):
        Pool("a", ("/t",), max_writers=0)
    with pytest.raises(PoolConfigError, match=r"<code>: duplicate pool name 'a'"):
        PoolConfig((Pool("a", ("/t",)), Pool("a", ("/u",))), source="<code>")


# --- the [delta_occ] pool_file option -------------------------------------------------------------

def test_pool_file_option(monkeypatch, tmp_path):
    from airflow_delta_occ import config as provider_config

    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", "")
    assert provider_config.pool_file() is None and provider_config.pool_config() is None
    path = write(tmp_path, VALID)
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", f" {path} ")
    assert provider_config.pool_file() == str(path)
    assert provider_config.pool_config().get("sales").max_writers == 8


def test_pool_config_is_cached_until_the_file_changes(monkeypatch, tmp_path):
    from airflow_delta_occ import config as provider_config

    path = write(tmp_path, VALID)
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(path))
    first = provider_config.pool_config()
    assert provider_config.pool_config() is first
    path.write_text(VALID.replace("max_writers = 8", "max_writers = 3"))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    second = provider_config.pool_config()
    assert second is not first and second.get("sales").max_writers == 3


def test_a_bad_pool_file_is_a_typed_error_naming_the_option(monkeypatch, tmp_path):
    from airflow_delta_occ import config as provider_config

    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(tmp_path / "missing.toml"))
    with pytest.raises(PoolConfigError, match=r"\[delta_occ\] pool_file: .*missing\.toml"):
        provider_config.pool_config()
