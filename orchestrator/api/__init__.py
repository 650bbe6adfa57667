"""The HTTP edge of the orchestrator: routes by resource, their dependencies and the error table.

The request and response models are ``orchestrator/schemas.py`` (what workers send: ``worker/protocol/``),
below this package and the domain, which builds the responses.

- ``routes/``: one module per resource (runs, workers, checkpoints, packages, peers, worker logs,
  swarm tokens, health, ``/metrics``); each declares an ``APIRouter``.
- ``deps.py``: what routes depend on (the app context, the caller's token, id types) and the auth rule.
- ``errors.py``: the one table from typed errors to HTTP statuses, and the exception handlers.
- ``uploads.py``: streamed uploads (checkpoints, code packages) with their size limit and checksum.
- ``middleware/``: ASGI middleware of the API (the request body limit).

The JSON API's prefix and route templates are defined once, in ``worker/protocol/paths.py``
(:data:`API_PREFIX`, :class:`ApiPath`), which clients share. Importing this package imports no route.
"""

from __future__ import annotations

import re

from worker.protocol.paths import API_PREFIX, ApiPath

__all__ = ["API_PREFIX", "HEARTBEAT_ROUTE", "ApiPath", "path_regex"]

#: The heartbeat's full route template: the route, its fast path and its request metrics all use it.
HEARTBEAT_ROUTE = API_PREFIX + ApiPath.heartbeat


def path_regex(template: str, **groups: str) -> str:
    """A regex of the full paths of an :class:`ApiPath` template: each ``{param}`` matches one path
    segment, or the pattern ``groups`` gives for it."""
    pattern = re.escape(API_PREFIX + template)
    for name in re.findall(r"\{(\w+)\}", template):
        pattern = pattern.replace(re.escape("{" + name + "}"), groups.get(name, "[^/]+"))
    return f"^{pattern}$"
