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
(:data:`API_PREFIX`, :class:`ApiPath`, with ``HEARTBEAT_ROUTE`` and ``path_regex``; the ``MAX_ID`` of ids
in paths is in ``worker/protocol/validators.py``), which clients and the server's lower layers (the
heartbeat fast path, the request metrics) share. Importing this package imports no route.
"""

from __future__ import annotations

from worker.protocol.paths import API_PREFIX, ApiPath

__all__ = ["API_PREFIX", "ApiPath"]
