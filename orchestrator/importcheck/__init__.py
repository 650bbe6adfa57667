"""A run's code checked at create time without importing user code in the server.

- ``checker.py``: the checks of a run spec (module, data module, trainer options, strategy options),
  run in the server's fork server with the run's environment. The checks themselves are the agent's
  (``worker/agent/probe.py``), named by path: the server imports nothing of them.
- ``names.py``: the top-level names a run's package may not ship (``worker``, ``orchestrator``: spotswarm's).
"""
