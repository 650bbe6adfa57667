"""Connections that hold a server's sockets: a client that opens many and finishes none of its requests."""

from __future__ import annotations

import socket

#: the address the holding client connects from (a loopback address of its own, so that a per-address
#: limit can tell it from everyone else on 127.0.0.1)
ATTACKER = "127.0.0.2"


def open_half_requests(
    port: int, count: int, first_bytes: bytes, source: str = ATTACKER
) -> list[socket.socket]:
    """``count`` connections from ``source`` that send ``first_bytes`` and then nothing, ever."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.settimeout(5)
            sock.bind((source, 0))
            sock.connect(("127.0.0.1", port))
            if first_bytes:
                sock.sendall(first_bytes)
            sock.setblocking(False)
    except BaseException:
        close_all(sockets)
        raise
    return sockets


def close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()
