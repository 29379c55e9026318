"""Airflow operators for Delta Lake jobs."""
