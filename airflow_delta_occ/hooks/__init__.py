"""Airflow hooks: where Delta jobs run."""
