"""The heartbeat's fast path: an ASGI middleware that answers ``POST /api/v1/workers/{id}/heartbeat`` of a
cached worker with a valid token and body itself, without FastAPI's routing and dependency machinery.
Its path is the route's template (``worker.protocol.paths.HEARTBEAT_ROUTE``).

Measured under load (bench/api_load.py), that machinery cost about as much CPU per heartbeat as
everything else together. Only the happy path is taken here: the body is JSON of at most
``max_body_bytes``, the worker is in the :class:`~orchestrator.heartbeats.hub.HeartbeatHub`'s cache and the
bearer token is its own. Anything else (no or another token, an unknown or uncached worker, a body that
does not validate, another content type) goes on to the FastAPI route with the body replayed, so every
error answer, status and schema stays the route's, the one documented in the OpenAPI schema.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator import tokens
from orchestrator.errors import Forbidden, Unauthorized
from orchestrator.heartbeats.hub import HeartbeatHub
from worker.protocol.paths import HEARTBEAT_ROUTE, ApiPath, path_regex
from worker.protocol.validators import MAX_ID
from worker.protocol.workers import Heartbeat

HEARTBEAT_PATH_RE = re.compile(path_regex(ApiPath.heartbeat, worker_id="([0-9]{1,10})"))


class _Route:
    """What the request metrics read from ``scope["route"]`` to label a request by its route template."""

    path = HEARTBEAT_ROUTE


class HeartbeatFastPath:
    """See the module docstring. ``hub_of()`` returns the app's hub (None before start-up)."""

    def __init__(self, app: ASGIApp, hub_of: Callable[[], HeartbeatHub | None], max_body_bytes: int) -> None:
        self.app = app
        self.hub_of = hub_of
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = HEARTBEAT_PATH_RE.match(scope["path"]) if scope["type"] == "http" else None
        if match is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body, complete, extra = await _read_body(receive, self.max_body_bytes)
        reply = self._answer(scope, int(match.group(1)), body) if complete else None
        if reply is None:  # not the happy path: the FastAPI route decides, with the same body
            await self.app(scope, _replay(body, complete, extra, receive), send)
            return
        scope["route"] = _Route()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(reply)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": reply})

    def _answer(self, scope: Scope, worker_id: int, body: bytes) -> bytes | None:
        """The reply's bytes, or None when the route must handle the request."""
        headers = dict(scope["headers"])
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        token = tokens.bearer_token(headers.get(b"authorization", b"").decode("latin-1"))
        hub = self.hub_of()
        if content_type != b"application/json" or token is None or hub is None or worker_id > MAX_ID:
            return None
        entry = hub.cached(worker_id)
        if entry is None:
            return None
        try:
            hub.authenticate(entry, token)
            heartbeat = Heartbeat.model_validate_json(body)
        except (Unauthorized, Forbidden, ValidationError):
            return None
        return hub.accept(entry, heartbeat).model_dump_json().encode()


async def _read_body(receive: Receive, max_bytes: int) -> tuple[bytes, bool, Message | None]:
    """(the body read, whether it is complete, a message other than body to pass on: a disconnect).

    Reading stops past ``max_bytes``: the route's body limit answers that request.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False, message
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if not message.get("more_body", False):
            return b"".join(chunks), True, None
        if size > max_bytes:
            return b"".join(chunks), False, None


def _replay(body: bytes, complete: bool, extra: Message | None, receive: Receive) -> Receive:
    """A ``receive`` that gives back what was read (and the message that stopped it), then goes on."""
    queue: list[Message] = [{"type": "http.request", "body": body, "more_body": not complete}]
    if extra is not None:
        queue.append(extra)

    async def replayed() -> Message:
        if queue:
            return queue.pop(0)
        return await receive()

    return replayed
