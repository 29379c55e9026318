"""The Spark side of object storage: Hadoop connector settings, connector jars, and the LogStore check.

The engine reads a table's log with the credentials of a storage connection
(``engine.object_store``); the Spark job must reach the same table with the same settings. This
module turns the one typed ``StorageCredentials`` into the Hadoop keys each connector reads (S3A,
ABFS, the GCS connector) and names the connector jars a session needs, so both sides stay in step.

It also holds the one check Delta cannot make for itself: on S3, Delta's default LogStore
(``S3SingleDriverLogStore``) gives mutual exclusion only inside one Spark driver. Two drivers
committing the same version both succeed and one commit is silently lost. Jobs that each start
their own driver (embedded and spark-submit modes) may therefore write an S3 table only through a
LogStore that coordinates drivers (``S3DynamoDBLogStore``), unless the platform says otherwise.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from airflow_delta_occ.config import UnsafeS3Commits
from airflow_delta_occ.engine.object_store import (
    AzureCredentials,
    GcsCredentials,
    S3Credentials,
    StorageCredentials,
    StoreKind,
    TableLocation,
    parse_table_uri,
    store_scheme,
)
from airflow_delta_occ.exceptions import ProviderConfigError, UnsafeLogStoreError

HADOOP_PREFIX = "spark.hadoop."
S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
MULTI_DRIVER_LOG_STORE = "io.delta.storage.S3DynamoDBLogStore"
#: The S3 LogStores that keep commits exclusive across Spark drivers (put-if-absent through DynamoDB).
MULTI_DRIVER_LOG_STORES = frozenset({MULTI_DRIVER_LOG_STORE})
REDACTION_CONF = "spark.redaction.regex"
#: Spark's default pattern, plus ABFS account keys, API keys, and the credentials of an OpenLineage
#: transport: ``spark.openlineage.transport[.transports.NAME].auth.*`` and ``...headers.*``, where the
#: OpenLineage provider puts an HTTP transport's API key and its custom headers (an ``Authorization``
#: header is a bearer token under a name no other part of the pattern catches).
REDACTION_REGEX = ("(?i)secret|password|token|access[.]?key|account[.]key|api[.]?key"
                   "|openlineage[.]transport[.](?:.+[.])?(?:auth|headers)[.]")


#: The environment variable that carries secret confs to a spark-submit driver running on the worker
#: (client mode), read by the runner when it builds its session: a command line is readable by every
#: user of the machine (``ps``), a process's environment only by its own user.
SECRET_CONF_ENV = "DELTA_OCC_SECRET_CONF"


def is_secret_conf(key: str) -> bool:
    """Whether a Spark conf key holds a secret (``REDACTION_REGEX``: Spark's redaction pattern widened
    to ABFS keys and OpenLineage transport credentials). Such a value must not be put on a command
    line, which every user of the machine can read."""
    return re.search(REDACTION_REGEX, key) is not None


def split_secret_confs(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``conf`` as (the confs a command line may carry, the secret ones), each in ``conf``'s order."""
    secrets = {key: value for key, value in conf.items() if is_secret_conf(key)}
    return {key: value for key, value in conf.items() if key not in secrets}, secrets


def with_redaction(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf``, with Spark's redaction pattern widened to ``REDACTION_REGEX`` when it holds a secret
    Spark's default pattern would show in its UI and event logs (an ABFS account key, an OpenLineage
    ``Authorization`` header). A pattern the confs already set is kept: it is the user's choice."""
    conf = dict(conf)
    if REDACTION_CONF not in conf and any(is_secret_conf(key) for key in conf):
        conf[REDACTION_CONF] = REDACTION_REGEX
    return conf


@dataclass(frozen=True)
class SparkStorageSettings:
    """What a Spark job needs to reach a table's store: Hadoop keys (without the ``spark.hadoop.``
    prefix) and the connector packages (Maven coordinates). Secrets are in ``hadoop``: never log it."""

    hadoop: Mapping[str, str] = field(default_factory=dict, repr=False)
    packages: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.hadoop or self.packages)

    def spark_conf(self) -> dict[str, str]:
        """The Hadoop keys as Spark confs (``spark.hadoop.fs.s3a.endpoint`` ...), for a new session
        or a ``spark-submit`` command line.

        Spark hides conf values whose key matches ``spark.redaction.regex`` in its UI and event logs;
        the default misses ABFS account keys (``fs.azure.account.key.<host>``), so the pattern is
        widened when a secret is present (see ``with_redaction``; a user's own ``spark_conf`` still wins).
        """
        return with_redaction({HADOOP_PREFIX + key: value for key, value in self.hadoop.items()})


def hadoop_version() -> str:
    """The Hadoop version the installed pyspark bundles (its ``hadoop-client-api`` jar), which the
    connector jars must match."""
    import pyspark

    jars = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar"))
    if not jars:
        raise ProviderConfigError("cannot tell the Hadoop version of the installed pyspark (no hadoop-client-api "
                                  "jar), which the object-store connector jars must match")
    return os.path.basename(jars[0])[len("hadoop-client-api-"):-len(".jar")]


def connector_packages(kinds: Iterable[StoreKind]) -> tuple[str, ...]:
    """The Hadoop connector jars for the stores, at the bundled Hadoop version. GCS is left out: its
    connector is published as a shaded classifier Spark's ``spark.jars.packages`` cannot name, so a
    platform installs it with the cluster (or passes it in ``spark.jars``)."""
    wanted = set(kinds)
    packages = []
    if StoreKind.S3 in wanted:
        packages.append(f"org.apache.hadoop:hadoop-aws:{hadoop_version()}")
    if StoreKind.AZURE in wanted:
        packages.append(f"org.apache.hadoop:hadoop-azure:{hadoop_version()}")
    return tuple(packages)


def storage_settings(locations: Iterable[str], credentials: StorageCredentials | None) -> SparkStorageSettings:
    """Settings for a job that reads or writes ``locations`` (table and source URIs; local paths and
    catalog-less names are ignored), with ``credentials`` for the stores they match.

    Credentials for a store none of the locations is on are not used (a platform-wide storage
    connection also serves jobs on local tables).

    Raises:
        UnsupportedStorageError: a malformed object-store URI.
    """
    parsed = [parse_table_uri(uri) for uri in locations if store_scheme(uri) is not None]
    hadoop: dict[str, str] = {}
    for location in parsed:
        if location.scheme in ("s3", "s3n"):  # OSS Spark has no s3:// filesystem: S3A serves it
            hadoop[f"fs.{location.scheme}.impl"] = S3A_FILESYSTEM
        if credentials is not None and credentials.kind is location.kind:
            hadoop.update(_hadoop_keys(location, credentials))
    return SparkStorageSettings(hadoop, connector_packages(loc.kind for loc in parsed))


def credential_settings(credentials: StorageCredentials) -> SparkStorageSettings:
    """Settings for the credentials' store before a table's location is known: a catalog lookup
    (``table_name=``) must already reach the store the catalog points at. Azure keys are per
    account, so they need the connection's account name."""
    hadoop: dict[str, str] = {}
    if not isinstance(credentials, AzureCredentials) or credentials.account_name is not None:
        account = credentials.account_name if isinstance(credentials, AzureCredentials) else ""
        hadoop = _hadoop_keys(TableLocation("", credentials.kind, "", account or "", ""), credentials)
    return SparkStorageSettings(hadoop, connector_packages([credentials.kind]))


def _hadoop_keys(location: TableLocation, creds: StorageCredentials) -> dict[str, str]:
    if isinstance(creds, S3Credentials):
        return _s3a(creds)
    if isinstance(creds, AzureCredentials):
        return _abfs(location, creds)
    return _gcs(creds)


def _s3a(creds: S3Credentials) -> dict[str, str]:
    keys: dict[str, str] = {}
    if creds.access_key is not None and creds.secret_key is not None:
        keys.update({"fs.s3a.access.key": creds.access_key, "fs.s3a.secret.key": creds.secret_key})
        if creds.session_token is not None:
            keys.update({"fs.s3a.session.token": creds.session_token,
                         "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"})
        else:
            keys["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    if creds.region is not None:
        keys["fs.s3a.endpoint.region"] = creds.region
    if creds.endpoint is not None:
        keys["fs.s3a.endpoint"] = creds.endpoint
        keys["fs.s3a.connection.ssl.enabled"] = str(creds.endpoint.startswith("https://")).lower()
    keys["fs.s3a.path.style.access"] = str(creds.path_style).lower()
    return keys


def _abfs(location: TableLocation, creds: AzureCredentials) -> dict[str, str]:
    # ABFS reads its per-account keys under the endpoint host the URI names (a sovereign cloud's too).
    host = location.host or f"{location.authority}.dfs.core.windows.net"
    if creds.client_id is not None:
        return {f"fs.azure.account.auth.type.{host}": "OAuth",
                f"fs.azure.account.oauth.provider.type.{host}":
                    "org.apache.hadoop.fs.azurebfs.oauth2.ClientCredsTokenProvider",
                f"fs.azure.account.oauth2.client.id.{host}": creds.client_id,
                f"fs.azure.account.oauth2.client.secret.{host}": str(creds.client_secret),
                f"fs.azure.account.oauth2.client.endpoint.{host}":
                    f"https://login.microsoftonline.com/{creds.tenant_id}/oauth2/token"}
    if creds.sas_token is not None:
        return {f"fs.azure.account.auth.type.{host}": "SAS",
                f"fs.azure.sas.token.provider.type.{host}":
                    "org.apache.hadoop.fs.azurebfs.sas.FixedSASTokenProvider",
                f"fs.azure.sas.fixed.token.{host}": creds.sas_token}
    if creds.account_key is not None:
        return {f"fs.azure.account.key.{host}": creds.account_key}
    return {}


def _gcs(creds: GcsCredentials) -> dict[str, str]:
    keys = {"fs.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem"}
    if creds.keyfile_path is not None:
        keys.update({"google.cloud.auth.type": "SERVICE_ACCOUNT_JSON_KEYFILE",
                     "google.cloud.auth.service.account.json.keyfile": creds.keyfile_path})
    if creds.project_id is not None:
        keys["fs.gs.project.id"] = creds.project_id
    return keys


def log_store_for(scheme: str, spark_conf: Mapping[str, str]) -> str | None:
    """The LogStore class ``spark_conf`` gives tables on ``scheme``, read as delta-spark reads it, or
    ``None`` for delta-spark's default (``S3SingleDriverLogStore`` on S3).

    delta-spark takes each key with or without the ``spark.`` prefix (never under ``spark.hadoop.``)
    and ``delta.logStore.class`` for every scheme in place of the per-scheme keys. It refuses a class
    key next to any per-scheme key, and a key set both ways with two values; so does this function,
    before a job starts, rather than judge a configuration Delta would not run.

    Raises:
        ProviderConfigError: a configuration delta-spark refuses.
    """
    def value(key: str) -> str | None:
        prefixed, bare = spark_conf.get(key), spark_conf.get(key.removeprefix("spark."))
        if prefixed is not None and bare is not None and prefixed != bare:
            raise ProviderConfigError(f"spark_conf sets {key}={prefixed!r} and {key.removeprefix('spark.')}={bare!r}; "
                                      "delta-spark refuses two values for one LogStore setting")
        return prefixed if prefixed is not None else bare

    classes = value("spark.delta.logStore.class")
    per_scheme = sorted(k for k in spark_conf if re.fullmatch(r"(spark\.)?delta\.logStore\.[^.]+\.impl", k))
    if classes is not None and per_scheme:
        raise ProviderConfigError(f"spark_conf sets delta.logStore.class and {', '.join(per_scheme)}; delta-spark "
                                  "refuses a LogStore class next to per-scheme LogStores: keep one")
    return classes if classes is not None else value(f"spark.delta.logStore.{scheme}.impl")


def unsafe_s3_commit(table_uri: str, mode: str, spark_conf: Mapping[str, str]) -> str | None:
    """Why commits to ``table_uri`` from this mode could be lost, or ``None`` when they cannot.

    Only S3 lacks put-if-absent among the stores Delta supports. Spark Connect runs every job in
    the server's one driver, where ``S3SingleDriverLogStore`` locks per table; embedded and
    spark-submit jobs each start a driver of their own, so they need a LogStore known to coordinate
    drivers (``MULTI_DRIVER_LOG_STORES``). Any other class, including a misspelt one, counts as unsafe:
    an allowlist fails closed.

    Raises:
        ProviderConfigError: a LogStore configuration delta-spark refuses (see ``log_store_for``).
    """
    scheme = store_scheme(table_uri)
    if scheme is None or parse_table_uri(table_uri).kind is not StoreKind.S3 or mode == "connect":
        return None
    store = log_store_for(scheme, spark_conf)
    if store in MULTI_DRIVER_LOG_STORES:
        return None
    return (f"{table_uri} is on S3 and {mode} mode starts a Spark driver per job, but the LogStore for {scheme}:// is "
            f"{store or 'delta-spark default S3SingleDriverLogStore'}, which is not known to keep commits exclusive "
            "across drivers: two jobs committing the same version could both succeed and one commit would be lost. "
            f"Configure spark.delta.logStore.{scheme}.impl={MULTI_DRIVER_LOG_STORE} (with "
            "io.delta:delta-storage-s3-dynamodb) in the delta_occ connection's spark_conf, run the jobs through one "
            "Spark Connect server, or, if only one job ever writes this table at a time, set [delta_occ] "
            "unsafe_s3_commits = warn")


def check_s3_commits(table_uri: str, mode: str, spark_conf: Mapping[str, str], policy: UnsafeS3Commits) -> str | None:
    """Refuse (``policy="refuse"``) or return the warning for a job whose S3 commits could be lost.

    Raises:
        UnsafeLogStoreError: the commit could be lost and the policy is to refuse.
    """
    reason = unsafe_s3_commit(table_uri, mode, spark_conf)
    if reason is not None and policy == "refuse":
        raise UnsafeLogStoreError(reason + "; nothing was written")
    return reason
