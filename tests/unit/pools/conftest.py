"""Fixtures shared by the pool tests: a small partitioned table and lease requests planned on it."""

from .contract import request_for, table  # noqa: F401 - fixtures
