"""The HTTP edge of the orchestrator: routes by resource, their dependencies and the error table.

The request and response models are ``orchestrator/schemas.py`` (what workers send: ``worker/wire.py``),
below this package and the domain, which builds the responses.

- ``routes/``: one module per resource (runs, workers, checkpoints, packages, peers, worker logs,
  swarm tokens, health, ``/metrics``); each declares an ``APIRouter``.
- ``deps.py``: what routes depend on (the app context, the caller's token, id types) and the auth rule.
- ``errors.py``: the one table from typed errors to HTTP statuses, and the exception handlers.
- ``uploads.py``: streamed uploads (checkpoints, code packages) with their size limit and checksum.
- ``middleware/``: ASGI middleware of the API (the request body limit).

:data:`API_PREFIX` is the one prefix of the JSON API. Importing this package imports no route.
"""

API_PREFIX = "/api/v1"
#: The heartbeat's route template: the route, its fast path and its request metrics all use it.
HEARTBEAT_ROUTE = f"{API_PREFIX}/workers/{{worker_id}}/heartbeat"
