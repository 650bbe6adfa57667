"""The status page: two HTML shells (runs overview, one run) and their static files.

The pages hold no data and no secrets: plain JavaScript in ``static/`` polls the JSON API (``/api/v1``)
and draws the charts as inline SVG, so there is no build step, no CDN and no vendored library. The admin
token is typed by the user once and kept in the browser's localStorage; it is never put into HTML.
A strict Content-Security-Policy (scripts and styles from this origin only) goes with every page.
"""

from __future__ import annotations

import hashlib
import html
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from string import Template

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import HTMLResponse

from worker.wire import RUN_NAME_PATTERN

WEB_DIR = Path(__file__).resolve().parent
TEMPLATE_DIR = WEB_DIR / "templates"
STATIC_DIR = WEB_DIR / "static"
STATIC_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
}

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

router = APIRouter(include_in_schema=False)


@dataclass(frozen=True)
class StaticFile:
    """A file served from memory, revalidated by ETag (an upgraded orchestrator is never served stale)."""

    body: bytes
    media_type: str
    etag: str

    def response(self, if_none_match: str | None) -> Response:
        headers = {"ETag": self.etag, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
        if if_none_match == self.etag:
            return Response(status_code=304, headers=headers)
        return Response(self.body, media_type=self.media_type, headers=headers)


def serve_file(files: dict[str, StaticFile], filename: str, request: Request) -> Response:
    """``files[filename]`` (304 when the client has it), or 404."""
    item = files.get(filename)
    if item is None:
        raise HTTPException(status_code=404, detail=f"no file {filename!r}")
    return item.response(request.headers.get("if-none-match"))


def static_file_of(path: Path) -> StaticFile:
    body = path.read_bytes()
    media_type = STATIC_TYPES[path.suffix]
    return StaticFile(body, media_type, '"' + hashlib.sha256(body).hexdigest()[:16] + '"')


@cache
def _template(name: str) -> Template:
    return Template((TEMPLATE_DIR / name).read_text(encoding="utf-8"))


@cache
def _fragment(name: str) -> str:
    return (TEMPLATE_DIR / name).read_text(encoding="utf-8").rstrip("\n")


@cache
def _static_files() -> dict[str, StaticFile]:
    """Every servable static file by name (a fixed set read once: no path ever reaches the disk)."""
    return {
        path.name: static_file_of(path)
        for path in sorted(STATIC_DIR.iterdir())
        if path.suffix in STATIC_TYPES and path.is_file()
    }


def page(
    request: Request, template: str, headers: dict[str, str] | None = None, **values: str
) -> HTMLResponse:
    """A page of ``templates/`` with ``values`` HTML-escaped, sent with the strict headers by default."""
    root = html.escape(request.scope.get("root_path", "").rstrip("/"), quote=True)
    escaped = {key: html.escape(value, quote=True) for key, value in values.items()}
    # the admin-token panel and the error line are shared by both pages (a fixed fragment: not escaped)
    body = _template(template).substitute(root=root, token_panel=_fragment("_token_panel.html"), **escaped)
    return HTMLResponse(body, headers=headers or PAGE_HEADERS)


@router.get("/", response_class=HTMLResponse)
def overview_page(request: Request) -> HTMLResponse:
    """All runs with their live numbers."""
    return page(request, "overview.html")


@router.get("/runs/{name}", response_class=HTMLResponse)
def run_page(request: Request, name: str) -> HTMLResponse:
    """One run: charts, workers, checkpoints, events, peers, and the scale/stop buttons."""
    if not re.fullmatch(RUN_NAME_PATTERN, name):
        raise HTTPException(status_code=404, detail=f"no run named {name!r}")
    return page(request, "run.html", run_name=name)


@router.get("/static/{filename}")
def static_file(request: Request, filename: str) -> Response:
    """A file of ``static/``, revalidated by ETag (so an upgraded orchestrator is never served stale)."""
    return serve_file(_static_files(), filename, request)
