"""The pages' Jinja2 environment and the security headers every page is sent with.

Templates live in ``templates/``: ``base.html`` is the status page's layout (head, header bar, admin
token panel) that ``overview.html`` and ``run.html`` extend; ``docs.html`` and ``redoc.html`` are the
API reference pages. Every value is HTML-escaped (``autoescape``), and a name a template uses but is
not given is an error, not an empty string (``StrictUndefined``). ``root`` (the ASGI root path, for
an orchestrator served under a path prefix) is given to every template.
"""

from __future__ import annotations

from pathlib import Path

import jinja2
from fastapi import Request
from fastapi.templating import Jinja2Templates

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
#: Sent with every status page: scripts and styles from this origin only, no referrer, never cached
#: (the pages are shells; their data comes from the API).
PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def root_path(request: Request) -> dict[str, str]:
    """``root``: the path prefix the orchestrator is served under ('' at the top), for the pages' links."""
    return {"root": request.scope.get("root_path", "").rstrip("/")}


templates = Jinja2Templates(
    env=jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        # a line holding only a block tag leaves no blank line behind, and files end with their newline
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    ),
    context_processors=[root_path],
)
