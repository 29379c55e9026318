"""The ``airflow delta-occ`` command group, declared for Airflow's CLI parser.

Airflow imports this module on every ``airflow`` invocation (``"cli"`` in ``get_provider_info``), so it
holds declarations only: the commands are loaded with ``lazy_load_command`` when one runs, and nothing
here imports pyarrow, Spark, the lease store or the metadata database. The group is ``delta-occ`` and
not ``pools``: a provider group named like a core command breaks the whole ``airflow`` CLI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.cli.cli_config import CLICommand

GROUP = "delta-occ"
COMMANDS = "airflow_delta_occ.cli.commands"


def get_provider_cli_definitions() -> list[CLICommand]:
    """``airflow delta-occ pools sync|list``, ``airflow delta-occ leases`` and ``airflow delta-occ check``."""
    from airflow.cli.cli_config import ActionCommand, Arg, GroupCommand, lazy_load_command

    arg: Callable[..., Any] = Arg  # Airflow's Arg is untyped
    verbose = arg(("-v", "--verbose"), help="Show Airflow's log messages", action="store_true")
    output = arg(("-o", "--output"), help="Output format (default: table)", choices=("table", "json"),
                 default="table", metavar="(table, json)")
    pool_file = arg(("--pool-file",), help="The pool file to read instead of [delta_occ] pool_file", default=None)
    pools = GroupCommand(
        name="pools",
        help="Airflow pools of the conflict pools",
        subcommands=(
            ActionCommand(
                name="sync",
                help="Create or update the Airflow pool of every conflict pool; report Delta tasks in missing pools",
                description=(
                    "For each pool of the pool file, create or update its Airflow pool (airflow_pool) with "
                    "slots = max_writers (-1, Airflow's unlimited, when max_writers is not set) and "
                    "include_deferred=False, so tasks waiting for a lease hold no slot. Then list the Delta "
                    "tasks of the serialized DAGs in the metadata database whose pool does not exist (the "
                    "scheduler never runs them) and exit 1 if there are any. Exit 2 when the pool file is "
                    "unusable; nothing is changed then."),
                func=lazy_load_command(f"{COMMANDS}.pools_sync"),
                args=(pool_file,
                      arg(("--dry-run",), help="Show what would change; change nothing", action="store_true"),
                      arg(("--no-fail",), help="Only warn about Delta tasks in missing pools (exit 0)",
                          action="store_true"),
                      verbose),
            ),
            ActionCommand(
                name="list",
                help="The conflict pools of the pool file next to their Airflow pools",
                func=lazy_load_command(f"{COMMANDS}.pools_list"),
                args=(pool_file, output, verbose),
            ),
        ),
    )
    leases = ActionCommand(
        name="leases",
        help="Leases held, requests waiting and the latest audit events of the lease store",
        description=("Reads the lease store of the delta_occ_leases connection. --table is compared in the pool "
                     "file's normal form (s3a:// is s3://, a local path is file:///...)."),
        func=lazy_load_command(f"{COMMANDS}.leases"),
        args=(arg(("--table",), help="Only this table (path, URI or catalog name)", default=None),
              arg(("--pool",), help="Only this conflict pool", default=None),
              arg(("--history",), help="How many of the latest audit events to show (default: 20)", type=int,
                  default=20, metavar="N"),
              arg(("--conn-id",), help="The lease store connection (default: delta_occ_leases)",
                  default="delta_occ_leases"),
              output, verbose),
    )
    check = ActionCommand(
        name="check",
        help="List the pairs of Delta tasks that can conflict, and what keeps each pair apart, before the DAGs run",
        description=(
            "Parses the DAGs (--subdir, default the DAGs folder), renders each Delta task's arguments for "
            "sample runs from --date (consecutive scheduled runs, which a backfill may run at once), reads "
            "each table's Delta log (no Spark), plans every task's footprint and lists each pair that can run "
            "at the same time and can conflict, with the planner's reason and the exception Delta would "
            "raise, and what keeps the pair apart (a dependency, the same conflict pool, an Airflow pool of "
            "one slot, a task limit) or what would. Tasks it cannot render or whose table it "
            "cannot read are listed as not judged, never as safe. Exit 1 when a pair that can conflict is not "
            "kept apart (a deployment gate); 2 on a usage error."),
        func=lazy_load_command(f"{COMMANDS}.check"),
        args=(arg(("dag_id",), help="The DAG to check", nargs="?", default=None),
              arg(("--all",), help="Every DAG of --subdir, and pairs across DAGs on one table",
                  action="store_true"),
              arg(("--date",), help="The logical date of the sample run (YYYY-MM-DD; default: today, UTC)",
                  default=None, metavar="DATE"),
              arg(("--next-date",), help="Compare the run of --date with the run of this date only (default: "
                  "--runs consecutive scheduled runs; for a DAG without a schedule, two runs of --date unless "
                  "max_active_runs=1)", default=None, metavar="DATE"),
              arg(("--runs",), help="Consecutive scheduled runs compared per DAG (default: 3)", type=int, default=3,
                  metavar="N"),
              arg(("-S", "--subdir"), help="The DAG file or folder to parse (default: [core] dags_folder)",
                  default=None),
              arg(("--model",), help="Whose conflict rules judge tasks outside a conflict pool (default: delta)",
                  choices=("delta", "databricks", "maxcompute"), default="delta"),
              arg(("--max-mapped",), help="Map indexes checked per mapped task (default: 64)", type=int,
                  default=64, metavar="N"),
              arg(("--fail-on-unknown",), help="Exit 1 when a Delta task could not be judged, too",
                  action="store_true"),
              pool_file, output, verbose),
    )
    return [GroupCommand(name=GROUP, help="airflow-delta-occ: conflict pools, their leases, and a conflict check",
                         subcommands=(pools, leases, check))]
