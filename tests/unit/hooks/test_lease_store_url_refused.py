"""A lease store URL that does not parse is refused with ``LeaseStoreError`` naming it without its password."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_delta_occ.exceptions import LeaseStoreError
from airflow_delta_occ.hooks.leases import store_url
from airflow_delta_occ.pools.leases.sql import SqlLeaseStore

pytestmark = pytest.mark.unit

SECRET = "hunter2-secret"


def _url(**fields: Any) -> str:
    base: dict[str, Any] = {"backend": None, "host": None, "port": None, "schema": None, "login": None,
                            "password": None, "extra": {}}
    return store_url(**{**base, **fields})


@pytest.mark.parametrize("url", [
    f"postgresql://u:{SECRET}@h:xx/db",
    f"postgresql+psycopg2://u:{SECRET}@db.internal:99999999999999999999x/leases",
    f"postgresql://u:{SECRET}@h:-1/db",
])
@pytest.mark.parametrize("password", [None, "from-the-field"])
def test_a_url_with_a_bad_port_names_the_url_without_its_password(url: str, password: str | None) -> None:
    with pytest.raises(LeaseStoreError) as info:
        _url(extra={"url": url}, password=password)
    message = str(info.value)
    assert "port must be a number from 1 to 65535" in message
    assert "@h:" in message or "@db.internal:" in message
    assert SECRET not in message and "from-the-field" not in message
    assert "***" in message


def test_the_store_refuses_a_bad_port_without_the_password() -> None:
    with pytest.raises(LeaseStoreError) as info:
        SqlLeaseStore(f"postgresql://u:{SECRET}@h:xx/db")
    assert SECRET not in str(info.value) and "postgresql://u:***@h:xx/db" in str(info.value)


@pytest.mark.parametrize("port", [65536, 70000, -5])
def test_a_form_port_out_of_range_is_refused(port: int) -> None:
    with pytest.raises(LeaseStoreError, match="port must be a number from 1 to 65535"):
        _url(host="db.internal", port=port, login="u", password=SECRET)


def test_text_that_is_no_url_is_refused_without_its_password() -> None:
    with pytest.raises(LeaseStoreError, match="not a SQLAlchemy URL") as info:
        _url(extra={"url": f"://u:{SECRET}@"})
    assert SECRET not in str(info.value)


def test_a_full_url_keeps_its_own_password_when_the_field_is_empty() -> None:
    # SQLAlchemy's str() of a URL masks the password: the store must get the real one.
    assert _url(extra={"url": f"postgresql+psycopg2://u:{SECRET}@h/db"}) == f"postgresql+psycopg2://u:{SECRET}@h/db"
