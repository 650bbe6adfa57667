"""Request timing for the metrics: every HTTP request, labelled by its route template and status.

Labels stay bounded: a request is recorded under the template of the route it matched
(``/api/v1/runs/{name}``), never its path; paths no route knows share one label value.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.metrics.service import ServiceMetrics

UNMATCHED_ROUTE = "unmatched"  # 404s of paths no route knows: one label value, whatever the path


class RequestMetricsMiddleware:
    """Times every HTTP request and records it under its route template (``/api/v1/runs/{name}``)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets when the app raises before answering

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            seconds = time.perf_counter() - started
            self.metrics.observe_request(route_template(scope), scope["method"], status, seconds)


def route_template(scope: Scope) -> str:
    """The full template of the matched route (``/api/v1/runs/{name}``), or ``unmatched``.

    The router records the matched route in the scope with its path relative to the router it was
    included from; the literal prefix is the part of the request path in front of the template's
    segments. A template with a ``{...:path}`` parameter spans any number of segments: it is kept
    relative (still a bounded label).
    """
    template = getattr(scope.get("route"), "path", None)
    if not isinstance(template, str) or not template:
        return UNMATCHED_ROUTE
    if ":path}" in template:
        return template
    segments = [s for s in scope["path"].split("/") if s]
    own = [s for s in template.split("/") if s]
    prefix = segments[: max(0, len(segments) - len(own))]
    return "".join(f"/{s}" for s in prefix) + template
