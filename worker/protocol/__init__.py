"""What the orchestrator and its workers share: the JSON they speak, the API's paths, the states and
validators both sides apply, and the small rules both must read alike.

Both sides import this package (the orchestrator may import it, the hivemind compatibility module,
``admission`` and ``runtime`` of ``worker``, and nothing else: pyproject.toml's import contracts). It
depends on pydantic (and pydantic-settings) at import time, so importing it pulls in neither torch nor
hivemind.

- ``paths.py``: the API's prefix and route templates (``ApiPath``), the checksum header.
- ``runs.py``: ``RunSpec``, the run states, the stop condition, what of a spec workers get.
- ``workers.py``: registration, heartbeats, averaging outcomes, leaving, the worker states.
- ``swarm_tokens.py``: the wire models of swarm admission.
- ``trainer.py``: a run's ``trainer`` section, and the callbacks and loggers a worker accepts.
- ``metrics.py``: ``report_metrics``: which metrics workers report, bounded.
- ``sync.py``: the sync modes and the DiLoCo knobs a run may set, and their check.
- ``checkpoints.py``: what a run's checkpoint holds besides Lightning's keys; the exported form.
- ``validators.py``: plain text, plain JSON, import paths, integer bounds, the states' enum base.
- ``errors.py``: how an API error reads (both HTTP clients word refusals with it).
- ``exit_codes.py``, ``imds.py``: the agent's exit codes; the EC2 metadata paths spot workers read.
- ``comma_list.py``, ``peer_addresses.py``, ``redaction.py``: settings given as ``a, b``; which peer
  addresses are usable; the rule that masks a run's secret values.
"""
