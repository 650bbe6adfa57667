"""Headless Chromium for the status-page tests, driven by Playwright's Python package.

Playwright's own browser downloads do not work here (no network): the tests use Debian's ``chromium``
(``make browser`` installs it). :func:`open_browser` yields a :class:`BrowserPage` whose ``problems``
collects what would otherwise pass silently: uncaught page errors, console errors and failed requests.
The browser and Playwright's driver are closed when the ``with`` block ends, whatever happens.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import ConsoleMessage, Page, Response, sync_playwright

CHROMIUM_PATH = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-gpu",
]


@dataclass
class BrowserPage:
    page: Page
    problems: list[str] = field(default_factory=list)

    def screenshot(self, path: Path) -> Path:
        """A full-page PNG at ``path`` (parents created)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path), full_page=True)
        return path


def _chromium() -> str:
    found = CHROMIUM_PATH if CHROMIUM_PATH.exists() else shutil.which("chromium")
    if not found:
        raise RuntimeError("chromium is not installed: run `make browser` (apt-get install chromium)")
    return str(found)


@contextmanager
def open_browser(
    width: int = 1280, height: int = 900, expected_statuses: tuple[int, ...] = ()
) -> Iterator[BrowserPage]:
    """A fresh headless Chromium page; HTTP answers >= 400 not in ``expected_statuses`` are problems."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            page = context.new_page()
            page.set_default_timeout(15_000)
            wrapped = BrowserPage(page)

            def on_console(message: ConsoleMessage) -> None:
                if message.type == "error" and "Failed to load resource" not in message.text:
                    wrapped.problems.append(f"console: {message.text}")

            def on_response(response: Response) -> None:
                if response.status >= 400 and response.status not in expected_statuses:
                    wrapped.problems.append(
                        f"HTTP {response.status} {response.request.method} {response.url}"
                    )

            page.on("console", on_console)
            page.on("pageerror", lambda error: wrapped.problems.append(f"page error: {error}"))
            page.on("response", on_response)
            yield wrapped
        finally:
            browser.close()


def chart_points(page: Page, chart_id: str) -> int:
    """The points a chart of the page drew (``drawLineChart`` records them in ``data-points``)."""
    return int(page.locator(f"#{chart_id}").get_attribute("data-points") or 0)
