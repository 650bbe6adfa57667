"""The heartbeat hot path: answered from memory, written to the database in batches.

- ``hub.py``: the cache of live workers and active runs, the buffer of their latest heartbeats, and
  the batch writer that flushes it once a second.
- ``fast_path.py``: ASGI middleware that answers a cached worker's valid heartbeat without FastAPI's
  routing (the route answers everything else).
"""
