"""The ``s3`` tier: Delta tables on a real S3 API, written by delta-spark through ``s3a://``.

An S3-compatible server (moto's server mode, from PyPI) runs on 127.0.0.1 for the whole tier, and
the tier's one Spark session is started by the provider itself (``DeltaSparkHook`` in embedded
mode, with the storage connection below), so the connector jar (``hadoop-aws`` at pyspark's Hadoop
version, resolved from Maven Central into the Ivy cache), the endpoint and the keys reach Spark the
way they reach a user's job. The tier runs in its own pytest process (``make test`` runs it after
the others): its session must carry the connector and Delta's own S3 LogStore, not the gate
LogStore of the spark tier.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.demo import free_port

from ..servers import BIN, spawn, stop, wait_for

HERE = Path(__file__).resolve().parent
BUCKET = "lake"
CONN_ID = "lake_s3"
ACCESS_KEY, SECRET_KEY = "AKIDELTAOCCTEST", "delta-occ-test-secret"


@pytest.hookimpl(tryfirst=True)  # before tests/conftest.py checks that every test has its tier
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under this folder is in the ``s3`` tier (``make test-s3``: ``pytest tests -m s3``)."""
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.s3)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """moto's S3 API on 127.0.0.1 with one bucket; stopped at the end of the tier."""
    import boto3

    logs = tmp_path_factory.mktemp("moto")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = spawn([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], os.environ, logs / "moto.log")
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY,
                          aws_secret_access_key=SECRET_KEY, region_name="us-east-1")
    try:
        wait_for(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() is None, "moto_server",
                 logs, [server])
        client.create_bucket(Bucket=BUCKET)
        yield {"endpoint": endpoint, "client": client, "logs": logs}
    finally:
        stop(server)


@pytest.fixture(scope="session")
def s3_connection(s3_server: dict[str, Any]) -> Iterator[str]:
    """An Airflow ``aws`` connection to the server (environment), as a platform team would define it."""
    name = f"AIRFLOW_CONN_{CONN_ID.upper()}"
    os.environ[name] = json.dumps({"conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
                                   "extra": {"endpoint_url": s3_server["endpoint"], "region_name": "us-east-1"}})
    try:
        yield CONN_ID
    finally:
        os.environ.pop(name, None)


@pytest.fixture(scope="session")
def s3_spark(s3_connection: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The tier's Spark session, started by the provider's embedded mode with the storage connection."""
    from airflow_delta_occ.hooks.delta import DeltaSparkHook

    hook = DeltaSparkHook(None, mode="embedded", storage_conn_id=s3_connection)
    # This session is the only writer of the tier's tables: declared, so the hook does not refuse it.
    os.environ["AIRFLOW__DELTA_OCC__UNSAFE_S3_COMMITS"] = "warn"
    try:
        hook.use_storage(f"s3a://{BUCKET}/")
    finally:
        os.environ.pop("AIRFLOW__DELTA_OCC__UNSAFE_S3_COMMITS")
    spark = hook.get_spark()
    yield spark
    spark.stop()


@pytest.fixture
def s3_path(request: pytest.FixtureRequest) -> str:
    """A fresh table location in the bucket, named after the test."""
    return f"s3a://{BUCKET}/{request.node.name.replace('[', '_').replace(']', '')}"
