"""The heartbeat hot path: answered from memory, written to the database in batches.

- ``hub.py``: the cache of live workers and active runs and the buffer of their latest heartbeats.
- ``writer.py``: the batch writer: once a second, the buffer and what follows from it (revived workers,
  checkpointer elections, progress samples) go to the database in one transaction.
- ``fast_path.py``: ASGI middleware that answers a cached worker's valid heartbeat without FastAPI's
  routing (the route answers everything else).
"""
