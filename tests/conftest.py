"""Every test belongs to a tier: a marker that ``make test-<tier>`` selects (``pytest tests -m <tier>``).

The folder of a tier marks all of its tests from its own conftest (``tests/unit``, ``tests/spark``,
``tests/airflow``, ``tests/postgres``, ``tests/s3``), so a module cannot forget its marker; ``tests/leases``
mixes tiers and marks each module. A test collected with no tier marker would run in ``make test`` but in no
``make test-<tier>``, so it stops the session here instead of being skipped there without a word.
"""

from __future__ import annotations

import pytest

TIERS = ("unit", "spark", "airflow", "postgres", "s3")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Runs after the folders' hooks (they are ``tryfirst``) and before ``-m`` deselects anything.
    untiered = [item.nodeid for item in items if not any(item.get_closest_marker(tier) for tier in TIERS)]
    if untiered:
        raise pytest.UsageError(
            f"no tier marker ({', '.join(TIERS)}) on {len(untiered)} collected test(s), so no `make test-<tier>` "
            f"runs them; mark them in their folder's conftest or module: {', '.join(untiered[:10])}")
