"""The partition tokens the PostgreSQL store compares on the server (``pg_at_once``): two values a filter holds
equal must never get different tokens, or the server would take two requests on one partition for apart."""

from __future__ import annotations

import datetime as dt
import itertools
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
    Decimal("1234567890123456789012345678901234567"), Decimal("1234567890123456789012345678901234568"),
    Decimal("12345678901234567890123456789012345670E-1"), Decimal("-0.000"), Decimal("-1.50"), Decimal("-15E-1"),
    "a\x00", "a", "\ud800",
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
    assert pg_at_once.reach_of(request_for("a", "OPTIMIZE", None), 0) is None
    assert pg_at_once.reach_of(request_for("a", "UPDATE", "date = '2024-01-01' OR id = 7"), 0) is None


def test_a_request_pinned_to_partitions_keeps_its_tokens_with_its_revision(request_for: Request) -> None:  # noqa: F811
    request: LeaseRequest = request_for("a", "UPDATE", "country IN ('DE', 'FR') AND date = '2024-01-01'")
    stored = pg_at_once.reach_of(request, 3)
    assert stored is not None
    de, fr, it = (pg_at_once._token(c) for c in ("DE", "FR", "IT"))
    assert stored["r"] == 3 and stored["c"] == {"0": ["D:2024-01-01"], "1": sorted([de, fr])}
    other = pg_at_once.reach_of(request_for("b", "UPDATE", "country = 'IT'"), 0)
    assert other is not None and other["k"] == stored["k"] and other["c"] == {"1": [it]}


def test_every_token_is_ascii_whatever_the_value() -> None:
    """PostgreSQL's JSON takes no NUL, and a database need not be UTF-8: a token must be storable anywhere."""
    for value in ("a\x00", "\ud800", "Zürich", "\u0000x", Decimal("-12.3400"), dt.date(2024, 2, 29), 7, -2.5):
        token = pg_at_once._token(comparison_key(value))
        assert token is not None and token.isascii() and "\x00" not in token


def test_decimal_tokens_do_not_depend_on_the_context_precision() -> None:
    import decimal

    values = [Decimal("1234567890123456789012345678901234567"), Decimal("1234567890123456789012345678901234568")]
    default = [pg_at_once._token(v) for v in values]
    with decimal.localcontext(decimal.Context(prec=5)):
        assert [pg_at_once._token(v) for v in values] == default
    assert default[0] != default[1]
