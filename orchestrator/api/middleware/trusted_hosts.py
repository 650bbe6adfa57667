"""An ASGI middleware that answers 400 to a request whose ``Host`` names no host the API is served as.

Why: DNS rebinding. A web page the operator opens at ``http://attacker.example:8000`` can make that name
resolve to 127.0.0.1 (or the orchestrator's address) and then read the API with the page's own origin:
every read a caller without a token may make (runs, events, workers, peers). The browser still sends
``Host: attacker.example:8000``, so refusing unknown names stops it.

Allowed: the configured names (``example.com``, ``*.example.com`` for its subdomains, ``*`` for any) and
every IP address literal (``127.0.0.1``, ``[::1]``, a private address workers use): a page can only
name an address in its URL when it was served from that address, so a literal is never a rebinding. A
request without ``Host`` (HTTP/1.0, never a browser) passes too.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

REFUSED = json.dumps({"detail": "unknown host in the Host header: see the trusted_hosts setting"}).encode()


def host_name(header: str) -> str:
    """The name in a ``Host`` header: ``[::1]:8000`` -> ``::1``, ``Example.COM.:443`` -> ``example.com``."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    name, _, port = value.rpartition(":")
    if name and port.isdigit():
        value = name
    return value.rstrip(".")


def is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_allowed(header: str | None, allowed: Iterable[str]) -> bool:
    """Whether a request with this ``Host`` header may be served (see the module docstring)."""
    if header is None:
        return True
    name = host_name(header)
    if is_ip_address(name):
        return True
    for pattern in allowed:
        if pattern == "*" or pattern == name:
            return True
        if pattern.startswith("*.") and name.endswith(pattern[1:]):
            return True
    return False


class TrustedHostMiddleware:
    """400 for an HTTP request whose ``Host`` is not allowed (:func:`host_allowed`); the rest pass."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str]) -> None:
        self.app = app
        self.allowed = tuple(pattern.strip().lower().rstrip(".") for pattern in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        hosts = [value for key, value in scope["headers"] if key == b"host"]
        header = hosts[0].decode("latin-1") if hosts else None
        if len(hosts) > 1 or not host_allowed(header, self.allowed):
            headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(REFUSED))]
            await send({"type": "http.response.start", "status": 400, "headers": headers})
            await send({"type": "http.response.body", "body": REFUSED})
            return
        await self.app(scope, receive, send)
