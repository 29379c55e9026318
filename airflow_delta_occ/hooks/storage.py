"""Storage credentials from an Airflow connection: the connection types platform teams already keep.

A table on object storage is read twice: by the engine, before Spark starts (typing partitions,
planning footprints), and by the Spark job. Both take their credentials from one connection, named
by ``storage_conn_id=`` on the operator or sensor, or by the ``storage_conn_id`` extra of the
``delta_occ`` connection. The usual types are read as their own providers define them, without
needing those providers installed:

* ``aws``: login = access key id, password = secret access key; extras ``aws_session_token``,
  ``region_name``, ``endpoint_url`` (or ``service_config.s3.endpoint_url``) and
  ``config_kwargs.s3.addressing_style`` (``path`` for most S3-compatible servers; path style is
  the default when an endpoint is set).
* ``wasb``: login = account name and password = account key, or extra ``sas_token``; with extra
  ``tenant_id``, a service principal (login = client id, password = client secret, host = account).
* ``adls``: host = account name; password = account key, or a service principal with ``tenant_id``
  (login = client id, password = client secret).
* ``google_cloud_platform``: extras ``key_path`` (a service-account key file for Spark's GCS
  connector) and ``project``; the engine reads GCS with Application Default Credentials.

Without a connection the stores' own default chains apply (``AWS_*`` variables, instance roles).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_delta_occ.engine.errors import UnsupportedStorageError
from airflow_delta_occ.engine.object_store import (
    SCHEMES,
    AzureCredentials,
    GcsCredentials,
    S3Credentials,
    StorageCredentials,
    store_scheme,
    uri_secrets,
)
from airflow_delta_occ.exceptions import StorageConnectionError

STORAGE_CONN_TYPES = ("aws", "wasb", "adls", "google_cloud_platform")


def credentials_for(location: str, conn_id: str | None) -> StorageCredentials | None:
    """The credentials the engine reads ``location`` with: the connection's when the location is on
    an object store of the connection's kind, else ``None`` (local paths, or the store's defaults).

    Every table the operators and the sensor read passes here first, so credentials written into
    the location (which the engine then refuses) are registered with the log masker before anything
    else can log them (``mask_uri_secrets``).

    Raises:
        StorageConnectionError: the connection cannot be used.
    """
    mask_uri_secrets(location)
    if conn_id is None:
        return None
    scheme = store_scheme(location)
    if scheme is None:
        return None
    credentials = storage_credentials(conn_id)
    return credentials if credentials.kind is SCHEMES[scheme] else None


def storage_credentials(conn_id: str) -> StorageCredentials:
    """The typed credentials a storage connection holds.

    Raises:
        StorageConnectionError: no such connection, a type the provider cannot use, or settings it
            cannot apply (for example an assumed role, which the S3A connector needs more for).
    """
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException as exc:
        raise StorageConnectionError(f"storage connection {conn_id!r} does not exist") from exc
    extra = dict(conn.extra_dejson or {})
    try:
        credentials = credentials_from_fields(conn.conn_type or "", login=conn.login, password=conn.password,
                                              host=conn.host, extra=extra)
    except (UnsupportedStorageError, StorageConnectionError) as exc:
        raise StorageConnectionError(f"storage connection {conn_id!r}: {exc}") from exc
    _mask(credentials)
    return credentials


SECRET_FIELDS = ("secret_key", "session_token", "account_key", "sas_token", "client_secret", "access_token")


def _mask(credentials: StorageCredentials) -> None:
    """Register every secret with Airflow's log masker: the Spark job receives them as Hadoop settings
    (``fs.azure.account.key.<host>``, ``fs.s3a.session.token``) whose names the Spark provider's own
    masking (keys holding ``secret`` or ``password``) does not cover."""
    from airflow.sdk.log import mask_secret

    for name in SECRET_FIELDS:
        value = getattr(credentials, name, None)
        if value:
            mask_secret(value)


def mask_secret_confs(conf: Mapping[str, Any]) -> None:
    """Register the values of secret Spark confs (``spark.storage.is_secret_conf``: storage keys, tokens) with
    Airflow's log masker: a templated ``spark_conf`` is shown rendered in the UI, and names such as
    ``fs.azure.account.key.<host>`` are not among the ones Airflow masks by itself."""
    from airflow.sdk.log import mask_secret

    from airflow_delta_occ.spark.storage import split_secret_confs

    _, secrets = split_secret_confs({str(k): v for k, v in conf.items()})
    for value in secrets.values():
        if isinstance(value, str) and value:
            mask_secret(value)


def mask_uri_secrets(*locations: str | None) -> None:
    """Register the credentials a table or source URI holds (``s3a://KEYID:SECRET@bucket``, a SAS
    ``?sig=``) with Airflow's log masker. The engine refuses such URIs and its messages show them
    redacted; this hides them in every other log line of the task too (the engine stays free of
    Airflow, so the masking is done here)."""
    from airflow.sdk.log import mask_secret

    for location in locations:
        if isinstance(location, str):
            for secret in uri_secrets(location):
                mask_secret(secret)


def credentials_from_fields(conn_type: str, *, login: str | None, password: str | None, host: str | None,
                            extra: Mapping[str, Any]) -> StorageCredentials:
    """Credentials from a connection's fields (kept apart from the lookup so it is testable alone)."""
    if conn_type == "aws":
        return _aws(login, password, extra)
    if conn_type in ("wasb", "adls"):
        return _azure(conn_type, login, password, host, extra)
    if conn_type in ("google_cloud_platform", "gcpbigquery"):
        _refuse(extra, conn_type, ("keyfile_dict", "key_secret_name", "credential_config_file",
                                   "impersonation_chain"), "give key_path (a key file on the workers and the "
                                                           "cluster), or nothing for Application Default Credentials")
        return GcsCredentials(keyfile_path=_text(extra, "key_path", "extra__google_cloud_platform__key_path"),
                              project_id=_text(extra, "project", "extra__google_cloud_platform__project"))
    raise StorageConnectionError(f"connection type {conn_type!r} holds no storage credentials the provider can use; "
                                 f"use one of {', '.join(STORAGE_CONN_TYPES)}")


def _refuse(extra: Mapping[str, Any], conn_type: str, keys: tuple[str, ...], instead: str) -> None:
    """Refuse a connection that sets a way of authenticating the provider does not hand to Spark:
    ignoring it would read and write the table as another identity (the defaults) without a word."""
    for key in keys:
        if extra.get(key) or extra.get(f"extra__{conn_type}__{key}"):
            raise StorageConnectionError(f"extra {key!r} is not supported for Delta tables; {instead}")


def _text(extra: Mapping[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = extra.get(key)
        if value not in (None, ""):
            if not isinstance(value, str):
                raise StorageConnectionError(f"extra {key!r} must be text, got {type(value).__name__}")
            return value
    return None


def _aws(login: str | None, password: str | None, extra: Mapping[str, Any]) -> S3Credentials:
    _refuse(extra, "aws", ("role_arn", "assume_role_method", "profile_name"),
            "give access keys, or leave them out to use the workers' and the cluster's default chain")
    # As the Amazon provider does: the S3 service's own endpoint wins over the connection-wide one.
    endpoint = _text(_nested(extra, "service_config", "s3"), "endpoint_url") or _text(extra, "endpoint_url")
    style = _text(_nested(extra, "config_kwargs", "s3"), "addressing_style")
    if style not in (None, "path", "virtual", "auto"):
        raise StorageConnectionError(f"config_kwargs.s3.addressing_style must be path, virtual or auto, got {style!r}")
    return S3Credentials(access_key=login or None, secret_key=password or None,
                         session_token=_text(extra, "aws_session_token"),
                         region=_text(extra, "region_name", "region"), endpoint=endpoint,
                         path_style=style == "path" or (style is None and endpoint is not None))


def _nested(extra: Mapping[str, Any], *keys: str) -> Mapping[str, Any]:
    value: Any = extra
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _azure(conn_type: str, login: str | None, password: str | None, host: str | None,
           extra: Mapping[str, Any]) -> AzureCredentials:
    _refuse(extra, conn_type, ("connection_string", "shared_access_key", "managed_identity_client_id",
                               "workload_identity_tenant_id"),
            "give the account key, a SAS token (extra sas_token) or a service principal (extra tenant_id)")
    tenant = _text(extra, "tenant_id", f"extra__{conn_type}__tenant_id")
    account = (host or None) if conn_type == "adls" or tenant else (login or None)
    if account is not None and "." in account:  # a host such as account.dfs.core.windows.net
        account = account.split("//")[-1].split(".", 1)[0]
    if tenant is not None:
        return AzureCredentials(account_name=account, tenant_id=tenant, client_id=login or None,
                                client_secret=password or None)
    sas = _text(extra, "sas_token", f"extra__{conn_type}__sas_token")
    return AzureCredentials(account_name=account, account_key=None if sas else (password or None), sas_token=sas)
