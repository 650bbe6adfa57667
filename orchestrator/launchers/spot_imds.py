"""A small instance metadata service (IMDSv2) on 127.0.0.1, one "instance" per local worker.

The simulated spot market (:mod:`orchestrator.launchers.spot_local`) delivers its interruption notices
here, and each local worker's agent polls it exactly as it polls EC2's (``worker/agent/spot.py``): the
launcher sets the worker's ``SPOTSWARM_METADATA_URL`` to ``http://127.0.0.1:<port>/<request id>``, so
``PUT <that>/latest/api/token`` and ``GET <that>/latest/meta-data/spot/instance-action`` are that
worker's own. A GET without a token this service issued is a 401, as on EC2; no notice yet is a 404.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from worker.protocol.imds import INSTANCE_ACTION_PATH, TOKEN_HEADER, TOKEN_PATH, TOKEN_TTL_HEADER

logger = logging.getLogger(__name__)


class LocalMetadataService(ThreadingHTTPServer):
    """Serves every local worker's metadata in a daemon thread; :meth:`close` stops it."""

    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__((host, 0), _Handler)
        self.lock = threading.Lock()
        self.tokens: set[str] = set()
        self.notices: dict[str, dict[str, str]] = {}  # request id -> EC2's instance-action document
        self._thread = threading.Thread(target=self.serve_forever, name="local-imds", daemon=True)
        self._thread.start()

    def url_for(self, request_id: str) -> str:
        """The metadata base URL of the worker of ``request_id``."""
        return f"http://127.0.0.1:{self.server_address[1]}/{request_id}"

    def interrupt(self, request_id: str, seconds_ahead: float, now: datetime | None = None) -> None:
        """Post EC2's notice for ``request_id``: ``terminate`` at ``seconds_ahead`` from ``now``."""
        when = (now or datetime.now(UTC)) + timedelta(seconds=seconds_ahead)
        with self.lock:
            self.notices[request_id] = {"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}

    def close(self) -> None:
        """Stop serving and release the port."""
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: LocalMetadataService

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: every worker polls every few seconds."""

    def _split(self) -> tuple[str, str]:
        request_id, _, rest = self.path.lstrip("/").partition("/")
        return request_id, "/" + rest

    def do_PUT(self) -> None:
        _, path = self._split()
        if path != TOKEN_PATH or not self.headers.get(TOKEN_TTL_HEADER):
            self._reply(400, "")
            return
        token = secrets.token_hex(16)
        with self.server.lock:
            self.server.tokens.add(token)
        self._reply(200, token)

    def do_GET(self) -> None:
        request_id, path = self._split()
        with self.server.lock:
            if self.headers.get(TOKEN_HEADER, "") not in self.server.tokens:
                self._reply(401, "")
                return
            notice = self.server.notices.get(request_id) if path == INSTANCE_ACTION_PATH else None
        if notice is None:
            self._reply(404, "Not Found")
        else:
            self._reply(200, json.dumps(notice))

    def _reply(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
