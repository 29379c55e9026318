"""The lease store connection's URL: PostgreSQL from the form's fields, SQLite from a path, never a silent default."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_delta_occ.exceptions import LeaseStoreError
from airflow_delta_occ.hooks.leases import store_url

pytestmark = pytest.mark.unit


def _url(**fields: Any) -> str:
    base: dict[str, Any] = {"backend": None, "host": None, "port": None, "schema": None, "login": None,
                            "password": None, "extra": {}}
    return store_url(**{**base, **fields})


def test_postgresql_from_the_form_fields_with_the_password_field() -> None:
    url = _url(host="db.internal", port=6432, schema="leases", login="airflow", password="s3cr/t")
    assert url == "postgresql+psycopg2://airflow:s3cr%2Ft@db.internal:6432/leases"


def test_sqlite_needs_an_absolute_path() -> None:
    assert _url(extra={"backend": "sqlite", "path": "/var/lib/airflow/leases.db"}) == \
        "sqlite:////var/lib/airflow/leases.db"
    with pytest.raises(LeaseStoreError, match="absolute file path"):
        _url(extra={"backend": "sqlite", "path": "leases.db"})


def test_a_full_url_takes_the_password_field() -> None:
    assert _url(extra={"url": "postgresql+psycopg2://u@h/db"}, password="pw") == "postgresql+psycopg2://u:pw@h/db"


@pytest.mark.parametrize("fields,message", [
    ({}, "names no store"),
    ({"extra": {"backend": "mysql"}}, "names no store"),
    ({"extra": {"backend": "postgresql"}}, "needs a host"),
])
def test_a_connection_that_names_no_store_is_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(LeaseStoreError, match=message):
        _url(**fields)
