"""An ASGI middleware that caps request bodies: 413 before a byte is read when Content-Length is too
big, and :class:`BodyTooLarge` (mapped to 413) once a chunked body passes the cap while being read.

Checkpoint uploads (paths matching ``upload_path_re``) get their own, larger cap. The error is an
``HTTPException`` so that FastAPI's body parsing passes it through instead of turning it into a 400.
"""

from __future__ import annotations

import json
import re

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    """The request body passed its cap while being read (413)."""

    def __init__(self, detail: str) -> None:
        super().__init__(status_code=413, detail=detail)


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int, upload_max_bytes: int, upload_path_re: str) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.upload_max_bytes = upload_max_bytes
        self._upload_path = re.compile(upload_path_re)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.upload_max_bytes if self._upload_path.match(scope["path"]) else self.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _reject(send, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(f"request body exceeds the limit of {limit} bytes")
            return message

        await self.app(scope, limited_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _reject(send: Send, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
