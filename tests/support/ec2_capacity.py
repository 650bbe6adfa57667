"""EC2's spare capacity, played in front of a moto server for an orchestrator running as a subprocess.

moto launches whatever it is asked for. Tests of the launcher alone model capacity with botocore
event hooks on their own boto3 client (``test_ec2_launcher.py``); an orchestrator in another process
builds its own client, so here the same part is played on the wire: :class:`CapacityProxy` is an HTTP
server on 127.0.0.1 that the orchestrator uses as its EC2 endpoint. It forwards every call to moto
unchanged, except ``CreateFleet`` calls for a market marked exhausted, which it answers the way EC2
does when no pool has capacity: HTTP 200, no instances, one ``InsufficientInstanceCapacity`` error
per (instance type, subnet) pool. It also records every ``CreateFleet`` it saw.
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from xml.sax.saxutils import escape

from tests.support.ports import free_port

_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})
_MARKET_KEY = "TargetCapacitySpecification.DefaultTargetCapacityType"


def _pools(form: dict[str, str]) -> list[tuple[str, str]]:
    """(instance type, subnet) of every override of a serialized CreateFleet request."""
    pools = []
    for key, value in form.items():
        if key.startswith("LaunchTemplateConfigs.") and key.endswith(".InstanceType"):
            subnet = form.get(key[: -len("InstanceType")] + "SubnetId", "")
            pools.append((value, subnet))
    return sorted(pools)


def no_capacity_answer(market: str, pools: list[tuple[str, str]]) -> bytes:
    """The body EC2 returns for an instant fleet that found no capacity in any of ``pools``."""
    items = "".join(
        "<item><launchTemplateAndOverrides><overrides>"
        f"<instanceType>{escape(instance_type)}</instanceType><subnetId>{escape(subnet)}</subnetId>"
        "</overrides></launchTemplateAndOverrides>"
        f"<lifecycle>{escape(market)}</lifecycle><errorCode>InsufficientInstanceCapacity</errorCode>"
        f"<errorMessage>There is no {escape(market)} capacity available that matches your request."
        "</errorMessage></item>"
        for instance_type, subnet in pools
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<CreateFleetResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        "<requestId>capacity-proxy</requestId><fleetId>fleet-00000000000000000</fleetId>"
        f"<errorSet>{items}</errorSet><fleetInstanceSet/></CreateFleetResponse>"
    ).encode()


class CapacityProxy:
    """An EC2 endpoint with limited capacity in front of moto; use as a context manager."""

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self._lock = threading.Lock()
        self.exhausted_markets: set[str] = set()  # "spot" and/or "on-demand"
        self.fleet_calls: list[dict[str, str]] = []  # every CreateFleet request, as its form fields
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="capacity-proxy", daemon=True)

    def __enter__(self) -> CapacityProxy:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def exhaust(self, market: str) -> None:
        with self._lock:
            self.exhausted_markets.add(market)

    def restore(self) -> None:
        with self._lock:
            self.exhausted_markets.clear()

    def markets_asked(self) -> list[str]:
        """The market of each CreateFleet call so far, in order."""
        with self._lock:
            return [call.get(_MARKET_KEY, "") for call in self.fleet_calls]

    def _answer(self, body: bytes) -> bytes | None:
        """The body to answer a request with instead of moto, or None to forward it."""
        form = dict(urllib.parse.parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        if form.get("Action") != "CreateFleet":
            return None
        market = form.get(_MARKET_KEY, "")
        with self._lock:
            self.fleet_calls.append(form)
            exhausted = market in self.exhausted_markets
        return no_capacity_answer(market, _pools(form)) if exhausted else None

    def _forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, Any, bytes]:
        conn = http.client.HTTPConnection(*self._upstream, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            conn.close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                answer = proxy._answer(body) if self.command == "POST" else None
                if answer is not None:
                    status, headers, payload = 200, [("Content-Type", "text/xml")], answer
                else:
                    forwarded = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                    status, headers, payload = proxy._forward(self.command, self.path, forwarded, body)
                self.send_response(status)
                for key, value in headers:
                    if key.lower() not in _HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _handle

            def log_message(self, *_: Any) -> None:  # quiet: the test's output is for failures
                pass

        return Handler
