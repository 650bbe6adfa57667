"""What ``spotswarm serve`` checks and sets up around its HTTP server before it starts.

- **Plain HTTP on the network.** The server speaks HTTP; the admin token travels in every admin call.
  On a non-loopback address that is only safe behind a TLS-terminating proxy (the Terraform module puts
  nginx in front and says so with ``tls_proxy``); otherwise one warning line at start-up says what to do.
- **Open files.** Each connection is a file descriptor; many half-open connections (a slow client, or a
  deliberate one) can use up the soft limit, which is often far below the hard one. The soft limit is
  raised to the hard one at start, so exhausting it takes far more than a few thousand sockets.
- **uvicorn's own bounds** (``limit_concurrency``, ``timeout_keep_alive``) come from settings. None of
  this replaces a proxy with per-client limits and header timeouts in front of a public address.
"""

from __future__ import annotations

import ipaddress
import logging
import resource
from typing import Any

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
    """uvicorn.Config keywords that bound what clients can hold open."""
    return {
        "limit_concurrency": settings.http_limit_concurrency,
        "timeout_keep_alive": settings.http_keepalive_timeout_s,
    }
