"""A run's code and environment on a worker; the orchestrator's create-time check uses them too.

- ``package.py``: the run's code package: checked, extracted, deterministic archives and their digest.
- ``env.py``: the run's requirements installed beside the worker's own packages (uv, else pip), cached.
"""
