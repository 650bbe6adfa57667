"""Free TCP ports on 127.0.0.1 for servers a test starts, and what to do when one is taken after all.

A port found free can be taken before the server binds it (a busy machine's outgoing connections draw
from the same range): the server then exits at start, and the test starts it again on new ports.
"""

from __future__ import annotations

import contextlib
import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: each held until all are found (separate :func:`free_port` calls
    can return the same port twice, and one server then listens on it twice)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


#: starts of a server on new ports when a port found free was taken before it bound it
PORT_ATTEMPTS = 3


def port_was_taken(log: str) -> bool:
    """Whether a server's log says it exited because a port it was given was in use (nginx, uvicorn and
    p2pd say "address already in use"; ``spotswarm serve``'s own check says "is in use by another
    program")."""
    return "address already in use" in log.lower() or "is in use by another program" in log
