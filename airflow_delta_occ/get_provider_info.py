"""Provider metadata for Airflow's ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

# The lease store connection's form, as the provider's info gives it (Airflow 3 builds forms from this, not
# from the hook); ``DeltaLeaseStoreHook.get_ui_field_behaviour`` returns the same.
LEASE_STORE_FORM: dict[str, Any] = {
    "hidden-fields": [],
    "relabeling": {"schema": "Database"},
    "placeholders": {"host": "PostgreSQL host (leave empty for SQLite)", "port": "5432", "schema": "delta_leases",
                     "extra": '{"backend": "sqlite", "path": "/var/lib/airflow/delta_leases.db"}'},
}


#: The how-to guides, in reading order (docs/<page>.md; docs/index.md lists them too).
HOW_TO_GUIDES = ("operators", "pools", "check", "platform", "object-storage", "lineage")


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-delta-occ",
        "name": "Delta Lake optimistic concurrency",
        "description": "Concurrent, conflict-aware writes to Delta Lake tables from Airflow.",
        "integrations": [
            {
                "integration-name": "Delta Lake OCC",
                "external-doc-url": "https://docs.delta.io/latest/concurrency-control.html",
                # The guides of the repository's docs/ (built with the API reference by `make docs`).
                "how-to-guide": [f"/docs/{page}.md" for page in HOW_TO_GUIDES],
                "tags": ["software"],
            }
        ],
        "operators": [{"integration-name": "Delta Lake OCC", "python-modules": ["airflow_delta_occ.operators.delta"]}],
        "sensors": [{"integration-name": "Delta Lake OCC", "python-modules": ["airflow_delta_occ.sensors.conflict"]}],
        "triggers": [{"integration-name": "Delta Lake OCC", "python-modules": ["airflow_delta_occ.triggers.lease"]}],
        "extra-links": ["airflow_delta_occ.operators.links.SparkUILink"],
        "hooks": [{"integration-name": "Delta Lake OCC",
                   "python-modules": ["airflow_delta_occ.hooks.delta", "airflow_delta_occ.hooks.leases"]}],
        "connection-types": [
            {
                "connection-type": "delta_occ",
                "hook-class-name": "airflow_delta_occ.hooks.delta.DeltaSparkHook",
                "hook-name": "Delta Lake (airflow-delta-occ)",
                "ui-field-behaviour": {"hidden-fields": ["schema", "login", "password", "port", "host"]},
                "conn-fields": {
                    "mode": {"label": "Mode", "description": "Where Delta jobs run",
                             "schema": {"type": ["string", "null"], "default": "embedded",
                                        "enum": ["embedded", "spark-submit", "connect"]}},
                    "spark_conn_id": {"label": "Spark connection (spark-submit mode)",
                                      "schema": {"type": ["string", "null"], "default": "spark_default"}},
                    "spark_connect_conn_id": {
                        "label": "Spark Connect connection (connect mode)",
                        "description": "A spark_connect connection of the Spark provider; its token is masked",
                        "schema": {"type": ["string", "null"]}},
                    "connect_url": {"label": "Spark Connect URL (without a token)",
                                    "description": "sc://host:15002; a URL with token= is refused",
                                    "schema": {"type": ["string", "null"]}},
                    "master": {"label": "Embedded master", "schema": {"type": ["string", "null"],
                                                                      "default": "local[2]"}},
                    "spark_conf": {"label": "Spark settings",
                                   "description": "Spark confs added to every job of this connection (JSON object)",
                                   "schema": {"type": ["object", "null"]}},
                    "storage_conn_id": {
                        "label": "Storage connection",
                        "description": "aws, wasb, adls or google_cloud_platform connection for tables on object "
                                       "storage",
                        "schema": {"type": ["string", "null"]}},
                    "spark_history_url": {
                        "label": "Spark History Server URL",
                        "description": "http(s) URL of the history server the jobs' event logs reach; the tasks' "
                                       "Spark UI link then opens the job's application there",
                        "schema": {"type": ["string", "null"]}},
                    "spark_ui_url": {
                        "label": "Spark UI URL",
                        "description": "http(s) URL the Spark UI link opens when there is no history server "
                                       "(default: the driver's own UI; a Connect server's at its host, port 4040)",
                        "schema": {"type": ["string", "null"]}},
                },
            },
            {
                "connection-type": "delta_occ_leases",
                "hook-class-name": "airflow_delta_occ.hooks.leases.DeltaLeaseStoreHook",
                "hook-name": "Delta conflict pool lease store (airflow-delta-occ)",
                "ui-field-behaviour": LEASE_STORE_FORM,
                "conn-fields": {
                    "backend": {"label": "Backend", "description": "postgresql (several hosts) or sqlite (one host)",
                                "schema": {"type": ["string", "null"], "enum": ["postgresql", "sqlite", None]}},
                    "path": {"label": "SQLite file", "description": "absolute path of the SQLite database file",
                             "schema": {"type": ["string", "null"]}},
                    "url": {"label": "Store URL",
                            "description": "a SQLAlchemy URL instead of the fields above (postgresql://host/db or "
                                           "sqlite:////path); the connection's password, if set, is used",
                            "schema": {"type": ["string", "null"]}},
                },
            },
        ],
        "cli": ["airflow_delta_occ.cli.get_provider_cli_definitions"],
        "config": {
            "delta_occ": {
                "description": "Defaults of the airflow-delta-occ provider.",
                "options": {
                    "default_mode": {
                        "description": "Where jobs run when no delta_occ connection says otherwise.",
                        "version_added": "0.1.0", "type": "string", "example": "spark-submit",
                        "default": "embedded",
                    },
                    "conflict_policies": {
                        "description": ("Platform defaults for the typed conflict policies, as JSON keyed by "
                                        "exception name; a task's conflict_policies= overrides them field "
                                        "by field."),
                        "version_added": "0.1.0", "type": "string",
                        "example": '{"ConcurrentAppendException": {"max_attempts": 8, "initial_delay": 2}, '
                                   '"MetadataChangedException": "fail"}',
                        "default": "",
                    },
                    "task_retries": {
                        "description": ("Airflow retries of a Delta task that sets none (neither retries= nor "
                                        "default_args). A task-level conflict retry needs retries: Airflow's own "
                                        "default is 0."),
                        "version_added": "0.1.0", "type": "integer", "example": "3", "default": "2",
                    },
                    "worker_wait": {
                        "description": ("How a pooled Delta task waits for its lease when it sets no deferrable= "
                                        "(and [operators] default_deferrable is not True): in the worker while "
                                        "the expected wait is at most this many seconds (it sees its grant "
                                        "within 50 ms and starts at once, holding its slot), deferred to the "
                                        "triggerer when it is longer (no slot held; the hand-over takes "
                                        "seconds). 0 = always deferred."),
                        "version_added": "0.2.0", "type": "float", "example": "60", "default": "30",
                    },
                    "early_abort": {
                        "description": ("Whether a Delta task watches its table's log while its job runs (every "
                                        "mode) and cancels the job's Spark work as soon as a commit "
                                        "that landed makes its own commit certain to fail, so its retry starts at "
                                        "once instead of after all the doomed work. A task's early_abort= "
                                        "overrides it."),
                        "version_added": "0.2.0", "type": "boolean", "example": "False", "default": "True",
                    },
                    "early_abort_interval": {
                        "description": ("Seconds between two looks at the table's log while a job runs with "
                                        "early abort (one read of the next commit file each)."),
                        "version_added": "0.2.0", "type": "float", "example": "2", "default": "1",
                    },
                    "pool_file": {
                        "description": ("Path of the TOML file that defines conflict pools (groups of Delta "
                                        "tables whose writers get leases so only non-conflicting ones run at "
                                        "once); empty = no pools."),
                        "version_added": "0.1.0", "type": "string", "example": "/etc/airflow/delta_pools.toml",
                        "default": "",
                    },
                    "assign_pools": {
                        "description": ("Cluster policy: a Delta task (or sensor) without conflict_pool= whose "
                                        "table is a literal location matched by the pool file gets that conflict "
                                        "pool, and runs in its Airflow pool. Set it alike on DAG processors and "
                                        "workers."),
                        "version_added": "0.1.0", "type": "boolean", "example": "True", "default": "False",
                    },
                    "enforce_pools": {
                        "description": ("Cluster policy: a Delta task of a conflict pool runs in the pool's "
                                        "Airflow pool even when it sets another pool= (otherwise the policy "
                                        "keeps the author's pool and logs a warning)."),
                        "version_added": "0.1.0", "type": "boolean", "example": "True", "default": "False",
                    },
                    "unsafe_s3_commits": {
                        "description": ("What a job does when its commits to an S3 table could be lost: each "
                                        "embedded or spark-submit job starts its own Spark driver, and Delta's "
                                        "default S3 LogStore keeps commits exclusive only inside one driver. "
                                        "refuse (default): fail before anything is written, naming the fix "
                                        "(S3DynamoDBLogStore, or one Spark Connect server); warn: run anyway, "
                                        "for platforms that guarantee one writer per table at a time."),
                        "version_added": "0.1.0", "type": "string", "example": "warn", "default": "refuse",
                    },
                },
            }
        },
    }
