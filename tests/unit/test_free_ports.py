"""The ports a local Connect server binds: picked together, so its gRPC service and its UI never get one port
(CI saw a server whose UI took the gRPC port fail to start)."""

from __future__ import annotations

import socket

import pytest

from airflow_delta_occ.ports import free_ports

pytestmark = pytest.mark.unit


def test_ports_picked_together_are_distinct_and_free() -> None:
    for _ in range(200):
        first, second = free_ports(2)
        assert first != second
    for port in free_ports(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))   # still free once picked


def test_ports_already_chosen_are_never_picked() -> None:
    taken = free_ports(1)[0]
    assert all(taken not in free_ports(2, besides=(taken, None)) for _ in range(50))
