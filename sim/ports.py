"""Free loopback ports for the servers thunder-mw starts as subprocesses (engines, gateways)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (another process may take it since).

    For a server started in this process, bind port 0 and hand uvicorn the socket instead
    (as `thunder_mw.sim.embedded` does): that cannot race.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
