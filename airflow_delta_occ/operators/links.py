"""The Delta operators' extra link to the Spark UI of the job they ran.

Airflow 3 resolves an operator's extra links in the worker once the task has ended (success or
failure, when the UI matters most) and stores each as an XCom the UI reads; ``get_link`` is handed
the operator instance that ran, whose hook knows where the job went (``DeltaSparkHook.spark_ui_link``:
the history server, a configured UI, the driver's live UI, or a Connect server's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk.types import TaskInstanceKey


class SparkUILink(BaseOperatorLink):
    """"Spark UI": where the task's Delta job ran; empty when no job ran (a refusal before Spark)."""

    name = "Spark UI"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        hook = getattr(operator, "__dict__", {}).get("hook")  # built only once a job ran
        url = getattr(hook, "spark_ui_url", None)
        return url if isinstance(url, str) and url.lower().startswith(("http://", "https://")) else ""
