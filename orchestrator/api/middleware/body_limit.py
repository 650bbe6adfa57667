"""An ASGI middleware that caps request bodies: 413 before a byte is read when Content-Length is too
big, and :class:`BodyTooLarge` (mapped to 413) once a chunked body passes the cap while being read.

Uploads (checkpoints, code packages: paths matching one of ``upload_limits``) get their own, larger
caps. The error is an
``HTTPException`` so that FastAPI's body parsing passes it through instead of turning it into a 400.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    """The request body passed its cap while being read (413)."""

    def __init__(self, detail: str) -> None:
        super().__init__(status_code=413, detail=detail)


class BodyLimitMiddleware:
    def __init__(
        self, app: ASGIApp, max_body_bytes: int, upload_limits: Sequence[tuple[str, int]] = ()
    ) -> None:
        """``upload_limits``: (path regex, cap in bytes) pairs; the first matching path's cap applies."""
        self.app = app
        self.max_body_bytes = max_body_bytes
        self._uploads = [(re.compile(pattern), cap) for pattern, cap in upload_limits]

    def limit_of(self, path: str) -> int:
        return next((cap for pattern, cap in self._uploads if pattern.match(path)), self.max_body_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_of(scope["path"])
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
