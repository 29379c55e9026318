"""``python -m airflow_delta_occ.demo [--dags-folder PATH]``: run the demo and print its summary."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from . import __doc__ as package_doc
from .scenario import DAG_FILE, check_dags_folder, run_demo
from .summary import render


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m airflow_delta_occ.demo",
                                     description=(package_doc or "").splitlines()[0])
    parser.add_argument("--dags-folder", type=Path, default=Path("dags_examples"),
                        help=f"folder holding {DAG_FILE} (default: ./dags_examples, i.e. run from the repository root)")
    args = parser.parse_args(argv)
    try:
        dags_folder = check_dags_folder(args.dags_folder)
    except FileNotFoundError as exc:
        parser.error(str(exc))
    work = Path(tempfile.mkdtemp(prefix="delta-occ-demo-"))
    print(f"DAGs from {dags_folder}; Airflow home, Delta lake, pool file and lease store in {work}")
    print("six writers to one table at once, in conflict pool 'demo'; each task starts an embedded Spark "
          "session with delta-spark (several minutes on two cores) ...", flush=True)
    started = time.perf_counter()
    run = run_demo(work, dags_folder=dags_folder, progress=lambda line: print(line, flush=True))
    print(f"DAG run {run.outcome.state} in {time.perf_counter() - started:.0f} s")
    for line in render(run):
        print(line)
    if run.outcome.state != "success":
        print(f"\ntask logs under {work / 'airflow' / 'logs'}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
