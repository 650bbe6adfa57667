"""The status page served by the orchestrator: ``routes.py`` (HTML shells, static files), ``templates/``
(two pages), ``static/`` (plain JavaScript that polls the JSON API and draws inline-SVG charts, and CSS),
and ``apidocs.py`` (``/docs`` and ``/redoc`` with their scripts served locally, not from a CDN)."""

from orchestrator.web.apidocs import router as docs_router
from orchestrator.web.routes import router

__all__ = ["docs_router", "router"]
