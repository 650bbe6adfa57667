"""The status page served by the orchestrator: ``routes.py`` (HTML shells, static files), ``templates/``
(two pages), ``static/`` (plain JavaScript that polls the JSON API and draws inline-SVG charts, and CSS)."""

from orchestrator.web.routes import router

__all__ = ["router"]
