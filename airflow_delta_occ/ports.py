"""Free TCP ports on 127.0.0.1 for the servers the demo, the benchmarks and the tests start.

Ports are picked together, each socket held until all are picked: picked one after the other, two can be one
port (the kernel hands out again a port just let go), and a server then fails to bind (CI saw a Connect
server whose UI took its gRPC port). Imports nothing of the package, so every layer may use it.
"""

from __future__ import annotations

import socket
from collections.abc import Collection
from contextlib import ExitStack


def free_ports(count: int, *, besides: Collection[int | None] = ()) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now, none of ``besides``."""
    with ExitStack() as stack:
        found: list[int] = []
        while len(found) < count:
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            if port not in besides:
                found.append(port)
        return found


def free_port() -> int:
    """One port free on 127.0.0.1 now (for several servers at once, ``free_ports``)."""
    return free_ports(1)[0]


__all__ = ["free_port", "free_ports"]
