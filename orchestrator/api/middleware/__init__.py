"""ASGI middleware of the API.

- ``body_limit.py``: refuses request bodies over their limit (413) before a route reads them.

The heartbeat's fast path is middleware too; it lives with the heartbeat hub (``heartbeats/fast_path.py``).
"""
