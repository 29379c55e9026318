"""Lease store URLs: parsed once, refused with ``LeaseStoreError``, and never quoted with their password.

A URL comes from an Airflow connection or a CLI flag, so it is untrusted text: SQLAlchemy's parser
raises a bare ``ValueError`` for a port like ``xx`` and accepts ``-1``. A message names the URL so the
operator can find the connection, with the password replaced by ``***`` even when the URL does not
parse (SQLAlchemy can only mask what it parsed).
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlalchemy.exc import ArgumentError

from airflow_delta_occ.exceptions import LeaseStoreError

MIN_PORT, MAX_PORT = 1, 65535

# ``scheme://user:`` then everything up to the last ``@``: over-masking a password that holds ``@`` or
# ``/`` is safe, showing part of it is not.
_PASSWORD = re.compile(r"(://[^:/@]*:).*@", re.DOTALL)


def masked_url(text: str) -> str:
    """``text`` with its password (if any) replaced by ``***``; works on URLs that do not parse."""
    return _PASSWORD.sub(r"\1***@", str(text), count=1)


def parse_url(text: str) -> sa.engine.URL:
    """The SQLAlchemy URL ``text`` names, with a usable port.

    Raises:
        LeaseStoreError: not a URL, or a port that is not a number from 1 to 65535; the message quotes
            the URL without its password.
    """
    try:
        url = sa.engine.make_url(text)
    except ValueError as exc:   # SQLAlchemy's int() of the port
        raise LeaseStoreError(f"the lease store URL {masked_url(text)} cannot be used: its port must be a "
                              f"number from {MIN_PORT} to {MAX_PORT}") from exc
    except ArgumentError as exc:
        raise LeaseStoreError(f"the lease store URL {masked_url(text)} is not a SQLAlchemy URL "
                              "(dialect+driver://user:password@host:port/database)") from exc
    check_port(url.port, f"URL {masked_url(text)}")
    return url


def check_port(port: object, where: str) -> None:
    """Raises ``LeaseStoreError`` naming ``where`` (already without a password) unless ``port`` is absent or
    from 1 to 65535."""
    if port is None:
        return
    if isinstance(port, bool) or not isinstance(port, int) or not MIN_PORT <= port <= MAX_PORT:
        shown = port if isinstance(port, int) and abs(port) < 10 ** 12 else "out of range"
        raise LeaseStoreError(f"the lease store {where} cannot be used: its port must be a number from {MIN_PORT} "
                              f"to {MAX_PORT}, got {shown}")
