"""How a job reaches Spark: one ``JobTransport`` per mode (see ``base``), and ``MemoryTransport`` for tests."""

from airflow_delta_occ.hooks.transports.base import (
    JobTransport,
    RunningJob,
    TransportFactory,
    TransportHost,
    register_transport,
    registered_modes,
    transport_factory,
    unregister_transport,
)
from airflow_delta_occ.hooks.transports.memory import MemoryTransport

__all__ = ["JobTransport", "MemoryTransport", "RunningJob", "TransportFactory", "TransportHost", "register_transport",
           "registered_modes", "transport_factory", "unregister_transport"]
