"""Tables on object storage: the URI schemes Spark users write, and the credentials to read them.

Spark names a store by its Hadoop connector (``s3a://``, ``abfss://``, ``gs://``, ``hdfs://``);
pyarrow, which the engine reads the log with, names them differently (``s3``, ``abfs``, ``gs``,
``hdfs``) and does not know ``s3a`` at all. ``parse_table_uri`` maps one to the other, and
``open_filesystem`` builds the pyarrow filesystem with explicit credentials, so the engine reads
the same table the Spark job writes, with the settings the job gets (see ``spark/storage.py`` for
the Spark side of the same settings).

Credentials are typed per store and never printed: secret fields are left out of ``repr``.
``None`` fields fall back to the store's own default chain (environment variables, instance
metadata, Application Default Credentials), as pyarrow and Hadoop do.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from datetime import UTC
from enum import StrEnum
from typing import Any
from urllib.parse import unquote, urlparse

from .errors import StorageError, UnsupportedStorageError


class StoreKind(StrEnum):
    """The object stores the engine reads; each member's value is the name pyarrow uses."""

    S3 = "s3"
    AZURE = "abfs"
    GCS = "gs"
    HDFS = "hdfs"


# Hadoop connector schemes -> the store behind them.
SCHEMES: dict[str, StoreKind] = {
    "s3": StoreKind.S3, "s3a": StoreKind.S3, "s3n": StoreKind.S3,
    "abfs": StoreKind.AZURE, "abfss": StoreKind.AZURE,
    "gs": StoreKind.GCS,
    "hdfs": StoreKind.HDFS,
}
# One spelling per store, for matching tables (pools): s3a://b/t and s3://b/t are one table, and so
# are abfs:// (no TLS) and abfss:// of one container.
CANONICAL_SCHEMES: dict[StoreKind, str] = {StoreKind.S3: "s3", StoreKind.AZURE: "abfss", StoreKind.GCS: "gs",
                                           StoreKind.HDFS: "hdfs"}
# The port a scheme's URIs mean when they name none: ``hdfs://nn/x`` is the namenode's RPC port 8020
# (Hadoop's default), ``abfss://`` is HTTPS. Buckets (s3, gs) take no port.
DEFAULT_PORTS: dict[str, int] = {"hdfs": 8020, "abfs": 80, "abfss": 443, "wasb": 80, "wasbs": 443, "http": 80,
                                 "https": 443}
# Schemes whose canonical form writes the default port out rather than leaving it off: HDFS namespaces
# are written with their port (in lease keys already stored, and in OpenLineage's naming spec).
_EXPLICIT_PORT_SCHEMES = frozenset({"hdfs"})
# Schemes whose user info is an Azure container (``container@account.dfs.core.windows.net``), not a user.
_CONTAINER_SCHEMES = frozenset({"abfs", "abfss", "wasb", "wasbs"})
_WILDCARDS = frozenset("*?[")  # pool patterns go through the same normal form


@dataclass(frozen=True, slots=True)
class S3Credentials:
    """An S3 API: AWS, or a compatible server (MinIO, Ceph, moto) through ``endpoint``.

    ``endpoint`` is a URL (``http://127.0.0.1:9000``); its scheme decides TLS. ``path_style``
    addresses buckets as ``endpoint/bucket`` (what most compatible servers need).
    """

    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str | None = None
    endpoint: str | None = None
    path_style: bool = False

    def __post_init__(self) -> None:
        if (self.access_key is None) != (self.secret_key is None):
            raise UnsupportedStorageError("S3 credentials need both an access key and a secret key, or neither")
        if self.session_token is not None and self.access_key is None:
            raise UnsupportedStorageError("an S3 session token needs the access key and secret key it belongs to")
        if self.endpoint is not None:
            try:
                parsed = urlparse(self.endpoint)
            except ValueError:  # an unclosed IPv6 bracket
                parsed = urlparse("")
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise UnsupportedStorageError("the S3 endpoint must be an http(s) URL such as http://127.0.0.1:9000, "
                                              f"got {redact_uri(self.endpoint)!r}")

    @property
    def kind(self) -> StoreKind:
        return StoreKind.S3


@dataclass(frozen=True, slots=True)
class AzureCredentials:
    """ADLS Gen2 (``abfss://container@account.dfs.core.windows.net/path``): an account key, a SAS
    token, or a service principal (``tenant_id``, ``client_id``, ``client_secret``)."""

    account_name: str | None = None
    account_key: str | None = field(default=None, repr=False)
    sas_token: str | None = field(default=None, repr=False)
    tenant_id: str | None = None
    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        principal = (self.tenant_id, self.client_id, self.client_secret)
        if any(v is not None for v in principal) and not all(v is not None for v in principal):
            raise UnsupportedStorageError("an Azure service principal needs tenant_id, client_id and client_secret")

    @property
    def kind(self) -> StoreKind:
        return StoreKind.AZURE


@dataclass(frozen=True, slots=True)
class GcsCredentials:
    """Google Cloud Storage: an OAuth ``access_token`` (minted by the Airflow side from a key file),
    or Application Default Credentials when it is ``None``. ``keyfile_path`` is for Spark's GCS
    connector only; the engine does not read key files itself."""

    access_token: str | None = field(default=None, repr=False)
    project_id: str | None = None
    keyfile_path: str | None = None
    endpoint: str | None = None

    @property
    def kind(self) -> StoreKind:
        return StoreKind.GCS


StorageCredentials = S3Credentials | AzureCredentials | GcsCredentials


@dataclass(frozen=True, slots=True)
class TableLocation:
    """A table URI taken apart: the store, its scheme as written, the account (Azure) or bucket or
    host, the root path inside the store (``bucket/key`` for S3 and GCS, ``container/path`` for
    Azure), and for Azure the endpoint host (``account.dfs.core.windows.net``, or a sovereign cloud's)."""

    uri: str
    kind: StoreKind
    scheme: str
    authority: str
    root: str
    host: str = ""


# Characters whose meaning differs between Hadoop's Path (which keeps them in the key, escaping
# ``%``), Java's URI and the engine's URL parsing (query, fragment, percent-escape): a URI holding
# one could name one object for Spark and another for the engine or a pool, so none is accepted.
_AMBIGUOUS = frozenset("?#%")
_AZURE_HOST = re.compile(r"(?P<account>[a-z0-9]+)\.dfs\.(?P<suffix>[a-z0-9.-]+[a-z0-9])(?::(?P<port>\d+))?")
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def store_scheme(table_uri: str) -> str | None:
    """The URI's scheme in lower case when it names an object store the engine knows, else ``None``
    (a local path, a ``file:`` URI, or an unknown scheme)."""
    scheme = urlparse(table_uri).scheme.lower()
    return scheme if scheme in SCHEMES else None


_USER_INFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(//)([^/?#]*@)", re.DOTALL)
_QUERY = re.compile(r"\?([A-Za-z0-9_.~-]+)=")  # ``?name=``: a query (a SAS token), never a pool wildcard
# Query parameters that carry credentials: an Azure SAS ``sig``, S3 presigned ``X-Amz-Signature`` /
# ``X-Amz-Security-Token``, tokens, keys, passwords.
_SECRET_PARAM = re.compile(r"sig|token|key|secret|pass|pwd|credential|auth", re.IGNORECASE)
# Stores without users: user info in their URIs is always a key (``s3a://KEYID:SECRET@bucket``).
_KEY_USER_SCHEMES = frozenset(s for s, kind in SCHEMES.items() if kind in (StoreKind.S3, StoreKind.GCS))
# Schemes whose user info names someone (an HDFS user) or something (an Azure container) without a password.
_NAMED_USER_SCHEMES = _CONTAINER_SCHEMES | {"hdfs", "file"}
REDACTED = "***"


def _split_secrets(uri: str) -> tuple[str, str, str, str, str]:
    """``uri`` as (text before the user info, the user info, text up to the query, the query, the rest):
    never raises, whatever the text (messages about malformed URIs need it most)."""
    match = _USER_INFO.match(uri)
    head, user, body = (f"{match[1]}:{match[2]}", match[3][:-1], uri[match.end():]) if match else ("", "", uri)
    start = body.find("?")
    if start < 0:
        return head, user, body, "", ""
    end = body.find("#", start)
    end = len(body) if end < 0 else end
    return head, user, body[:start + 1], body[start + 1:end], body[end:]


def uri_secrets(uri: str) -> tuple[str, ...]:
    """The parts of a location that are credentials, for a log masker: the password of its user info (and
    the user too on S3 and GCS, where it is a key id), and the values of its secret query parameters (a
    SAS token's ``sig``, with the whole query). Azure's ``container@`` is not one. Pure: the engine never
    imports Airflow, so the Airflow side registers these (``hooks.storage.mask_uri_secrets``)."""
    head, user, _, query, _ = _split_secrets(uri)
    scheme = head.partition(":")[0].lower()
    found: list[str] = []
    if user:
        name, colon, password = user.partition(":")
        found += [user, password] if colon else []
        if scheme in _KEY_USER_SCHEMES or (not colon and scheme not in _NAMED_USER_SCHEMES):
            found.append(name)  # a key id, or a lone token (``https://TOKEN@host``)
    values = [value for name, _, value in (p.partition("=") for p in query.split("&"))
              if value and _SECRET_PARAM.search(name)]
    if values:
        found += [query, *values, *(unquote(v) for v in values)]
    return tuple(dict.fromkeys(s for s in found if s))


def redact_uri(uri: str) -> str:
    """``uri`` for a message: its user info (but an Azure container's name) and its query values as ``***``.

    A URI that is refused for holding credentials must not carry them into the error, the task log
    and the UI; the rest of it (store, bucket, path) is what the reader needs to find the task."""
    head, user, body, query, tail = _split_secrets(uri)
    if user:
        container, colon, _ = user.partition(":")
        azure = head.partition(":")[0].lower() in _CONTAINER_SCHEMES
        user = (f"{container}:{REDACTED}" if colon else container) if azure else REDACTED
    if query:
        query = "&".join(f"{name}={REDACTED}" if eq else name
                         for name, eq, _ in (p.partition("=") for p in query.split("&")))
    return f"{head}{user}{'@' if user else ''}{body}{query}{tail}"


_LOCATION = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)(.*)", re.DOTALL)
_IPV6 = re.compile(r"(\[[0-9A-Fa-f:.]+\])(?::(.*))?", re.DOTALL)
_SPELLINGS: dict[str, str] = {scheme: CANONICAL_SCHEMES[kind] for scheme, kind in SCHEMES.items()}
MAX_PORT = 65535


#: ``scheme:`` at the start of a table location (two letters at least: never a Windows drive letter).
URI_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):(.*)", re.DOTALL)


def canonical_table(location: str) -> str:
    """The one spelling of a table location, a path or a URI: one physical table, one string.

    The lease key (``pools.config.normalize_table``), pool patterns and OpenLineage dataset names all
    come from it. A local path or ``file:`` URI becomes ``file:///abs/path``, with doubled ``/``
    removed and ``.``/``..`` resolved lexically (the filesystem is never read: the scheduler may not
    see the writer's disks); every other URI is ``canonical_location``'s spelling.

    Raises:
        UnsupportedStorageError: empty, a relative path (whose meaning depends on the writer's working
            directory), a ``file:`` URI on another host or with user info, or a URI
            ``canonical_location`` refuses.
    """
    text = location.strip()
    uri = URI_SCHEME.fullmatch(text)
    if uri is not None and uri.group(1).lower() != "file":
        return canonical_location(text)
    path = uri.group(2) if uri is not None else text
    if uri is not None and path.startswith("//"):
        host, _, local = path[2:].partition("/")
        if host.lower() not in ("", "localhost"):
            raise UnsupportedStorageError(f"{redact_uri(text)!r} is a file: URI on another host (or with user "
                                          "info); only local file: URIs are tables")
        path = "/" + local
    if not path.startswith("/"):
        raise UnsupportedStorageError(f"{redact_uri(text)!r} is a relative path; give an absolute path or a URI")
    return "file://" + posixpath.normpath(re.sub(r"/+", "/", path))


def canonical_location(uri: str) -> str:
    """The one spelling of a ``scheme://authority/path`` location: one physical table, one string.

    Lease keys (``pools.config.normalize_table``), pool patterns and OpenLineage dataset names all come
    from it, so no two spellings of one table are ever leased as two tables (which would grant two
    UPDATEs of one partition at once):

    * the scheme in lower case, one per store (``CANONICAL_SCHEMES``: ``s3a``/``s3n`` as ``s3``,
      ``abfs`` as ``abfss``);
    * the authority in lower case: host names, bucket names (S3 and GCS buckets are DNS names), Azure
      account names and container names (Azure keeps both in lower case) ignore case;
    * a scheme's default port (``DEFAULT_PORTS``) left off, except HDFS's, written out
      (``hdfs://nn/x`` is ``hdfs://nn:8020/x``, the form lease keys and OpenLineage already use);
    * doubled and trailing ``/`` removed; the path's case kept (object keys and HDFS paths are
      case-sensitive).

    Folding case can only make two different tables one (a legacy S3 bucket with capitals): they are
    then serialized more than needed, never run together. Wildcards of pool patterns are kept; a host
    pattern ending in ``*`` gets no default port (its ``*`` already matches any port).

    Raises:
        UnsupportedStorageError: no ``scheme://``, user info (credentials; Azure's ``container@`` is
            not), a port that is not a number up to 65535, ``#`` or ``%``, or ``.``/``..`` segments.
    """
    shown = redact_uri(uri)
    match = _LOCATION.fullmatch(uri)
    if match is None:
        raise UnsupportedStorageError(f"{shown!r}: expected <scheme>://<authority>/<path>")
    written, authority, path = match[1].lower(), match[2], match[3]
    if "#" in uri or "%" in uri:
        # The engine refuses these in table URIs (Hadoop and the engine would read different keys).
        raise UnsupportedStorageError(f"{shown!r} holds '#' or '%', which a table URI cannot hold")
    if _QUERY.search(uri):
        raise UnsupportedStorageError(f"{shown!r} holds a query ('?name='); a table URI cannot hold one, and "
                                      "credentials (a SAS token) belong in the storage connection")
    path = re.sub(r"/+", "/", path).strip("/")
    if any(part in (".", "..") for part in path.split("/")):
        raise UnsupportedStorageError(f"{shown!r} holds '.' or '..' segments; give the table's own path")
    scheme = _SPELLINGS.get(written, written)
    where = f"{scheme}://{_canonical_authority(written, authority, shown)}"
    return f"{where}/{path}" if path else where


def _canonical_authority(scheme: str, authority: str, shown: str) -> str:
    """``[container@]host[:port]`` in lower case with the port as ``canonical_location`` writes it
    (``shown``: the URI redacted, for messages)."""
    user, at, hostport = authority.rpartition("@")
    if at and (scheme not in _CONTAINER_SCHEMES or ":" in user):
        raise UnsupportedStorageError(f"{shown!r} holds user info; credentials do not belong in a table URI")
    host, port = _split_port(hostport, shown)
    default = DEFAULT_PORTS.get(scheme)
    if port == default:
        port = None
    if port is None and scheme in _EXPLICIT_PORT_SCHEMES and host and not host.endswith("*"):
        port = default
    container = f"{user.lower()}@" if at else ""
    return f"{container}{host.lower()}" + ("" if port is None else f":{port}")


def _split_port(hostport: str, shown: str) -> tuple[str, int | str | None]:
    """The host and its port: a number, the text of a pool pattern's wildcard port, or None (``shown``:
    the URI redacted, for messages)."""
    ipv6 = _IPV6.fullmatch(hostport)
    if ipv6 is not None:
        host, text = ipv6[1], ipv6[2]
    else:
        host, _, text = hostport.rpartition(":") if ":" in hostport else (hostport, "", None)
    if not text:
        return host, None
    if text.isascii() and text.isdigit() and int(text) <= MAX_PORT:
        return host, int(text)
    if _WILDCARDS.intersection(text):
        return host, text
    raise UnsupportedStorageError(f"{shown!r}: port {text!r} is not a port (a number from 0 to {MAX_PORT})")


def parse_table_uri(table_uri: str) -> TableLocation:
    """Split an object-store URI into the parts pyarrow needs.

    Only URIs that name the same object for Spark's Hadoop connector, pyarrow and a conflict pool are
    accepted: no ``?``, ``#`` or ``%`` (see ``_AMBIGUOUS``), no ``.``/``..`` segments, no user info
    (``key:secret@bucket`` would put a secret in every log line naming the table) except Azure's
    ``container@account.dfs.<endpoint>``.

    Raises:
        UnsupportedStorageError: an unknown scheme, one of the above, or a URI without a bucket,
            container or account.
    """
    shown = redact_uri(table_uri)  # every message quotes this: a refused URI may hold credentials
    try:
        parsed = urlparse(table_uri)
    except ValueError as exc:  # an unclosed IPv6 bracket
        raise UnsupportedStorageError(f"cannot read {shown!r}: not a URI ({exc})") from None
    scheme = parsed.scheme.lower()
    kind = SCHEMES.get(scheme)
    if kind is None:
        known = ", ".join(f"{s}://" for s in SCHEMES)
        raise UnsupportedStorageError(f"cannot read {shown!r}: the scheme {scheme!r} is not supported "
                                      f"(use a local path, file://, or one of {known})")
    rest = table_uri[len(scheme) + 1:]
    bad = sorted(_AMBIGUOUS.intersection(rest))
    if bad:
        raise UnsupportedStorageError(f"cannot read {shown!r}: it holds {' '.join(bad)}, which Spark's Hadoop "
                                      "connector and the engine read differently (query, fragment, escape), so "
                                      "they could name different objects; rename the path")
    if not rest.startswith("//"):
        raise UnsupportedStorageError(f"cannot read {shown!r}: expected {scheme}://<bucket or host>/<path>")
    path = parsed.path.strip("/")
    if any(part in (".", "..") for part in path.split("/")):
        # Hadoop's Path resolves these and the object store does not: Spark would write one table
        # while the engine (and a conflict pool) looked at another name.
        raise UnsupportedStorageError(f"cannot read {shown!r}: '.' and '..' segments are ambiguous on object "
                                      "stores; give the table's own path")
    if kind is StoreKind.AZURE:
        container, at, host = parsed.netloc.partition("@")
        match = _AZURE_HOST.fullmatch(host.lower())
        if not at or not container or ":" in container or match is None:
            raise UnsupportedStorageError(f"cannot read {shown!r}: an {scheme}:// URI names "
                                          "container@account.dfs.core.windows.net (or a sovereign cloud's "
                                          "dfs endpoint)")
        root = "/".join(p for p in (container, path) if p)
        return TableLocation(table_uri, kind, scheme, match["account"], root, host.lower())
    if "@" in parsed.netloc:
        raise UnsupportedStorageError(f"cannot read {shown!r}: credentials do not belong in a table URI (they "
                                      "would be logged with it); give them in the storage connection")
    if kind is StoreKind.HDFS:
        _split_port(parsed.netloc, shown)  # a port that is no number is refused here, not by pyarrow
        return TableLocation(table_uri, kind, scheme, parsed.netloc, "/" + path)
    if not parsed.netloc:
        raise UnsupportedStorageError(f"cannot read {shown!r}: the URI names no bucket")
    if _BUCKET.fullmatch(parsed.netloc) is None:
        raise UnsupportedStorageError(f"cannot read {shown!r}: {parsed.netloc!r} is not a bucket name")
    return TableLocation(table_uri, kind, scheme, parsed.netloc, "/".join(p for p in (parsed.netloc, path) if p))


def open_filesystem(location: TableLocation, credentials: StorageCredentials | None = None) -> Any:
    """A ``pyarrow.fs.FileSystem`` for the location's store, with explicit credentials when given.

    Raises:
        UnsupportedStorageError: credentials for another store than the URI's, or an Azure account
            that differs from the URI's.
        StorageError: pyarrow cannot open the store (for HDFS: no ``libhdfs``/``CLASSPATH`` here).
    """
    import pyarrow.fs as pafs

    if credentials is not None and credentials.kind is not location.kind:
        raise UnsupportedStorageError(f"{location.uri} is on {location.kind.name} but the storage credentials are "
                                      f"for {credentials.kind.name}")
    try:
        if location.kind is StoreKind.S3:
            return _s3(pafs, credentials if isinstance(credentials, S3Credentials) else S3Credentials())
        if location.kind is StoreKind.AZURE:
            return _azure(pafs, location, credentials if isinstance(credentials, AzureCredentials)
                          else AzureCredentials())
        if location.kind is StoreKind.GCS:
            return _gcs(pafs, credentials if isinstance(credentials, GcsCredentials) else GcsCredentials())
        host, _, port = location.authority.partition(":")
        return pafs.HadoopFileSystem(host or "default", int(port) if port else 0)
    except (OSError, RuntimeError, ValueError) as exc:  # pyarrow's ArrowException types derive from these
        raise StorageError(f"cannot open {location.kind.name} for {location.uri}: {exc}") from exc


def _s3(pafs: Any, creds: S3Credentials) -> Any:
    endpoint = urlparse(creds.endpoint) if creds.endpoint else None
    return pafs.S3FileSystem(
        access_key=creds.access_key, secret_key=creds.secret_key, session_token=creds.session_token,
        region=creds.region, endpoint_override=endpoint.netloc if endpoint else None,
        scheme=endpoint.scheme if endpoint else None, force_virtual_addressing=not creds.path_style and not endpoint)


def _azure(pafs: Any, location: TableLocation, creds: AzureCredentials) -> Any:
    if creds.account_name is not None and creds.account_name != location.authority:
        raise UnsupportedStorageError(f"{location.uri} is in account {location.authority!r} but the credentials are "
                                      f"for account {creds.account_name!r}")
    scheme = "http" if location.scheme == "abfs" else "https"
    # The endpoint the URI names (a sovereign cloud's, or an emulator's) rather than pyarrow's default
    # public-cloud host: the engine reads the account Spark writes.
    blob_host = location.host.replace(".dfs.", ".blob.", 1)
    return pafs.AzureFileSystem(location.authority, account_key=creds.account_key, sas_token=creds.sas_token,
                                tenant_id=creds.tenant_id, client_id=creds.client_id,
                                client_secret=creds.client_secret, dfs_storage_scheme=scheme,
                                blob_storage_scheme=scheme, dfs_storage_authority=location.host or None,
                                blob_storage_authority=blob_host or None)


def _gcs(pafs: Any, creds: GcsCredentials) -> Any:
    endpoint = urlparse(creds.endpoint) if creds.endpoint else None
    kwargs: dict[str, Any] = {"project_id": creds.project_id}
    if creds.access_token is not None:
        from datetime import datetime, timedelta

        # pyarrow needs an expiry with a token; a token minted for a task outlives the log read.
        kwargs.update(access_token=creds.access_token,
                      credential_token_expiration=datetime.now(UTC) + timedelta(minutes=55))
    if endpoint is not None:
        kwargs.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme)
    return pafs.GcsFileSystem(**kwargs)
