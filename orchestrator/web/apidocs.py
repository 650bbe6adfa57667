"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) served from this orchestrator, never from a CDN.

FastAPI's own pages load ``swagger-ui-dist@5`` and ``redoc@2`` from jsdelivr: floating versions of
third-party scripts running in the origin whose localStorage holds the admin token. Here the scripts
come from the ``fastapi-offline`` package (a pinned copy of Swagger UI 5 and ReDoc 2, MIT; Swagger UI is
Apache-2.0, ReDoc MIT), served under ``/docs/assets/``, and the pages send a Content-Security-Policy
that lets scripts come from this origin only. Styles may be inline: both libraries inject ``<style>``
elements (styled-components, React), and a style cannot read the token.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from orchestrator.web.static_files import RevalidatedStaticFiles
from orchestrator.web.templating import PAGE_HEADERS, templates

DOCS_CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
DOCS_HEADERS = {**PAGE_HEADERS, "Content-Security-Policy": DOCS_CONTENT_SECURITY_POLICY}

router = APIRouter(include_in_schema=False)
# /docs/assets/{file}: the scripts and styles of fastapi-offline's static/ (revalidated like the page's)
router.mount(
    "/docs/assets", RevalidatedStaticFiles(packages=[("fastapi_offline", "static")]), name="docs-assets"
)


@router.get("/docs", response_class=HTMLResponse)
def swagger_page(request: Request) -> HTMLResponse:
    """The interactive API reference (Swagger UI) of ``/openapi.json``."""
    return templates.TemplateResponse(request, "docs.html", headers=DOCS_HEADERS)


@router.get("/redoc", response_class=HTMLResponse)
def redoc_page(request: Request) -> HTMLResponse:
    """The API reference as one document (ReDoc)."""
    return templates.TemplateResponse(request, "redoc.html", headers=DOCS_HEADERS)
