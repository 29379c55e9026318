"""The partition tokens the PostgreSQL store compares on the server (``pg_at_once``): two values a filter holds
equal must never get different tokens, or the server would take two requests on one partition for apart."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
from decimal import Decimal
from typing import Any

import pytest

from airflow_delta_occ.engine.predicates import comparison_key
from airflow_delta_occ.pools.leases import pg_at_once
from airflow_delta_occ.pools.requests import LeaseRequest

from .contract import Request, request_for, table  # noqa: F401 - fixtures of the contract

pytestmark = pytest.mark.unit

VALUES: list[Any] = [
    0, 1, -1, 2**60, 2**60 + 1, 0.0, -0.0, 1.0, -1.0, 1.5, 1e20, float(2**60), math.inf, -math.inf, math.nan,
    True, False, Decimal("0"), Decimal("-0"), Decimal("0.00"), Decimal("1"), Decimal("1.0"), Decimal("1E+0"),
    Decimal("10"), Decimal("1E+1"), Decimal("1.5"), Decimal("NaN"), Decimal("Infinity"), "", "a", "A", "1", "n:1",
    dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    dt.datetime(2024, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))), b"x", b"",
]


def test_values_a_filter_holds_equal_get_one_token_or_none() -> None:
    tokens = 0
    for a, b in itertools.product(VALUES, repeat=2):
        ka, kb = comparison_key(a), comparison_key(b)
        ta, tb = pg_at_once._token(ka), pg_at_once._token(kb)
        tokens += ta is not None
        if ka == kb and ta is not None and tb is not None:
            assert ta == tb, f"{a!r} and {b!r} are one value to a filter, but tokens {ta!r} and {tb!r}"
        if ta is not None and ta == tb:
            assert ka == kb, f"{a!r} and {b!r} share the token {ta!r}: only a missed grant, but a wrong token"
    assert tokens >= len(VALUES) * 25, "most kinds of value get a token"


def test_times_and_unknown_kinds_get_no_token() -> None:
    for value in (dt.datetime(2024, 1, 1), b"x", math.inf, Decimal("NaN"), (2, 1)):
        assert pg_at_once._token(comparison_key(value)) is None


def test_a_request_that_may_touch_any_partition_has_no_tokens(request_for: Request) -> None:  # noqa: F811
    assert pg_at_once.reach_text(request_for("a", "OPTIMIZE", None), 0) is None
    assert pg_at_once.reach_text(request_for("a", "UPDATE", "date = '2024-01-01' OR id = 7"), 0) is None


def test_a_request_pinned_to_partitions_keeps_its_tokens_with_its_revision(request_for: Request) -> None:  # noqa: F811
    request: LeaseRequest = request_for("a", "UPDATE", "country IN ('DE', 'FR') AND date = '2024-01-01'")
    text = pg_at_once.reach_text(request, 3)
    assert text is not None
    stored = json.loads(text)
    assert stored["r"] == 3 and stored["c"] == {"0": ["D:2024-01-01"], "1": ["s:DE", "s:FR"]}
    other = json.loads(pg_at_once.reach_text(request_for("b", "UPDATE", "country = 'IT'"), 0) or "{}")
    assert other["k"] == stored["k"] and other["c"] == {"1": ["s:IT"]}
