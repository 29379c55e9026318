"""``DeltaLeaseStoreHook``: the conflict pools' lease store, reached through an Airflow connection.

Connection type ``delta_occ_leases`` (default id ``delta_occ_leases``):

* PostgreSQL (several workers or hosts): host, port, schema (the database), login and password
  (masked by Airflow), extra ``{"backend": "postgresql"}`` (the default when a host is set);
* SQLite (one host): extra ``{"backend": "sqlite", "path": "/var/lib/airflow/delta_leases.db"}``;
* or a full SQLAlchemy URL in the extra ``url`` (its password is better kept in the password field,
  which replaces the URL's).

There is no silent default: a pool whose store is not configured fails with ``LeaseStoreError``
naming the connection, because a SQLite file per worker would let conflicting jobs run together.
The store itself (``pools.leases.sql``) takes a URL and imports no Airflow, so a trigger or a CLI
opens the same store from the same connection.

Below the hook, the rest of the Airflow side of conflict pools, shared by the operators and the
sensor: the pool a task names (from ``[delta_occ] pool_file``), the Airflow pool its task runs in,
the owner of a task try, and the table's lease key checked against the pool. Holding a lease
(waiting, heartbeat, release) is pure and lives in ``pools/holding.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_delta_occ import config
from airflow_delta_occ.exceptions import LeaseStoreError, PoolConfigError

if TYPE_CHECKING:
    from airflow_delta_occ.pools.config import Pool

BACKENDS = ("postgresql", "sqlite")


def store_url(*, backend: str | None, host: str | None, port: int | None, schema: str | None,
              login: str | None, password: str | None, extra: dict[str, Any]) -> str:
    """The SQLAlchemy URL a ``delta_occ_leases`` connection describes (pure, so it is tested without Airflow).

    Raises:
        LeaseStoreError: the connection names no store, an unknown backend, a URL that does not parse or a
            port out of range (the message never quotes a password).
    """
    import sqlalchemy as sa

    from airflow_delta_occ.pools.leases.urls import check_port, parse_url

    if extra.get("url"):
        url = parse_url(str(extra["url"]))
        if password:
            url = url.set(password=password)
        return url.render_as_string(hide_password=False)   # str() would mask the password the store needs
    chosen = (backend or extra.get("backend") or ("postgresql" if host else "")).lower()
    if chosen == "sqlite":
        path = extra.get("path") or host
        if not path or not str(path).startswith("/"):
            raise LeaseStoreError("a SQLite lease store needs an absolute file path in the extra 'path'")
        return f"sqlite:///{path}"
    if chosen == "postgresql":
        if not host:
            raise LeaseStoreError("a PostgreSQL lease store needs a host")
        check_port(port or None, f"connection to host {host!r}")   # 0: the form's empty port
        url = sa.engine.URL.create("postgresql+psycopg2", username=login or None, password=password or None,
                                   host=host, port=port or 5432, database=schema or None)
        return url.render_as_string(hide_password=False)
    raise LeaseStoreError(f"the lease store connection names no store: set extra 'backend' to one of "
                          f"{', '.join(BACKENDS)} (got {chosen!r}), or extra 'url'")


class DeltaLeaseStoreHook(BaseHook):
    """Opens the lease store a ``delta_occ_leases`` connection describes."""

    conn_name_attr = "lease_conn_id"
    default_conn_name = "delta_occ_leases"
    conn_type = "delta_occ_leases"
    hook_name = "Delta conflict pool lease store (airflow-delta-occ)"

    def __init__(self, lease_conn_id: str = default_conn_name, *, metadata_database: bool = False) -> None:
        """``metadata_database``: this process may read Airflow's metadata database (the ``airflow`` CLI):
        a connection kept there (``airflow connections add``, the UI) is found too. A task or a trigger
        finds it through the Task SDK (the API server) anyway; the CLI's SDK path reads only environment
        variables and configured secrets backends."""
        super().__init__()
        self.lease_conn_id = lease_conn_id
        self.metadata_database = metadata_database

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        from airflow_delta_occ.get_provider_info import LEASE_STORE_FORM

        return {key.replace("-", "_"): value for key, value in LEASE_STORE_FORM.items()}

    @functools.cached_property
    def url(self) -> str:
        """The store's SQLAlchemy URL.

        Raises:
            LeaseStoreError: the connection does not exist or names no store.
        """
        try:
            conn = self._connection()
        except AirflowNotFoundException as exc:
            raise LeaseStoreError(
                f"conflict pools need a lease store: create the Airflow connection {self.lease_conn_id!r} of type "
                "delta_occ_leases (PostgreSQL for several hosts, SQLite for one); see docs/pools.md") from exc
        return store_url(backend=None, host=conn.host, port=conn.port, schema=conn.schema, login=conn.login,
                         password=conn.password, extra=dict(conn.extra_dejson))

    def _connection(self) -> Any:
        try:
            return self.get_connection(self.lease_conn_id)
        except AirflowNotFoundException:
            if not self.metadata_database:
                raise
            from airflow.models.connection import Connection  # core: every secrets backend and the database

            return Connection.get_connection_from_secrets(self.lease_conn_id)

    def get_store(self) -> Any:
        """A ``SqlLeaseStore`` on the connection's database (tables are created on first use)."""
        from airflow_delta_occ.pools.leases.sql import SqlLeaseStore

        return SqlLeaseStore(self.url)

    def test_connection(self) -> tuple[bool, str]:
        """The UI's test button: open the store and list its leases."""
        try:
            store = self.get_store()
            try:
                held = len(store.holders())
            finally:
                store.close()
        except Exception as exc:  # the button reports any failure as text
            return False, str(exc)
        return True, f"lease store reachable; {held} leases held"


# -- the Airflow side of conflict pools -----------------------------------------------------------
def configured_pool(name: str) -> Pool | None:
    """The pool ``name`` of the pool file, or None when no pool file is configured here.

    Used at DAG parse time: a DAG processor without ``[delta_occ] pool_file`` cannot check the name,
    and the task still fails at run time (``required_pool``) if the worker has no pool file either.

    Raises:
        PoolConfigError: the pool file cannot be read, or has no pool ``name``; the message names it.
    """
    try:
        pools = config.pool_config()
        return None if pools is None else pools.get(name)
    except PoolConfigError as exc:
        raise PoolConfigError(f"conflict_pool={name!r}: {exc}") from exc


def required_pool(name: str) -> Pool:
    """The pool ``name``; at run time a pool file is needed (a task cannot be leased without one).

    Raises:
        PoolConfigError: no pool file is configured, it cannot be read, or it has no pool ``name``.
    """
    pool = configured_pool(name)
    if pool is None:
        raise PoolConfigError(f"conflict_pool={name!r}: no pool file is configured; set [delta_occ] pool_file "
                              "(see docs/pools.md)")
    return pool


def route_to_airflow_pool(kwargs: dict[str, Any], default_args: Mapping[str, Any] | None,
                          conflict_pool: str | None) -> None:
    """A task of a conflict pool runs in the pool's Airflow pool (so the scheduler caps its writers),
    unless the author (or the DAG's ``default_args``) chose a pool. The pool name is checked here, at
    parse time, when the pool file is configured. Used by every Delta operator and the sensor.

    Raises:
        PoolConfigError: the pool file cannot be read or has no such pool.
    """
    if conflict_pool is None:
        return
    pool = configured_pool(conflict_pool)
    if pool is not None and "pool" not in kwargs and "pool" not in (default_args or {}):
        kwargs["pool"] = pool.airflow_pool


def check_pooled_literal(conflict_pool: str | None, table: str | None) -> None:
    """At parse time: a literal table location (no template) of a task of a known pool must be in that pool,
    so the mistake fails the DAG's import, not a run. A catalog name (``table_name=``) is resolved by the
    catalog at run time; a templated location is checked once rendered (``pooled_table``).

    Raises:
        PoolConfigError: the pool file cannot be read, or the table is not in the pool.
    """
    from airflow_delta_occ.jobs.checks import templated

    if conflict_pool is None or not isinstance(table, str) or templated(table):
        return   # no location, an XComArg or another value resolved at run time, or a template
    pool = configured_pool(conflict_pool)
    if pool is not None:
        pooled_table(pool, table)


def pooled_table(pool: Pool, location: str) -> str:
    """The table's normalized location (its lease key), checked to belong to ``pool``.

    Raises:
        PoolConfigError: the table is not covered by the pool's patterns (leasing it there would not
            keep it apart from writers leased in its own pool, or in none).
    """
    from airflow_delta_occ.engine.object_store import redact_uri
    from airflow_delta_occ.hooks.storage import mask_uri_secrets
    from airflow_delta_occ.pools.config import normalize_table

    try:
        table = normalize_table(location)
    except ValueError as exc:
        mask_uri_secrets(location)  # credentials in the URI: shown as *** here, masked in the task's logs
        raise PoolConfigError(f"conflict_pool={pool.name!r}: table {redact_uri(location)!r}: {exc}") from exc
    if pool.matching_pattern(table) is None:
        raise PoolConfigError(f"table {table!r} is not in conflict pool {pool.name!r} (patterns: "
                              f"{', '.join(pool.tables)}); add it to the pool file or change conflict_pool")
    return table


def lease_owner(context: Mapping[str, Any]) -> str:
    """One string per task try: the same before and after a deferral (the try number does not change)."""
    ti = context["ti"]
    return (f"{ti.dag_id}/{ti.task_id}/{context['run_id']}/{getattr(ti, 'map_index', -1)}/"
            f"{int(getattr(ti, 'try_number', 1) or 1)}")
