"""The API's routes, one module per resource; each module's ``router`` is included by ``create_app``.

- ``runs.py``: create, list, read, scale, stop, resume, delete runs; their events, progress, join token.
- ``workers.py``: registration, heartbeats, deregistration and the admin's worker views.
- ``checkpoints.py``: checkpoint uploads (the elected checkpointer) and downloads.
- ``packages.py``: run code packages (look up, upload, download).
- ``peers.py``: the orchestrator's DHT addresses and a run's initial peers.
- ``worker_logs.py``: the tail of a local worker's log.
- ``swarm_tokens.py``: swarm admission: a worker's swarm token, the admission settings.
- ``health.py``: ``/healthz`` and ``/readyz``.
- ``metrics.py``: ``/metrics`` in the Prometheus text format.
"""
