"""A table, source or pool URI with credentials in it is refused without echoing them, and the Airflow side
registers them with the log masker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.log import redact

from airflow_delta_occ.engine import DeltaLog
from airflow_delta_occ.engine.errors import DeltaOccError
from airflow_delta_occ.engine.object_store import (
    S3Credentials,
    canonical_location,
    parse_table_uri,
    redact_uri,
    uri_secrets,
)
from airflow_delta_occ.engine.storage import resolve_table
from airflow_delta_occ.exceptions import PoolConfigError
from airflow_delta_occ.hooks.leases import pooled_table
from airflow_delta_occ.hooks.storage import credentials_for
from airflow_delta_occ.operators.lineage import dataset_name_for_location
from airflow_delta_occ.pools.config import Pool, load_pool_config, normalize_table

pytestmark = pytest.mark.unit

KEY_ID, KEY = "AKIAEXAMPLEKEYID9", "wJalrXUtnFEMIK7MDENGbPxRfiCYSECRET"
SIG = "SIGSECRETxyz123AbC"
PASSWORD = "hunter2PASSWORDz"

# (URI, the secret parts it holds)
URIS: list[tuple[str, tuple[str, ...]]] = [
    (f"s3a://{KEY_ID}:{KEY}@lake/sales", (KEY_ID, KEY)),
    (f"s3://{KEY_ID}:{KEY}@lake/sales", (KEY_ID, KEY)),
    (f"gs://oauth2:{KEY}@bucket/t", (KEY,)),
    (f"hdfs://alice:{PASSWORD}@namenode:8020/warehouse/t", (PASSWORD,)),
    (f"abfss://data@acct.dfs.core.windows.net/t?sv=2022-11-02&sp=rl&sig={SIG}", (SIG,)),
    (f"abfss://data@acct.dfs.core.windows.net/t?sv=2022-11-02&sig={SIG}%2B%3D", (SIG,)),
    (f"abfss://data:{KEY}@acct.dfs.core.windows.net/t", (KEY,)),
    (f"https://bob:{PASSWORD}@host/x", (PASSWORD,)),
    (f"file://bob:{PASSWORD}@host/data/t", (PASSWORD,)),
]


@pytest.fixture(autouse=True)
def fresh_masker() -> Iterator[None]:
    """Each test starts with an empty log masker, so a secret masked is one this test's code registered."""
    from airflow.sdk._shared.secrets_masker import _secrets_masker

    _secrets_masker().reset_masker()
    yield
    _secrets_masker().reset_masker()


def _assert_secret_free(text: str, secrets: tuple[str, ...]) -> None:
    for secret in secrets:
        assert secret not in text, text


# --- the pure parts --------------------------------------------------------------------------------

@pytest.mark.parametrize(("uri", "secrets"), URIS)
def test_redacted_uris_keep_the_location_and_lose_the_secrets(uri: str, secrets: tuple[str, ...]) -> None:
    shown = redact_uri(uri)
    _assert_secret_free(shown, secrets)
    assert "***" in shown
    registered = uri_secrets(uri)
    assert all(any(secret in part for part in registered) for secret in secrets), registered


def test_redaction_keeps_what_is_not_a_secret() -> None:
    assert redact_uri(f"s3a://{KEY_ID}:{KEY}@lake/sales") == "s3a://***@lake/sales"
    assert redact_uri(f"abfss://data@acct.dfs.core.windows.net/t?sv=1&sig={SIG}") == \
        "abfss://data@acct.dfs.core.windows.net/t?sv=***&sig=***"
    assert redact_uri(f"abfss://data:{KEY}@acct.dfs.core.windows.net/t") == "abfss://data:***@acct.dfs.core.windows.net/t"
    for plain in ("s3a://lake/sales", "abfss://data@acct.dfs.core.windows.net/t", "/data/t", "main.sales", "",
                  "hdfs://[::1/x", "s3://lake/sales_?"):
        assert redact_uri(plain) == plain
        assert uri_secrets(plain) == ()


# canonical_location is not asked about file: URIs (local paths are not its to judge).
@pytest.mark.parametrize(("uri", "secrets", "refuse"), [
    (uri, secrets, refuse) for uri, secrets in URIS
    for refuse in (parse_table_uri, DeltaLog.for_table, resolve_table, canonical_location)
    if not (refuse is canonical_location and uri.startswith("file:"))])
def test_the_engine_refuses_without_echoing(uri: str, secrets: tuple[str, ...], refuse: Callable[[str], Any]) -> None:
    with pytest.raises(DeltaOccError) as info:
        refuse(uri)
    _assert_secret_free(str(info.value), secrets)


def test_an_s3_endpoint_with_credentials_is_refused_without_echoing() -> None:
    with pytest.raises(DeltaOccError) as info:
        S3Credentials(endpoint=f"ftp://bob:{PASSWORD}@minio:9000")
    _assert_secret_free(str(info.value), (PASSWORD,))


@pytest.mark.parametrize(("uri", "secrets"), URIS)
def test_pools_refuse_without_echoing(tmp_path: Path, uri: str, secrets: tuple[str, ...]) -> None:
    with pytest.raises(ValueError) as info:
        normalize_table(uri)
    _assert_secret_free(str(info.value), secrets)
    with pytest.raises(PoolConfigError) as pool_info:
        Pool("p", (uri,))
    _assert_secret_free(str(pool_info.value), secrets)
    path = tmp_path / "pools.toml"
    path.write_text(f'[pools.p]\ntables = ["{uri}"]\n')
    with pytest.raises(PoolConfigError) as file_info:
        load_pool_config(path)
    _assert_secret_free(str(file_info.value), secrets)


@pytest.mark.parametrize(("uri", "secrets"), [u for u in URIS if not u[0].startswith("file:")])
def test_lineage_refuses_without_echoing(uri: str, secrets: tuple[str, ...]) -> None:
    with pytest.raises(DeltaOccError) as info:
        dataset_name_for_location(uri)
    _assert_secret_free(str(info.value), secrets)


# --- the Airflow side: refused, and masked in the task's logs --------------------------------------

@pytest.mark.parametrize(("uri", "secrets"), URIS)
def test_the_location_s_secrets_are_masked_when_the_engine_is_handed_one(uri: str, secrets: tuple[str, ...]) -> None:
    assert all(secret in redact(uri) for secret in secrets)   # nothing masked yet
    credentials_for(uri, None)
    for secret in secrets:
        assert secret not in redact(f"log line naming {uri}"), secret


@pytest.mark.parametrize(("uri", "secrets"), URIS)
def test_a_lease_for_such_a_table_is_refused_without_echoing(uri: str, secrets: tuple[str, ...]) -> None:
    with pytest.raises(PoolConfigError) as info:
        pooled_table(Pool("p", ("s3://lake/**",)), uri)
    _assert_secret_free(str(info.value), secrets)
    for secret in secrets:
        assert secret not in redact(uri)


def test_an_operator_on_such_a_table_fails_without_echoing(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_delta_occ.operators.delta import DeltaUpdateOperator

    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", "")
    uri, secrets = URIS[0]
    op = DeltaUpdateOperator(task_id="u", table=uri, set={"v": "1"})
    context = {"ti": SimpleNamespace(dag_id="d", task_id="u", map_index=-1, try_number=1, max_tries=2),
               "run_id": "manual__1"}
    with pytest.raises(DeltaOccError) as info:
        op.execute(context)
    _assert_secret_free(str(info.value), secrets)
    for secret in secrets:
        assert secret not in redact(f"the table {uri}")


@pytest.mark.parametrize(("uri", "secrets"), URIS)
def test_a_source_uri_s_secrets_are_masked_when_the_job_names_it(uri: str, secrets: tuple[str, ...]) -> None:
    """A MERGE or append source with credentials in it is refused before Spark starts; its secrets
    are masked in every later log line of the task too (issue #20)."""
    from airflow_delta_occ.hooks.delta import DeltaSparkHook

    assert all(secret in redact(uri) for secret in secrets)   # nothing masked yet
    with pytest.raises(DeltaOccError) as info:
        DeltaSparkHook(None, mode="embedded").use_storage("/lake/sales", uri)
    _assert_secret_free(str(info.value), secrets)
    for secret in secrets:
        assert secret not in redact(f"the source {uri}"), secret
