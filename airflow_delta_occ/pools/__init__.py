"""Conflict pools: configuration, lease requests, the arbiter and the lease stores (pure: no Airflow, no Spark)."""
