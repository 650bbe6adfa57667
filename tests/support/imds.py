"""A fake EC2 instance metadata service (IMDSv2 rules) on 127.0.0.1, for the spot watcher's tests and
the spot interruption end to end.

Session tokens come from ``PUT /latest/api/token`` (a TTL of 1 to 21,600 s, cut to
``max_token_lifetime_s``); a missing, unknown or expired token gets 401; a notice not set gets 404.
A notice is set in one of two ways:

- ``instance_action`` / ``rebalance``: every token sees it (one instance, one watcher);
- :meth:`FakeImds.interrupt`: the first token to poll for it afterwards owns it (that worker's
  "instance" is being reclaimed) and sees it from then on, while every other token, and so every
  replacement, keeps getting 404: local workers sharing one service, each as if on its own instance.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from worker.protocol.imds import (
    INSTANCE_ACTION_PATH,
    REBALANCE_PATH,
    TOKEN_HEADER,
    TOKEN_PATH,
    TOKEN_TTL_HEADER,
)

MAX_TOKEN_TTL_S = 21600  # what EC2 accepts in the TTL header


class FakeImds(ThreadingHTTPServer):
    """The service; serve it with :func:`serving_imds`. It counts the requests it refused (``refused``)
    and the polls for an interruption notice (``action_polls``); ``delivered`` is set once a notice armed
    with :meth:`interrupt` reaches a token."""

    daemon_threads = True

    def __init__(self, max_token_lifetime_s: float = 3600.0) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.max_token_lifetime_s = max_token_lifetime_s
        self.lock = threading.Lock()
        self.tokens: dict[str, float] = {}  # token -> expiry (monotonic)
        self.refused = 0
        self.action_polls = 0
        self.instance_action: dict[str, str] | None = None
        self.rebalance: dict[str, str] | None = None
        self._armed: dict[str, str] | None = None
        self._owner: str | None = None
        self._owned: dict[str, str] | None = None
        self.delivered = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def interrupt(self, seconds_ahead: float = 120.0) -> None:
        """Arm EC2's notice: ``terminate`` at ``seconds_ahead`` from now, for the next token that polls."""
        when = datetime.now(UTC) + timedelta(seconds=seconds_ahead)
        with self.lock:
            self._armed = {"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}

    def _instance_action_for(self, token: str) -> dict[str, str] | None:
        """The notice ``token`` sees (under ``lock``)."""
        if self._armed is not None and self._owner is None:
            self._owned, self._owner, self._armed = self._armed, token, None
            self.delivered.set()
        return self._owned if token == self._owner else self.instance_action


class _Handler(BaseHTTPRequestHandler):
    server: FakeImds

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_PUT(self) -> None:
        ttl = self.headers.get(TOKEN_TTL_HEADER)
        if self.path != TOKEN_PATH or ttl is None or not 1 <= int(ttl) <= MAX_TOKEN_TTL_S:
            self.send_error(400)
            return
        with self.server.lock:
            token = f"token-{len(self.server.tokens)}"
            lifetime = min(float(ttl), self.server.max_token_lifetime_s)
            self.server.tokens[token] = time.monotonic() + lifetime
        self._send_ok(token)

    def do_GET(self) -> None:
        token = self.headers.get(TOKEN_HEADER, "")
        with self.server.lock:
            expiry = self.server.tokens.get(token)
            if expiry is None or time.monotonic() >= expiry:
                self.server.refused += 1
                self.send_error(401)
                return
            if self.path == INSTANCE_ACTION_PATH:
                self.server.action_polls += 1
                notice = self.server._instance_action_for(token)
            elif self.path == REBALANCE_PATH:
                notice = self.server.rebalance
            else:
                notice = None
        self._send_ok(json.dumps(notice)) if notice else self.send_error(404)

    def _send_ok(self, body: str) -> None:
        """A 200 with ``body`` (errors go out with ``send_error``, as EC2's have a body of their own)."""
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def serving_imds(max_token_lifetime_s: float = 3600.0) -> Iterator[FakeImds]:
    """A :class:`FakeImds` answering on a thread of this process; shut down on exit."""
    server = FakeImds(max_token_lifetime_s)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-imds", daemon=True
    )
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
