"""``/docs`` and ``/redoc`` in a real headless Chromium: they render the API's operations, and no
request leaves the orchestrator's origin (no CDN script next to the admin token in localStorage)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Request, expect

from tests.support.browser import open_browser
from tests.support.orchestrator import HAND_ONLY, start_orchestrator
from tests.support.processes import ProcessRegistry

pytestmark = pytest.mark.browser
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


@pytest.mark.timeout(120)
def test_api_docs_render_from_the_orchestrator_alone(processes: ProcessRegistry, tmp_path: Path) -> None:
    orch = start_orchestrator(processes, tmp_path / "data", extra_env=HAND_ONLY)
    origin = urlsplit(orch.url).netloc
    with orch.client() as http:
        operations = sum(len(ops) for ops in http.get("/openapi.json").json()["paths"].values())
        policy = http.get("/docs").headers["content-security-policy"]
    assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy
    with open_browser() as browser:
        page = browser.page
        hosts: list[str] = []  # of requests that reached the network
        blocked: list[str] = []  # attempted, stopped in the browser by the page's CSP
        page.on("requestfinished", lambda request: hosts.append(_host(request)))
        page.on("requestfailed", lambda request: blocked.append(f"{request.url} {request.failure}"))

        page.goto(orch.url + "/docs")
        expect(page.locator(".opblock")).to_have_count(operations, timeout=30_000)
        expect(page.locator("#swagger-ui")).to_contain_text("Create a run (admin)")

        page.goto(orch.url + "/redoc")
        expect(page.locator("redoc")).to_contain_text("Create a run (admin)", timeout=30_000)
        expect(page.locator("redoc")).to_contain_text("Report progress (worker token)")

        assert hosts and set(hosts) <= {origin, "blob"}, sorted(set(hosts))  # blob: ReDoc's search worker
        # ReDoc's sidebar always asks for its maker's logo from their CDN; the CSP stops it in the browser
        assert blocked == [f"{REDOC_LOGO} csp"], blocked
        assert [p for p in browser.problems if REDOC_LOGO not in p] == [], browser.problems


def _host(request: Request) -> str:
    url = urlsplit(request.url)
    return url.netloc if url.scheme in ("http", "https") else url.scheme  # data: and blob: stay local
