"""ASGI middleware of the API.

- ``body_limit.py``: refuses request bodies over their limit (413) before a route reads them.
- ``trusted_hosts.py``: refuses requests naming a host the API is not served as (400: DNS rebinding).

The heartbeat's fast path is middleware too; it lives with the heartbeat hub (``heartbeats/fast_path.py``).
"""
