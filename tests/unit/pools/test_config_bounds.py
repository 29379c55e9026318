"""Every duration and count of the pool file has a documented range, refused at load with the field named;
no value of the file, however large or deeply nested, escapes as a raw OverflowError or RecursionError."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airflow_delta_occ.exceptions import PoolConfigError
from airflow_delta_occ.pools.config import (
    HEARTBEAT_RANGE,
    LEASE_TTL_RANGE,
    MAX_WRITERS_RANGE,
    Pool,
    load_pool_config,
)

pytestmark = pytest.mark.unit


def load_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pools.toml"
    path.write_text(text)
    with pytest.raises(PoolConfigError) as info:
        load_pool_config(path)
    message = str(info.value)
    assert str(path) in message
    return message


def test_the_ranges() -> None:
    assert HEARTBEAT_RANGE == (0.1, 3600.0)
    assert LEASE_TTL_RANGE == (1.0, 7 * 86400.0)
    assert MAX_WRITERS_RANGE == (1, 10_000)


@pytest.mark.parametrize(("entry", "expected"), [
    ('heartbeat = "3000000h"\nlease_ttl = "90000000000h"',
     r"pools\.s\.lease_ttl: 3\.24e\+14s is outside 1s \.\. 604800s \(7 days\)"),
    ('heartbeat = "3000000h"', r"pools\.s\.heartbeat: 1\.08e\+10s is outside 0\.1s \.\. 3600s \(1 hour\)"),
    ('lease_ttl = "90000000000h"', r"pools\.s\.lease_ttl: 3\.24e\+14s is outside 1s \.\. 604800s \(7 days\)"),
    ('lease_ttl = "8d"', r"pools\.s\.lease_ttl: expected seconds"),
    ('lease_ttl = "169h"', r"pools\.s\.lease_ttl: 608400s is outside 1s \.\. 604800s"),
    ('lease_ttl = 0.5\nheartbeat = 0.1', r"pools\.s\.lease_ttl: 0\.5s is outside 1s \.\. 604800s"),
    ('heartbeat = "0.05s"', r"pools\.s\.heartbeat: 0\.05s is outside 0\.1s \.\. 3600s"),
    ('heartbeat = "2h"\nlease_ttl = "7h"', r"pools\.s\.heartbeat: 7200s is outside 0\.1s \.\. 3600s"),
    ('lease_ttl = 1' + "0" * 400, r"pools\.s\.lease_ttl: 1e\+400 is outside 1s \.\. 604800s"),
    ('lease_ttl = 1e400', r"pools\.s\.lease_ttl: expected seconds"),    # TOML's float: inf
    ('lease_ttl = "1' + "0" * 400 + 's"', r"pools\.s\.lease_ttl: expected seconds"),
    ('max_writers = 10001', r"pools\.s\.max_writers: 10001 is outside 1 \.\. 10000"),
    ('max_writers = 1' + "0" * 30, r"pools\.s\.max_writers: 1e\+30 is outside 1 \.\. 10000"),
    ('max_writers = 1' + "0" * 4000, r"pools\.s\.max_writers: 1e\+4000 is outside 1 \.\. 10000"),
    ('max_writers = 1' + "0" * 5000, r"not valid TOML"),   # the parser's own limit on integer digits
])
def test_out_of_range_values_are_refused_naming_the_field_and_the_range(tmp_path: Path, entry: str,
                                                                        expected: str) -> None:
    message = load_error(tmp_path, f'[pools.s]\ntables = ["/t"]\n{entry}\n')
    assert re.search(expected, message), message


@pytest.mark.parametrize(("entry", "ttl", "heartbeat", "writers"), [
    ('lease_ttl = "7d"', None, None, None),
    ('lease_ttl = "168h"\nheartbeat = "1h"\nmax_writers = 10000', 604800.0, 3600.0, 10000),
    ('lease_ttl = 1\nheartbeat = 0.1\nmax_writers = 1', 1.0, 0.1, 1),
])
def test_the_bounds_themselves_are_accepted(tmp_path: Path, entry: str, ttl: float | None, heartbeat: float | None,
                                            writers: int | None) -> None:
    path = tmp_path / "pools.toml"
    path.write_text(f'[pools.s]\ntables = ["/t"]\n{entry}\n')
    if ttl is None:
        with pytest.raises(PoolConfigError):  # "7d": the units are s, m and h
            load_pool_config(path)
        return
    pool = load_pool_config(path).get("s")
    assert (pool.lease_ttl, pool.heartbeat, pool.max_writers) == (ttl, heartbeat, writers)


def test_pools_built_in_code_are_bounded_too() -> None:
    with pytest.raises(PoolConfigError, match=r"pools\.a\.lease_ttl: .* is outside 1s \.\. 604800s"):
        Pool("a", ("/t",), lease_ttl=float(10**20))
    with pytest.raises(PoolConfigError, match=r"pools\.a\.lease_ttl: .*is outside"):
        Pool("a", ("/t",), lease_ttl=10**400)
    with pytest.raises(PoolConfigError, match=r"pools\.a\.max_writers: 100000 is outside 1 \.\. 10000"):
        Pool("a", ("/t",), max_writers=100_000)


@pytest.mark.parametrize("text", [
    '[pools.s]\ntables = ["/t"]\ndescription = ' + "[" * 5000 + "]" * 5000,
    '[pools.s]\ntables = ' + "[" * 5000 + "]" * 5000,
    '[pools.s]\ntables = ["/t"]\nlease_ttl = ' + "[" * 5000 + "]" * 5000,
    'pools = ' + "[" * 5000 + "]" * 5000,
    '[pools.s]\ntables = ["/t"]\nx = ' + "{a = " * 3000 + "1" + "}" * 3000,
    # Nested just under the parser's limit: the messages quoting the value must not recurse either.
    '[pools.s]\ntables = ' + "[" * 400 + "]" * 400,
    '[pools.s]\ntables = ["/t"]\ndescription = ' + "[" * 400 + "]" * 400,
])
def test_a_deeply_nested_file_is_a_pool_config_error(tmp_path: Path, text: str) -> None:
    message = load_error(tmp_path, text)
    assert len(message) < 2000


def test_huge_values_are_quoted_short(tmp_path: Path) -> None:
    message = load_error(tmp_path, '[pools.s]\ntables = ["/t"]\ndescription = ' + str(list(range(100_000))))
    assert "pools.s.description: expected a string" in message and len(message) < 2000
