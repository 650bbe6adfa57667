"""MkDocs hook: the reference pages generated from the code at every build (``mkdocs.yml`` ``hooks:``).

- ``reference/settings.md`` from the orchestrator's settings model and ``spotswarm serve``'s options;
- ``reference/rest-api-schema.md`` from the app's OpenAPI document, which is also published as
  ``reference/openapi.json``.

Nothing is written into ``docs/``: the pages exist only in the build. The CLI reference needs no hook
(``::: mkdocs-click`` in ``reference/cli.md``). The three code locations this hook reads are the
constants below.
"""

from __future__ import annotations

import importlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the generators beside this file

from openapi_reference import openapi_markdown
from settings_reference import settings_markdown

SETTINGS_MODEL = "orchestrator.config:Settings"
SERVE_COMMAND = "orchestrator.cli.serve:serve"
APP_FACTORY = "orchestrator.app:create_app"
CLI_PAGE = "reference/cli.md"

SETTINGS_INTRO = """
Every setting of `spotswarm serve`, read from the code at build time. A flag wins over the environment
variable, which wins over the default; `spotswarm serve --help` prints the same list. Where a setting
matters, the guides say more: [run the orchestrator](../guides/orchestrator.md),
[PostgreSQL and several orchestrators](../guides/postgresql-ha.md), [AWS](../guides/aws.md).
"""

API_INTRO = """
Every operation of the orchestrator's REST API and every schema it uses, rendered from the OpenAPI
document the server itself produces (download it: [openapi.json](openapi.json)). Who may call what,
and a tour with `curl`: [REST API](rest-api.md). A running orchestrator serves the same reference at
`/docs` (Swagger UI) and `/redoc`.
"""


def _load(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def openapi_document() -> dict[str, Any]:
    """The app's OpenAPI document; building the app starts nothing (no lifespan runs)."""
    settings_model, create_app = _load(SETTINGS_MODEL), _load(APP_FACTORY)
    with tempfile.TemporaryDirectory() as data_dir:
        # model_construct: defaults only, never this machine's SPOTSWARM_* variables
        app = create_app(settings_model.model_construct(data_dir=Path(data_dir)))
        return dict(app.openapi())


def on_page_content(html: str, page: Page, **_: Any) -> str:
    """mkdocs-click 0.9 prints click >= 8.3's ``UNSET`` sentinel as an option's default where click has
    none (mkdocs/mkdocs-click pull request 95 fixes it upstream); show what earlier clicks gave: None."""
    if page.file.src_uri == CLI_PAGE:
        return html.replace("<code>Sentinel.UNSET</code>", "None")
    return html


def on_files(files: Files, config: MkDocsConfig) -> Files:
    document = openapi_document()
    pages = {
        "reference/settings.md": settings_markdown(
            _load(SETTINGS_MODEL), _load(SERVE_COMMAND), "Settings of spotswarm serve", SETTINGS_INTRO
        ),
        "reference/rest-api-schema.md": openapi_markdown(document, "REST API schema", API_INTRO),
        "reference/openapi.json": json.dumps(document, indent=2) + "\n",
    }
    for src_uri, content in pages.items():
        files.append(File.generated(config, src_uri, content=content))
    return files
