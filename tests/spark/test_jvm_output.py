"""The embedded JVM's output reaches the task log at the level each line states, not on stderr (issue #24).

Airflow's task supervisor logs every line a task process writes to stderr at ERROR. A child process
plays the task process: it starts the provider's embedded session (a real JVM with delta-spark, Ivy
resolving the jars from the cache), writes a Delta table, and logs to its stdout, as Airflow's task logging
would. Whatever the JVM wrote to stderr would show up in the child's stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ..servers import spark_env

REPO = Path(__file__).resolve().parents[2]
CHILD = """
import logging, sys
logging.basicConfig(stream=sys.stdout, level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
for noisy in ("py4j", "pyspark"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
from airflow_delta_occ.spark.session import local_delta_session
spark = local_delta_session("jvm-output", conf={"spark.jars.packages": sys.argv[2]})
spark.range(3).write.format("delta").save(sys.argv[1])
print("ROWS", spark.read.format("delta").load(sys.argv[1]).count(), flush=True)
spark.stop()
"""


def test_the_jvm_writes_nothing_to_stderr_and_ivy_is_info(tmp_path: Path) -> None:
    from airflow_delta_occ.spark.session import delta_submit_conf

    packages = delta_submit_conf()["spark.jars.packages"]
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "t"), packages], cwd=REPO,
                          env=spark_env(tmp_path), capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ROWS 3" in done.stdout, done.stdout[-3000:]
    assert done.stderr.strip() == "", done.stderr[-3000:]   # nothing Airflow would log at ERROR
    relayed = [line for line in done.stdout.splitlines() if " airflow_delta_occ.spark.jvm: " in line]
    ivy = [line for line in relayed if "io.delta#delta-spark" in line or ":: resolving dependencies ::" in line]
    assert ivy and all(line.startswith("INFO ") for line in ivy), relayed[:20]
    assert not [line for line in relayed if line.startswith(("ERROR ", "CRITICAL "))], relayed
