"""What a worker process runs on: a run's code and environment, its logging, its tie to its parent. The
orchestrator uses them too (its create-time check, its logs, its child processes).

- ``package.py``: the run's code package: checked, extracted, deterministic archives and their digest.
- ``env.py``: the run's requirements installed beside the worker's own packages (uv, else pip), cached.
- ``logsetup.py``: one logging set-up for both sides: readable lines or JSON lines, secrets masked.
- ``lifeline.py``: a child process that ends with its parent.
"""
