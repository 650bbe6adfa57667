"""The status page and the API docs served by the orchestrator.

- ``routes.py``: the status page's two HTML shells (``/``, ``/runs/{name}``) and ``/static/``;
- ``apidocs.py``: ``/docs`` and ``/redoc``, their scripts served locally (``/docs/assets/``), not from
  a CDN;
- ``templating.py``: the Jinja2 environment (autoescaped) and the pages' security headers;
- ``static_files.py``: Starlette's ``StaticFiles`` revalidated on every use, fixed media types;
- ``templates/``: ``base.html`` (the status page's layout) and the pages that extend it, and the two
  API docs pages;
- ``static/``: plain JavaScript that polls the JSON API and draws inline-SVG charts, and the CSS.
"""

from orchestrator.web.apidocs import router as docs_router
from orchestrator.web.routes import router

__all__ = ["docs_router", "router"]
