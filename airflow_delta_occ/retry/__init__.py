"""Typed conflict retries: classification (one vocabulary), in-job policies, and the Airflow adapter.

``classify`` and ``policy`` are pure (tenacity only); ``airflow`` needs the Airflow Task SDK.
"""
