"""Secrets stay off every command line of the machine in embedded mode, and the job still reaches S3.

pyspark starts the embedded driver's JVM as ``spark-submit --conf k=v ...``, and a process's command
line is readable by every local user (``ps``, ``/proc/PID/cmdline``). The proof here starts a real
embedded session through ``DeltaSparkHook`` with an ``aws`` connection holding recognisable secrets
(and OpenLineage transport secrets in ``spark_conf``), scans ``/proc/*/cmdline`` of every process
while the JVM runs, and then writes and reads a Delta table through ``s3a://`` with those keys.

The fresh session runs in a child process: the tier's own session (``s3_spark``) may already have
started this process's JVM, and a JVM is launched once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from airflow_delta_occ.hooks.storage import storage_credentials

from ..spark.jobs import create_sales, rows
from .conftest import ACCESS_KEY, BUCKET

# Runs in the child. Every secret arrives through the environment (readable only by this user), never
# in this program's own command line.
CHILD = r"""
import json, os, sys
from airflow_delta_occ.hooks.delta import DeltaSparkHook

secrets = json.loads(os.environ["SECRETS"])
table = os.environ["TABLE"]
hook = DeltaSparkHook(None, mode="embedded", storage_conn_id="secret_s3",
                      spark_conf=json.loads(os.environ["SPARK_CONF"]))
hook.use_storage(table)
spark = hook.get_spark()

def command_lines():
    seen = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    seen[int(entry)] = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:  # gone, or not ours to read
                pass
    return seen

def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])

lines = command_lines()
jvms = [line for pid, line in lines.items() if "SparkSubmit" in line and parent_of(pid) == os.getpid()]
leaked = sorted({name for name, value in secrets.items() for line in lines.values() if value in line})
spark.sql(f"CREATE TABLE delta.`{table}` (id INT, v INT) USING delta")
spark.sql(f"INSERT INTO delta.`{table}` VALUES (1, 10), (2, 20)")
got = sorted(tuple(r) for r in spark.sql(f"SELECT id, v FROM delta.`{table}`").collect())
conf = dict(spark.sparkContext.getConf().getAll())
hadoop = spark.sparkContext._jsc.hadoopConfiguration()
print("RESULT " + json.dumps({
    "processes": len(lines), "jvms": jvms, "leaked": leaked, "rows": got,
    "in_spark_conf": sorted(k for k, v in conf.items() if v in secrets.values()),
    "hadoop_secret_key": hadoop.get("fs.s3a.secret.key") == secrets["secret_key"],
    "hadoop_session_token": hadoop.get("fs.s3a.session.token") == secrets["session_token"],
}))
spark.stop()
"""


def _processes_with(value: str) -> list[str]:
    """The command lines of every process on the machine that contain ``value``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                line = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if value in line:
                found.append(line)
    return found


def test_embedded_session_keeps_every_secret_off_every_command_line(
        s3_server: dict[str, Any], tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:12]
    secrets = {"secret_key": f"s3-secret-{tag}", "session_token": f"s3-token-{tag}",
               "api_key": f"ol-apikey-{tag}", "header": f"Bearer ol-header-{tag}"}
    spark_conf = {"spark.openlineage.transport.type": "http",
                  "spark.openlineage.transport.url": "http://127.0.0.1:9",
                  "spark.openlineage.transport.auth.type": "api_key",
                  "spark.openlineage.transport.auth.apiKey": secrets["api_key"],
                  "spark.openlineage.transport.headers.Authorization": secrets["header"]}
    table = f"s3a://{BUCKET}/secrets_{tag}"
    env = {**os.environ, "SECRETS": json.dumps(secrets), "TABLE": table, "SPARK_CONF": json.dumps(spark_conf),
           # The child's session is the only writer of its table.
           "AIRFLOW__DELTA_OCC__UNSAFE_S3_COMMITS": "warn",
           "AIRFLOW_CONN_SECRET_S3": json.dumps({
               "conn_type": "aws", "login": ACCESS_KEY, "password": secrets["secret_key"],
               "extra": {"aws_session_token": secrets["session_token"], "endpoint_url": s3_server["endpoint"],
                         "region_name": "us-east-1"}})}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    result = json.loads(lines[-1][len("RESULT "):])
    # The scan saw the session's JVM (its non-secret confs are on its command line) and many processes.
    assert result["processes"] > 3 and len(result["jvms"]) == 1, result
    assert "spark.hadoop.fs.s3a.endpoint=" + s3_server["endpoint"] in result["jvms"][0]
    assert result["leaked"] == [], result
    # ... yet the secrets reached the session: S3A signed with them and OpenLineage's listener would
    # find its transport's key and header in the SparkConf, where it reads them.
    assert result["rows"] == [[1, 10], [2, 20]]
    assert result["hadoop_secret_key"] and result["hadoop_session_token"]
    assert result["in_spark_conf"] == sorted([
        "spark.hadoop.fs.s3a.secret.key", "spark.hadoop.fs.s3a.session.token",
        "spark.openlineage.transport.auth.apiKey", "spark.openlineage.transport.headers.Authorization"])
    assert not any(_processes_with(value) for value in secrets.values())


def test_the_tiers_own_session_never_put_its_secret_on_a_command_line(
        s3_spark: Any, s3_connection: str, s3_path: str) -> None:
    """The tier's session was started by the hook with the connection's secret key; it reads and
    writes the bucket with it, and no process on the machine shows it."""
    secret = storage_credentials(s3_connection).secret_key
    assert secret and not _processes_with(secret)
    create_sales(s3_spark, s3_path)
    assert rows(s3_spark, s3_path) == [(1, 0, "DE"), (2, 0, "DE"), (3, 0, "FR"), (4, 0, "FR")]
