"""Delta tables on a real S3 API: delta-spark writes through ``s3a://``, the engine reads the same log
with credentials from an Airflow connection, and an operator MERGEs on it through the embedded mode."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_delta_occ.engine import DeltaLog, StorageError
from airflow_delta_occ.engine.storage import PyArrowStorage
from airflow_delta_occ.exceptions import UnsafeLogStoreError
from airflow_delta_occ.hooks.storage import storage_credentials
from airflow_delta_occ.operators.delta import DeltaMergeOperator

from ..spark.jobs import context, create_sales, rows
from .conftest import BUCKET


def _spark_files(spark: Any, path: str, where: str = "true") -> set[str]:
    """The data files delta-spark reads for ``where``, as paths relative to the table root."""
    names = spark.sql(f"SELECT DISTINCT input_file_name() AS f FROM delta.`{path}` WHERE {where}").collect()
    return {r["f"].split(path.split("://", 1)[1] + "/", 1)[1] for r in names}


def test_engine_reads_the_table_spark_wrote_with_the_connections_credentials(
        s3_spark: Any, s3_connection: str, s3_path: str) -> None:
    create_sales(s3_spark, s3_path)
    s3_spark.sql(f"UPDATE delta.`{s3_path}` SET v = 7 WHERE country = 'FR'")
    log = DeltaLog.for_table(s3_path, credentials=storage_credentials(s3_connection))
    assert isinstance(log.storage, PyArrowStorage)
    snapshot = log.snapshot()
    history = s3_spark.sql(f"DESCRIBE HISTORY delta.`{s3_path}`").collect()
    assert snapshot.version == max(r["version"] for r in history) == 2
    assert snapshot.partition_columns == ("date", "country")
    assert {f.path for f in snapshot.files()} == _spark_files(s3_spark, s3_path)
    de = {f.path for f in snapshot.files_matching("country = 'DE' AND date = '2024-01-01'")}
    assert de == _spark_files(s3_spark, s3_path, "country = 'DE'") and de
    assert [c.version for c in log.commits_after(0)] == [1, 2]


def test_a_missing_bucket_or_an_unreachable_store_is_typed_and_names_the_table(s3_connection: str) -> None:
    from airflow_delta_occ.engine import TableNotFoundError
    from airflow_delta_occ.engine.object_store import S3Credentials

    good = storage_credentials(s3_connection)
    with pytest.raises(TableNotFoundError, match=f"{BUCKET}-missing/sales"):
        DeltaLog.for_table(f"s3a://{BUCKET}-missing/sales", credentials=good).snapshot()
    from airflow_delta_occ.demo import free_port

    nowhere = S3Credentials(access_key="a", secret_key="b", endpoint=f"http://127.0.0.1:{free_port()}",
                            region="us-east-1", path_style=True)
    with pytest.raises(StorageError, match=f"cannot list {BUCKET}/sales/_delta_log: .*Could not connect"):
        DeltaLog.for_table(f"s3a://{BUCKET}/sales", credentials=nowhere).snapshot()


def test_operator_merges_on_s3_through_the_embedded_mode(s3_spark: Any, s3_connection: str, s3_path: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    create_sales(s3_spark, s3_path)
    src = f"s3a://{BUCKET}/sources/{s3_path.rsplit('/', 1)[1]}"
    s3_spark.createDataFrame([(1, 10, "2024-01-01", "DE"), (9, 90, "2024-01-01", "DE")],
                             "id INT, v INT, date STRING, country STRING") \
        .selectExpr("id", "v", "CAST(date AS DATE) AS date", "country").write.format("delta").save(src)
    log = DeltaLog.for_table(s3_path, credentials=storage_credentials(s3_connection))
    before = log.snapshot()
    fr_files = {f.path for f in before.files_matching("country = 'FR'")}

    def merge(task_id: str) -> DeltaMergeOperator:
        return DeltaMergeOperator(task_id=task_id, table=s3_path, source=src, merge_condition="t.id = s.id",
                                  partitions={"date": "2024-01-01", "country": "DE"}, storage_conn_id=s3_connection)

    # Each embedded task starts its own driver, and Delta's default S3 LogStore is exclusive only
    # inside one: refused before anything is written.
    with pytest.raises(UnsafeLogStoreError, match="S3DynamoDBLogStore"):
        merge("refused").execute(context("refused"))
    assert log.latest_version() == before.version

    monkeypatch.setenv("AIRFLOW__DELTA_OCC__UNSAFE_S3_COMMITS", "warn")
    result = merge("m").execute(context("m"))
    assert result["confirmed"] and result["version"] == before.version + 1
    assert int(result["metrics"]["numTargetRowsUpdated"]) == 1 and int(result["metrics"]["numTargetRowsInserted"]) == 1
    assert rows(s3_spark, s3_path) == [(1, 10, "DE"), (2, 0, "DE"), (3, 0, "FR"), (4, 0, "FR"), (9, 90, "DE")]
    after = log.snapshot()
    assert {f.path for f in after.files_matching("country = 'FR'")} == fr_files  # the other partition untouched
    assert after.version == result["version"]


def test_s3_scheme_is_served_by_s3a(s3_spark: Any, s3_connection: str, s3_path: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``s3://`` (what AWS users write) reaches the same bucket: the engine through pyarrow, Spark through
    S3A mapped by the provider (OSS Spark has no s3:// filesystem of its own)."""
    create_sales(s3_spark, s3_path)
    s3_uri = s3_path.replace("s3a://", "s3://", 1)
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__UNSAFE_S3_COMMITS", "warn")
    result = DeltaMergeOperator(task_id="s3", table=s3_uri, source_query="SELECT 2 AS id, 5 AS v, "
                                "DATE'2024-01-01' AS date, 'DE' AS country", merge_condition="t.id = s.id",
                                clauses=[{"kind": "matched_update", "set": {"v": "s.v"}}],
                                partitions={"date": "2024-01-01", "country": "DE"},
                                storage_conn_id=s3_connection).execute(context("s3"))
    assert result["confirmed"] and result["table"] == s3_uri
    assert rows(s3_spark, s3_path) == [(1, 0, "DE"), (2, 5, "DE"), (3, 0, "FR"), (4, 0, "FR")]


def test_catalog_table_on_s3(s3_spark: Any, s3_connection: str, s3_path: str,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``table_name=``: the catalog gives the s3a:// location, the engine reads its log with the connection."""
    create_sales(s3_spark, s3_path)
    s3_spark.sql(f"CREATE TABLE default.sales_on_s3 USING delta LOCATION '{s3_path}'")
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__UNSAFE_S3_COMMITS", "warn")
    result = DeltaMergeOperator(task_id="cat", table_name="default.sales_on_s3", storage_conn_id=s3_connection,
                                source_query="SELECT 3 AS id, 33 AS v, DATE'2024-01-01' AS date, 'FR' AS country",
                                merge_condition="t.id = s.id",
                                clauses=[{"kind": "matched_update", "set": {"v": "s.v"}}],
                                partitions={"date": "2024-01-01", "country": "FR"}).execute(context("cat"))
    assert result["confirmed"] and result["table"] == "default.sales_on_s3"
    assert rows(s3_spark, s3_path) == [(1, 0, "DE"), (2, 0, "DE"), (3, 33, "FR"), (4, 0, "FR")]


def test_storage_settings_come_from_the_delta_occ_connections_storage_conn_id(
        s3_spark: Any, s3_server: dict[str, Any], s3_connection: str, s3_path: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``storage_conn_id=`` on the operator: the ``delta_occ`` connection's ``storage_conn_id`` extra
    names the storage connection, whose endpoint and keys the engine reads the log with and the job
    gets. The table is copied into a bucket Spark has never opened, and the session's own S3 settings
    are pointed at nothing first: only the job's settings, taken from the connection, can reach it."""
    from airflow_delta_occ.demo import free_port
    from airflow_delta_occ.hooks.delta import DeltaSparkHook

    create_sales(s3_spark, s3_path)
    client, bucket = s3_server["client"], f"{BUCKET}-via-conn"
    client.create_bucket(Bucket=bucket)
    prefix = s3_path.split(f"{BUCKET}/", 1)[1] + "/"
    for obj in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]:
        client.copy_object(Bucket=bucket, Key=obj["Key"], CopySource={"Bucket": BUCKET, "Key": obj["Key"]})
    table = f"s3a://{bucket}/{prefix.rstrip('/')}"
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_LAKE", json.dumps(
        {"conn_type": "delta_occ", "extra": {"mode": "embedded", "storage_conn_id": s3_connection}}))

    hook = DeltaSparkHook("delta_occ_lake")
    assert hook.storage_conn_id == s3_connection
    snapshot = DeltaLog.for_table(table, credentials=hook.credentials_for(table)).snapshot()
    assert snapshot.version == 1 and snapshot.partition_columns == ("date", "country")
    assert {f.path for f in snapshot.files()} == _spark_files(s3_spark, s3_path)  # the copy is the table

    hadoop = s3_spark.sparkContext._jsc.hadoopConfiguration()
    keys = ("fs.s3a.endpoint", "fs.s3a.access.key", "fs.s3a.secret.key")
    saved = {key: hadoop.get(key) for key in keys}
    assert saved["fs.s3a.endpoint"] == s3_server["endpoint"]
    for key, value in zip(keys, (f"http://127.0.0.1:{free_port()}", "nobody", "nothing"), strict=True):
        hadoop.set(key, value)
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__UNSAFE_S3_COMMITS", "warn")
    try:
        op = DeltaMergeOperator(task_id="via_conn", table=table, delta_conn_id="delta_occ_lake",
                                source_query="SELECT 1 AS id, 11 AS v, DATE'2024-01-01' AS date, 'DE' AS country",
                                merge_condition="t.id = s.id",
                                clauses=[{"kind": "matched_update", "set": {"v": "s.v"}}],
                                partitions={"date": "2024-01-01", "country": "DE"})
        result = op.execute(context("via_conn"))
        job_settings = {key: hadoop.get(key) for key in keys}
    finally:
        for key, value in saved.items():
            hadoop.set(key, value)
    assert op.storage_conn_id is None and op.hook.storage_conn_id == s3_connection
    assert job_settings == saved  # the job's S3 settings are the storage connection's
    assert result["confirmed"] and result["version"] == 2
    assert int(result["metrics"]["numTargetRowsUpdated"]) == 1
    assert DeltaLog.for_table(table, credentials=hook.credentials_for(table)).latest_version() == 2
    assert rows(s3_spark, table) == [(1, 11, "DE"), (2, 0, "DE"), (3, 0, "FR"), (4, 0, "FR")]
    assert rows(s3_spark, s3_path) == [(1, 0, "DE"), (2, 0, "DE"), (3, 0, "FR"), (4, 0, "FR")]  # the original


async def _first_event(trigger: Any, timeout: float = 30.0) -> dict[str, Any]:
    """The trigger's first event, run here as the triggerer would run it."""
    events = trigger.run()
    try:
        event = await asyncio.wait_for(anext(events), timeout)
    finally:
        await events.aclose()
    payload: dict[str, Any] = event.payload
    return payload


@pytest.fixture
def s3_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A conflict pool over the bucket (``s3://`` in the pool file matches the jobs' ``s3a://``) and a SQLite
    lease store behind the ``delta_occ_leases`` connection, as a platform team would set them up."""
    from airflow_delta_occ.pools.leases.sql import SqlLeaseStore

    pools = tmp_path / "pools.toml"
    pools.write_text(f'[pools.lake]\ntables = ["s3://{BUCKET}/**"]\nlease_ttl = "30s"\nheartbeat = "0.5s"\n')
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__POOL_FILE", str(pools))
    db = tmp_path / "leases.db"
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_LEASES", json.dumps(
        {"conn_type": "delta_occ_leases", "extra": {"backend": "sqlite", "path": str(db)}}))
    monkeypatch.setenv("AIRFLOW__DELTA_OCC__UNSAFE_S3_COMMITS", "warn")
    store = SqlLeaseStore(f"sqlite:///{db}")
    yield store
    store.close()


def _hold(store: Any, table: str, snapshot: Any, owner: str, country: str) -> str:
    """A lease held by another writer on one partition (an UPDATE there), planned on ``snapshot``."""
    from airflow_delta_occ.engine.planner import TableState, plan_footprint
    from airflow_delta_occ.pools.config import normalize_table
    from airflow_delta_occ.pools.requests import LeaseRequest

    state = store.acquire(LeaseRequest.of(pool="lake", table=normalize_table(table), owner=owner,
                                          footprint=plan_footprint(snapshot, "UPDATE", f"country = '{country}'"),
                                          table_state=TableState.of(snapshot), ttl=60.0))
    assert state.granted
    return str(state.request_id)


def test_conflict_pool_on_an_s3_table_plans_from_the_s3_log_and_leases(
        s3_spark: Any, s3_connection: str, s3_path: str, s3_pool: Any) -> None:
    """``conflict_pool=`` on an ``s3a://`` table: the footprint is planned from the S3 log (the audit's
    summary names the DE files the engine read there), a holder on DE makes the MERGE defer while a
    holder on FR does not, the real lease trigger sees the grant, and the resumed task runs the MERGE
    with the lease renewed and releases it."""
    import threading

    from airflow.sdk.exceptions import TaskDeferred

    from airflow_delta_occ.pools.config import normalize_table
    from airflow_delta_occ.pools.requests import AuditKind
    from airflow_delta_occ.triggers.lease import DeltaLeaseTrigger

    store = s3_pool
    create_sales(s3_spark, s3_path)
    log = DeltaLog.for_table(s3_path, credentials=storage_credentials(s3_connection))
    snapshot = log.snapshot()
    de_files = {f.path for f in snapshot.files_matching("country = 'DE' AND date = '2024-01-01'")}
    assert de_files and de_files == _spark_files(s3_spark, s3_path, "country = 'DE'")
    fr_holder = _hold(store, s3_path, snapshot, "job-fr", "FR")
    de_holder = _hold(store, s3_path, snapshot, "job-de", "DE")

    def merge() -> DeltaMergeOperator:
        return DeltaMergeOperator(task_id="pooled", table=s3_path, storage_conn_id=s3_connection, conflict_pool="lake",
                                  deferrable=True,
                                  source_query="SELECT 2 AS id, 22 AS v, DATE'2024-01-01' AS date, 'DE' AS country",
                                  merge_condition="t.id = s.id",
                                  clauses=[{"kind": "matched_update", "set": {"v": "s.v"}}],
                                  partitions={"date": "2024-01-01", "country": "DE"})

    with pytest.raises(TaskDeferred) as deferred:
        merge().execute(context("pooled"))
    trigger = deferred.value.trigger
    assert isinstance(trigger, DeltaLeaseTrigger) and deferred.value.method_name == "execute_complete"
    table = normalize_table(s3_path)
    assert table == s3_path.replace("s3a://", "s3://", 1)
    [waiter] = store.waiters()
    assert (waiter.request_id, waiter.owner, waiter.table) == (trigger.request_id, trigger.owner, table)
    # Planned from the S3 log: the files of DE the engine read there, at the version it read.
    assert f"planned at version {snapshot.version}; reads {len(de_files)} files in country=DE,date=2024-01-01" \
        in waiter.summary, waiter.summary
    assert "writes into country=DE,date=2024-01-01" in waiter.summary

    timer = threading.Timer(0.5, store.release, (de_holder, "job-de"))
    timer.start()
    event = asyncio.run(_first_event(trigger))
    timer.join()
    assert event["status"] == "granted" and event["request_id"] == trigger.request_id
    result = merge().execute_complete(context("pooled"), event=event)  # a new instance, as Airflow resumes
    assert result["confirmed"] and result["version"] == snapshot.version + 1
    assert result["lease"]["pool"] == "lake" and result["lease"]["waited_for"] == ["job-de"]
    assert result["lease"]["lost"] is False
    assert rows(s3_spark, s3_path) == [(1, 0, "DE"), (2, 22, "DE"), (3, 0, "FR"), (4, 0, "FR")]
    kinds = [e.kind for e in store.history(pool="lake", table=table) if e.request_id == trigger.request_id]
    assert kinds[:2] == [AuditKind.REQUEST, AuditKind.GRANT] and kinds[-1] is AuditKind.RELEASE, kinds
    assert AuditKind.RENEW in kinds  # renewed at the hand-over (and by the heartbeat while the job ran)
    # The FR holder, whose footprint is disjoint, held its lease throughout and still does.
    assert [h.request_id for h in store.holders()] == [fr_holder]


def test_conflict_sensor_on_an_s3_table_plans_from_the_s3_log(
        s3_spark: Any, s3_connection: str, s3_path: str, s3_pool: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``DeltaConflictSensor`` on an ``s3a://`` table, with the storage connection taken from the
    ``delta_occ`` connection as for its writer: it plans the writer's footprint from the S3 log, defers
    behind a conflicting holder (the trigger's own wait is proven in the unit tier), and is granted at
    once beside a disjoint one, holding the lease until ``DeltaLeaseReleaseOperator`` releases it."""
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_delta_occ.pools.requests import AuditKind
    from airflow_delta_occ.sensors import DeltaConflictSensor, DeltaLeaseReleaseOperator
    from airflow_delta_occ.triggers.lease import DeltaLeaseTrigger

    store = s3_pool
    monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_LAKE", json.dumps(
        {"conn_type": "delta_occ", "extra": {"mode": "embedded", "storage_conn_id": s3_connection}}))
    create_sales(s3_spark, s3_path)
    s3_spark.sql(f"INSERT INTO delta.`{s3_path}` VALUES (5, 0, DATE'2024-01-02', 'DE')")  # one more DE partition
    snapshot = DeltaLog.for_table(s3_path, credentials=storage_credentials(s3_connection)).snapshot()
    assert snapshot.version == 2
    fr_files = {f.path for f in snapshot.files_matching("country = 'FR'")}
    assert fr_files == _spark_files(s3_spark, s3_path, "country = 'FR'")
    de_files = {f.path for f in snapshot.files_matching("country = 'DE' AND date = '2024-01-01'")}
    assert de_files and len(snapshot.files_matching("country = 'DE'")) > len(de_files)
    _hold(store, s3_path, snapshot, "job-de", "DE")

    def sensor(task_id: str, country: str) -> DeltaConflictSensor:
        return DeltaConflictSensor(task_id=task_id, table=s3_path, operation="merge", conflict_pool="lake",
                                   partitions={"date": "2024-01-01", "country": country},
                                   delta_conn_id="delta_occ_lake", poke_interval=0.5, lease_ttl=120)

    with pytest.raises(TaskDeferred) as deferred:
        sensor("wait_de", "DE").execute(context("wait_de"))
    assert isinstance(deferred.value.trigger, DeltaLeaseTrigger)
    [waiter] = store.waiters()
    assert waiter.request_id == deferred.value.trigger.request_id
    assert (f"planned at version 2; reads {len(de_files)} files in country=DE,date=2024-01-01"
            in waiter.summary), waiter.summary

    lease = sensor("wait_fr", "FR").execute(context("wait_fr"))
    assert lease["pool"] == "lake" and lease["table"] == s3_path and lease["waited_for"] == []
    granted = [h for h in store.holders() if h.request_id == lease["request_id"]]
    assert len(granted) == 1 and granted[0].owner == lease["owner"]
    assert (f"planned at version 2; reads {len(fr_files)} files in country=FR,date=2024-01-01"
            in granted[0].summary), granted[0].summary
    assert DeltaLeaseReleaseOperator(task_id="release", lease=lease).execute(context("release")) is True
    kinds = [e.kind for e in store.history(pool="lake") if e.request_id == lease["request_id"]]
    assert kinds == [AuditKind.REQUEST, AuditKind.GRANT, AuditKind.RELEASE], kinds
    assert lease["request_id"] not in {r.request_id for r in store.records()}
