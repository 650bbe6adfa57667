"""``make docs-build``, as CI runs it: the site builds with ``mkdocs build --strict``; its reference pages
are generated from the code (every setting, every ``spotswarm serve`` flag, the app's own OpenAPI
document); and no page loads anything from another host."""

from __future__ import annotations

import html
import json
import os
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from orchestrator.app import create_app
from orchestrator.cli.serve import serve
from orchestrator.config import ENV_PREFIX, Settings
from tests.support.processes import REPO_ROOT

# `make -o` takes the venv as built: the test runs inside it, and must not reinstall it.
KEEP_VENV = ("-o", ".venv/.spotswarm-installed")
# Attributes through which a page fetches something by itself (links a reader follows are not fetches).
FETCHING = {("script", "src"), ("link", "href"), ("img", "src"), ("iframe", "src"), ("source", "src")}


class _Fetches(HTMLParser):
    """The URLs a page's markup loads by itself."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if (tag, name) in FETCHING and value:
                self.urls.append(value)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        ["make", *KEEP_VENV, "docs-build", f"DOCS_SITE={out}"],
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return out


@pytest.mark.timeout(450)
def test_make_docs_build_builds_the_site_strictly_with_its_generated_reference(site: Path) -> None:
    settings_page = (site / "reference" / "settings" / "index.html").read_text()
    for setting in Settings.setting_fields():
        assert setting.env in settings_page, setting.name
    cli_page = (site / "reference" / "cli" / "index.html").read_text()
    for option in serve.params:
        assert max(option.opts, key=len) in cli_page, option.name
    assert "Sentinel" not in cli_page  # click's UNSET default, shown as None instead

    published = json.loads((site / "reference" / "openapi.json").read_text())
    assert published == create_app(Settings.model_construct(data_dir=site)).openapi()
    schema_page = (site / "reference" / "rest-api-schema" / "index.html").read_text()
    for path, operations in published["paths"].items():
        for operation in operations.values():
            assert html.escape(operation["summary"], quote=False) in schema_page, (path, operation["summary"])


@pytest.mark.timeout(450)
def test_no_page_of_the_site_fetches_anything_from_another_host(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 30
    outside: list[str] = []
    for page in pages:
        parser = _Fetches()
        parser.feed(page.read_text())
        outside += [f"{page.relative_to(site)}: {url}" for url in parser.urls if urlsplit(url).netloc]
    for sheet in site.rglob("*.css"):
        for url in sheet.read_text().split("url(")[1:]:
            if url.lstrip("'\"").startswith(("http:", "https:", "//")):
                outside.append(f"{sheet.relative_to(site)}: url({url[:80]}")
    assert outside == []
