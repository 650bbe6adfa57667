"""uvicorn's httptools protocol with the two bounds it lacks: a time limit on a request's headers and a
cap on the connections of one client address.

Why: uvicorn answers 503 to everyone once ``limit_concurrency`` connections are open, and it counts
connections that have sent nothing (or half a header) as open for as long as the client likes. One
client holding that many half-open connections kept every caller, ``/healthz`` included, at 503. Here:

- **header timeout**: a connection must deliver a request's whole header within ``header_timeout_s`` of
  opening (or of its previous response, on keep-alive); otherwise it is closed. A slowloris connection
  lives that long, not for ever.
- **per-client cap**: beyond ``max_connections_per_client`` open connections from one address, a new one
  is closed at once, so one client cannot take the whole ``limit_concurrency`` (many addresses together
  still can: that is what a proxy with per-client limits is for). Off behind a TLS proxy, whose own
  address every connection comes from.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class BoundedHttpProtocol(HttpToolsProtocol):
    """The per-connection protocol; :func:`bounded_protocol` makes a subclass with a server's bounds."""

    header_timeout_s: ClassVar[float] = 10.0
    max_connections_per_client: ClassVar[int] = 0  # 0: no cap
    open_per_client: ClassVar[Counter[str]] = Counter()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._client_host: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.client is not None:
            self._client_host = self.client[0]
            self.open_per_client[self._client_host] += 1
            cap = self.max_connections_per_client
            if cap and self.open_per_client[self._client_host] > cap:
                transport.close()  # connection_lost follows and gives the count back
                return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        if self._client_host is not None:
            self.open_per_client[self._client_host] -= 1
            if self.open_per_client[self._client_host] <= 0:
                del self.open_per_client[self._client_host]
            self._client_host = None
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        waiting = not self.pipeline  # a pipelined request already sent its header
        super().on_response_complete()
        if waiting and not self.transport.is_closing():
            self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timed_out)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def bounded_protocol(header_timeout_s: float, max_connections_per_client: int) -> type[BoundedHttpProtocol]:
    """A protocol class for one server (``uvicorn.Config(http=...)``), with its own per-client counts."""
    return type(
        "BoundedHttpProtocol",
        (BoundedHttpProtocol,),
        {
            "header_timeout_s": header_timeout_s,
            "max_connections_per_client": max_connections_per_client,
            "open_per_client": Counter(),
        },
    )
