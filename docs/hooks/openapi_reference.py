"""The REST API reference page, rendered from the app's own OpenAPI document with essentials-openapi
(the engine of neoteroi-mkdocs' ``[OAD(...)]`` plugin), offline.

Every route of the API declares the same error answers (401, 404, 409, 422, 503, ...); listed under each
of 26 operations they would bury the rest, so :func:`shared_responses` takes out the answers that every
operation under a prefix documents identically, and the page lists them once, at the top.
"""

from __future__ import annotations

import copy
from typing import Any

from openapidocs.mk.v3 import OpenAPIV3DocumentationHandler

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def _operations(document: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return [
        operation
        for path, item in document.get("paths", {}).items()
        if path.startswith(prefix)
        for method, operation in item.items()
        if method in HTTP_METHODS
    ]


def shared_responses(document: dict[str, Any], prefix: str) -> dict[str, str]:
    """Status -> description of the answers every operation under ``prefix`` documents identically."""
    operations = _operations(document, prefix)
    if not operations:
        return {}
    common = dict(operations[0].get("responses", {}))
    for operation in operations[1:]:
        responses = operation.get("responses", {})
        common = {status: answer for status, answer in common.items() if responses.get(status) == answer}
    return {status: str(answer.get("description", "")) for status, answer in sorted(common.items())}


def without_responses(document: dict[str, Any], prefix: str, statuses: set[str]) -> dict[str, Any]:
    """A copy of ``document`` whose operations under ``prefix`` no longer list ``statuses``."""
    trimmed = copy.deepcopy(document)
    for operation in _operations(trimmed, prefix):
        for status in statuses:
            operation.get("responses", {}).pop(status, None)
    return trimmed


def openapi_markdown(document: dict[str, Any], title: str, intro: str, prefix: str = "/api/") -> str:
    """The page: title, intro, the shared error answers once, then every operation and schema."""
    shared = shared_responses(document, prefix)
    body = OpenAPIV3DocumentationHandler(
        without_responses(document, prefix, set(shared)), style="MKDOCS"
    ).write()
    # The handler's own title (the API's name and version) gives way to the page's.
    body = "\n".join(line for line in body.splitlines() if not line.startswith("# "))
    lines = [f"# {title}", "", intro.strip(), ""]
    if shared:
        lines += [
            f"Besides the answers listed under each operation, every operation under `{prefix}` may answer:",
            "",
            "| status | when |",
            "| --- | --- |",
            *(f"| {status} | {description} |" for status, description in shared.items()),
            "",
        ]
    return "\n".join(lines) + body
