"""A run's code checked at create time without importing user code in the server.

- ``checker.py``: the checks of a run spec (module, data module, trainer options, strategy options),
  run by a probe process with the run's environment.
- ``names.py``: the top-level names a run's package may not ship (``worker``, ``orchestrator``: spotswarm's).
- ``probe.py``: the probe (``python -m orchestrator.importcheck.probe``): imports and answers over a pipe.
"""
