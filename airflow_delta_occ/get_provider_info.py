"""Provider metadata for Airflow's ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-delta-occ",
        "name": "Delta Lake optimistic concurrency",
        "description": "Concurrent, conflict-aware writes to Delta Lake tables from Airflow.",
        "integrations": [
            {
                "integration-name": "Delta Lake OCC",
                "external-doc-url": "https://docs.delta.io/latest/concurrency-control.html",
                "tags": ["software"],
            }
        ],
    }
