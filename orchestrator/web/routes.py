"""The status page: two HTML shells (runs overview, one run) and their static files.

The pages hold no data and no secrets: plain JavaScript in ``static/`` polls the JSON API (``/api/v1``)
and draws the charts as inline SVG, so there is no build step, no CDN and no vendored library. The admin
token is typed by the user once and kept in the browser's localStorage; it is never put into HTML.
A strict Content-Security-Policy (scripts and styles from this origin only) goes with every page.
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse

from orchestrator.web.static_files import RevalidatedStaticFiles
from orchestrator.web.templating import PAGE_HEADERS, templates
from worker.protocol.runs import RUN_NAME_PATTERN

STATIC_DIR = Path(__file__).resolve().parent / "static"

router = APIRouter(include_in_schema=False)
# /static/{file}: revalidated on every use, so an upgraded orchestrator is never served stale
router.mount("/static", RevalidatedStaticFiles(directory=STATIC_DIR), name="static")


@router.get("/", response_class=HTMLResponse)
def overview_page(request: Request) -> HTMLResponse:
    """All runs with their live numbers."""
    return templates.TemplateResponse(request, "overview.html", headers=PAGE_HEADERS)


@router.get("/runs/{name}", response_class=HTMLResponse)
def run_page(request: Request, name: str) -> HTMLResponse:
    """One run: charts, workers, checkpoints, events, peers, and the scale/stop buttons."""
    if not re.fullmatch(RUN_NAME_PATTERN, name):
        raise HTTPException(status_code=404, detail=f"no run named {name!r}")
    return templates.TemplateResponse(request, "run.html", {"run_name": name}, headers=PAGE_HEADERS)
