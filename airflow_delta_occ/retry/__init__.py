"""Typed conflict retries, pure (tenacity only): classification (one vocabulary) and in-job policies.

The task-level ``RetryPolicy`` that decides from the same policies in Airflow is
``airflow_delta_occ.operators.retry_policy.DeltaConflictRetryPolicy``.
"""
