"""The status page's HTTP side: pages with a strict CSP and no secrets, static files by name only."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import ASGIApp

from orchestrator.app import create_app
from orchestrator.config import Settings
from orchestrator.web.static_files import RevalidatedStaticFiles


def asgi_get(
    app: ASGIApp, path: str, headers: dict[str, str] | None = None, root_path: str = ""
) -> httpx.Response:
    """``GET path`` of ``app`` in-process (``root_path``: the prefix a proxy serves it under)."""

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, root_path=root_path)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            return await http.get(path, headers=headers)

    return asyncio.run(call())


class PageClient:
    """The real app in-process, without its lifespan: the page routes need neither database nor DHT."""

    def __init__(self, tmp_path: Path, root_path: str = "") -> None:
        self.app = create_app(Settings(data_dir=tmp_path, admin_token="ssa_secret-token"))
        self.root_path = root_path

    def get(self, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
        return asgi_get(self.app, path, headers, self.root_path)


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


# -- the headers of pages and files, with the values users' browsers get -------------------------------

PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
DOCS_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)


def security_headers(response: httpx.Response) -> dict[str, str | None]:
    names = ("content-security-policy", "x-content-type-options", "referrer-policy", "cache-control")
    return {name: response.headers.get(name) for name in names}


def test_every_page_is_sent_with_its_policy_and_never_cached(tmp_path: Path) -> None:
    http = client(tmp_path)
    for path, policy in (
        ("/", PAGE_POLICY),
        ("/runs/my-run", PAGE_POLICY),
        ("/docs", DOCS_POLICY),
        ("/redoc", DOCS_POLICY),
    ):
        page = http.get(path)
        assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8", path
        assert security_headers(page) == {
            "content-security-policy": policy,
            "x-content-type-options": "nosniff",
            "referrer-policy": "no-referrer",
            "cache-control": "no-store",
        }, path


def test_both_status_pages_share_the_layout_and_load_their_own_script(tmp_path: Path) -> None:
    http = client(tmp_path)
    overview, run = http.get("/").text, http.get("/runs/my-run").text
    for page in (overview, run):
        assert page.startswith("<!doctype html>\n") and page.endswith("</html>\n")
        for shared in (
            '<link rel="stylesheet" href="/static/style.css">',
            '<a class="brand" href="/">spotswarm</a>',
            '<section id="token-panel" class="panel token-panel" hidden>',
            '<div id="error" class="error" role="alert" hidden></div>',
        ):
            assert page.count(shared) == 1, shared
    assert "<title>spotswarm runs</title>" in overview and 'src="/static/overview.js"' in overview
    assert '<table id="runs" class="grid">' in overview and "run.js" not in overview
    assert "<title>my-run · spotswarm</title>" in run and 'src="/static/run.js"' in run
    assert '<span id="run-name">my-run</span>' in run and "overview.js" not in run


def test_pages_under_a_path_prefix_link_within_it_and_escape_it(tmp_path: Path) -> None:
    prefix = '/ops/"><script>alert(1)</script>'
    http = PageClient(tmp_path, root_path=prefix)
    page = http.get(prefix + "/runs/my-run")
    assert page.status_code == 200
    assert "<script>alert" not in page.text
    assert 'data-root="/ops/&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in page.text
    plain = PageClient(tmp_path, root_path="/ops")
    links = plain.get("/ops/").text
    assert 'href="/ops/static/style.css"' in links and 'src="/ops/static/overview.js"' in links
    assert plain.get("/ops/static/style.css").status_code == 200
    docs = plain.get("/ops/docs").text
    assert (
        'src="/ops/docs/assets/swagger-ui-bundle.js"' in docs and 'data-openapi="/ops/openapi.json"' in docs
    )


def test_page_and_docs_files_have_fixed_types_and_are_revalidated(tmp_path: Path) -> None:
    http = client(tmp_path)
    for path, media_type in (
        ("/static/style.css", "text/css; charset=utf-8"),
        ("/static/common.js", "text/javascript; charset=utf-8"),
        ("/docs/assets/swagger-ui.css", "text/css; charset=utf-8"),
        ("/docs/assets/redoc.standalone.js", "text/javascript; charset=utf-8"),
    ):
        first = http.get(path)
        assert first.status_code == 200 and first.content, path
        assert first.headers["content-type"] == media_type, path
        assert first.headers["x-content-type-options"] == "nosniff", path
        assert first.headers["cache-control"] == "no-cache", path
        by_date = http.get(path, headers={"If-Modified-Since": first.headers["last-modified"]})
        assert by_date.status_code == 304 and not by_date.content, path
        assert by_date.headers["cache-control"] == "no-cache", path
        assert "content-security-policy" not in first.headers  # a policy is the page's, not a file's
    # fastapi-offline's static/ also holds a favicon: only scripts, styles, SVG and text are served
    assert http.get("/docs/assets/favicon.png").status_code == 404


def test_a_changed_file_is_served_anew_and_nothing_else_of_the_directory(tmp_path: Path) -> None:
    static = tmp_path / "static"
    static.mkdir()
    script = static / "app.js"
    script.write_text("export const version = 1;\n")
    app = Starlette(routes=[Mount("/static", RevalidatedStaticFiles(directory=static))])

    first = asgi_get(app, "/static/app.js")
    assert first.status_code == 200 and first.headers["cache-control"] == "no-cache"
    assert asgi_get(app, "/static/app.js", {"If-None-Match": first.headers["etag"]}).status_code == 304
    script.write_text("export const version = 2;\n")  # an upgrade: same size, a later mtime
    mtime_s = script.stat().st_mtime + 5
    os.utime(script, (mtime_s, mtime_s))
    upgraded = asgi_get(app, "/static/app.js", {"If-None-Match": first.headers["etag"]})
    assert upgraded.status_code == 200 and upgraded.text == "export const version = 2;\n"

    (static / "notes.md").write_text("not a served type\n")
    (tmp_path / "outside.js").write_text("export const secret = 1;\n")
    (static / "link.js").symlink_to(tmp_path / "outside.js")
    for name in ("notes.md", "link.js", "..%2Foutside.js", "%2E%2E%2Foutside.js", ""):
        assert asgi_get(app, f"/static/{name}").status_code == 404, name
