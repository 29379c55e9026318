"""Lease stores: the contract (``base``), an in-memory store for tests, and the SQLAlchemy store."""
