"""``make docs`` serves the documentation site on 127.0.0.1 and says where; in a real headless Chromium
its pages (the generated API reference and the search included) load nothing from any other host."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Request, expect

from tests.support.browser import open_browser
from tests.support.ports import free_port
from tests.support.processes import ProcessRegistry
from tests.support.waiting import wait_until

pytestmark = pytest.mark.browser
# `make -o` takes the venv as built: the test runs inside it, and must not reinstall it.
KEEP_VENV = ("-o", ".venv/.spotswarm-installed")
PAGES = ("", "reference/settings/", "reference/rest-api-schema/", "concepts/runs/")


@pytest.mark.timeout(400)
def test_make_docs_serves_the_site_and_the_browser_asks_nothing_of_other_hosts(
    processes: ProcessRegistry,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    docs = processes.start("make-docs", ["make", *KEEP_VENV, "docs", f"DOCS_PORT={port}"])

    # The first build imports the orchestrator to generate the reference pages: give it time.
    index = wait_until(lambda: _page(url), timeout_s=300, interval_s=1, message=f"{url} serves the site")
    assert "<title>spotswarm</title>" in index
    assert f"spotswarm docs: {url}" in docs.log()

    with open_browser() as browser:
        page = browser.page
        hosts: list[str] = []
        page.on("request", lambda request: hosts.append(_host(request)))
        for path in PAGES:
            page.goto(url + path)
            expect(page.locator("article")).to_be_visible()
        page.locator("label.md-search__icon, .md-search__input").first.click()
        page.keyboard.type("heartbeat")
        expect(page.locator(".md-search-result__item").first).to_be_visible(timeout=30_000)
        assert hosts and set(hosts) <= {f"127.0.0.1:{port}", "data", "blob"}, sorted(set(hosts))
        assert browser.problems == [], browser.problems

    processes.kill_all()  # by process group: make and the mkdocs server it started
    assert not docs.alive()


def _page(url: str) -> str:
    """The page's HTML, or "" (not yet) while the server is not up or answers anything but 200."""
    answer = httpx.get(url, timeout=5)
    return answer.text if answer.status_code == 200 else ""


def _host(request: Request) -> str:
    parts = urlsplit(request.url)
    return parts.netloc if parts.scheme in ("http", "https", "ws", "wss") else parts.scheme
