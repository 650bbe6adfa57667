"""What ``spotswarm serve`` checks and sets up around its HTTP server before it starts.

- **Plain HTTP on the network.** The server speaks HTTP; the admin token travels in every admin call.
  On a non-loopback address that is only safe behind a TLS-terminating proxy (the Terraform module puts
  nginx in front and says so with ``tls_proxy``); otherwise one warning line at start-up says what to do.
- **Open files.** Each connection is a file descriptor; many half-open connections (a slow client, or a
  deliberate one) can use up the soft limit, which is often far below the hard one. The soft limit is
  raised to the hard one at start, so exhausting it takes far more than a few thousand sockets.
- **Ports in use.** The HTTP port is bound only after the app (DHT peer, fork server) has started, and a
  DHT port in use fails inside the app's start-up, where it prints a traceback. Both are tried first, so
  a port taken by another program is one line naming it and the setting to change.
- **uvicorn's own bounds** (``limit_concurrency``, ``timeout_keep_alive``) come from settings, and two
  it lacks are added (``http_protocol.py``): a time limit on a request's header and a cap on one client
  address's connections, so one client holding half-open connections cannot get everyone a 503. Many
  addresses together still can: a public address wants a proxy with per-client limits in front.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import resource
import socket
from typing import Any

from orchestrator.cli.http_protocol import bounded_protocol
from orchestrator.config import Settings

logger = logging.getLogger("orchestrator.serve")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any address
        return False


def warn_if_plain_http(settings: Settings) -> None:
    """Log one warning when the API is served as plain HTTP beyond this machine without a TLS proxy."""
    if is_loopback(settings.host) or settings.tls_proxy:
        return
    logger.warning(
        "serving plain HTTP on %s:%d: admin and worker tokens cross the network unencrypted. Put a "
        "TLS-terminating proxy in front (the Terraform module does) and set SPOTSWARM_TLS_PROXY=true "
        "(--tls-proxy), or bind 127.0.0.1",
        settings.host,
        settings.port,
    )


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit; return the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft >= hard:
        return soft
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:  # e.g. above the kernel's nr_open: keep what we have
        logger.warning("could not raise the open-files limit from %d to %d: %s", soft, target, exc)
        return soft
    logger.info("open-files limit raised from %d to %d", soft, target)
    return target


def uvicorn_limits(settings: Settings) -> dict[str, Any]:
    """uvicorn.Config keywords that bound what clients can hold open (and for how long)."""
    per_client = 0 if settings.tls_proxy else settings.http_max_connections_per_client
    return {
        "limit_concurrency": settings.http_limit_concurrency,
        "timeout_keep_alive": settings.http_keepalive_timeout_s,
        "http": bounded_protocol(settings.http_header_timeout_s, per_client),
    }


def _tcp_listen_address(maddr: str) -> tuple[str, int] | None:
    """``(host, port)`` of an ``/ip4/<host>/tcp/<port>`` or ``/ip6/...`` multiaddr; None for others."""
    parts = maddr.strip("/").split("/")
    pairs = dict(zip(parts[0::2], parts[1::2], strict=False))
    host = pairs.get("ip4") or pairs.get("ip6")
    port = pairs.get("tcp", "")
    return (host, int(port)) if host and port.isdigit() else None


def _in_use(host: str, port: int) -> bool:
    """Whether binding ``host:port`` fails with "address in use" (as the servers bind: SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def taken_port_problem(settings: Settings) -> str | None:
    """A one-line message when the HTTP port or a port the DHT peer listens on is in use, else None.

    Checked just before start-up: a program that takes the port in between still fails the start, with
    the longer message of the part that binds it."""
    wanted = [(settings.host, settings.port, "--port (SPOTSWARM_PORT)")]
    for maddr in settings.dht.resolved_host_maddrs():
        address = _tcp_listen_address(maddr)
        if address is not None and address[1] != 0:
            wanted.append((*address, "--dht-port (SPOTSWARM_DHT_PORT) or --dht-host-maddrs"))
    for host, port, setting in wanted:
        with contextlib.suppress(OSError):  # an address this machine lacks: left to the part that binds it
            if _in_use(host, port):
                return (
                    f"{host}:{port} is in use by another program: stop it or choose another port: {setting}"
                )
    return None
