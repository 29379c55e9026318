"""``python -m airflow_delta_occ.demo [--dags-folder PATH] [--spark connect|embedded]``: run the demo and
print its summary."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from . import __doc__ as package_doc
from .scenario import DAG_FILE, check_dags_folder, run_demo
from .spark_server import SPARK_MODES
from .summary import render

HOW = {
    "connect": "every task's Spark job runs on one local Spark Connect server, started first",
    "embedded": "each task starts an embedded Spark session with delta-spark (several minutes on two cores)",
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m airflow_delta_occ.demo",
                                     description=(package_doc or "").splitlines()[0])
    parser.add_argument("--dags-folder", type=Path, default=Path("dags_examples"),
                        help=f"folder holding {DAG_FILE} (default: ./dags_examples, i.e. run from the repository root)")
    parser.add_argument("--spark", choices=SPARK_MODES, default="connect",
                        help="connect (default): one local Spark Connect server (local[2]) shared by every task; "
                             "embedded: each task starts its own Spark session, as without a delta_occ connection")
    args = parser.parse_args(argv)
    try:
        dags_folder = check_dags_folder(args.dags_folder)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    work = Path(tempfile.mkdtemp(prefix="delta-occ-demo-"))
    print(f"DAGs from {dags_folder}; Airflow home, Delta lake, pool file, lease store and logs in {work}")
    print(f"six writers to one table at once, in conflict pool 'demo'; {HOW[args.spark]} ...", flush=True)
    started = time.perf_counter()
    run = run_demo(work, dags_folder=dags_folder, spark=args.spark, progress=lambda line: print(line, flush=True))
    timing = [f"DAG run {run.outcome.state} in {run.outcome.seconds or 0:.0f} s (trigger to end)"]
    if run.spark.start_seconds is not None:
        timing.append(f"Spark Connect server start {run.spark.start_seconds:.0f} s")
    timing.append(f"whole demo {time.perf_counter() - started:.0f} s")
    print("; ".join(timing))
    print(f"Spark: {run.spark.describe()}")
    for line in render(run):
        print(line)
    if run.outcome.state != "success":
        print(f"\ntask logs under {work / 'airflow' / 'logs'}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
