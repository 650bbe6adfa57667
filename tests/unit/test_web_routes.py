"""The status page's HTTP side: pages with a strict CSP and no secrets, static files by name only."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from orchestrator.app import create_app
from orchestrator.config import Settings


class PageClient:
    """The real app in-process, without its lifespan: the page routes need neither database nor DHT."""

    def __init__(self, tmp_path: Path) -> None:
        self.app = create_app(Settings(data_dir=tmp_path, admin_token="ssa_secret-token"))

    def get(self, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://page.test") as http:
                return await http.get(path, headers=headers)

        return asyncio.run(call())


def client(tmp_path: Path) -> PageClient:
    return PageClient(tmp_path)


def test_pages_have_a_strict_csp_and_no_token(tmp_path: Path) -> None:
    http = client(tmp_path)
    for path in ("/", "/runs/my-run"):
        page = http.get(path, headers={"Authorization": "Bearer ssa_secret-token"})
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert "ssa_secret-token" not in page.text and "<script>" not in page.text
    assert 'data-run="my-run"' in http.get("/runs/my-run").text


def test_bad_run_names_and_unknown_static_files_are_404(tmp_path: Path) -> None:
    http = client(tmp_path)
    assert http.get("/runs/Not_A_Name").status_code == 404
    assert http.get("/runs/%3Cscript%3E").status_code == 404
    for name in ("nope.js", "..%2Froutes.py", "%2E%2E%2F__init__.py", "routes.py"):
        assert http.get(f"/static/{name}").status_code == 404, name


def test_static_files_are_revalidated_by_etag(tmp_path: Path) -> None:
    http = client(tmp_path)
    first = http.get("/static/run.js")
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/javascript")
    assert first.headers["cache-control"] == "no-cache"
    again = http.get("/static/run.js", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and not again.content
    for name in ("common.js", "charts.js", "overview.js", "style.css"):
        assert http.get(f"/static/{name}").status_code == 200
