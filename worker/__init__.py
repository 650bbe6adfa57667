"""spotswarm's worker side: the Lightning ``HivemindStrategy``, the worker agent and examples.

- ``strategy/``: ``HivemindStrategy`` for Lightning 2.x and its hivemind pieces (usable on its own).
- ``admission/``: swarm admission on the peer side (the token authorizer, the averaging guard).
- ``agent/``: ``spotswarm-worker``, which joins a run, trains, heartbeats, checkpoints and leaves; and
  the create-time checks of a run's code (``agent/probe.py``, run in the server's fork server).
- ``protocol/``: what both sides share: the JSON they speak, the API's paths, the states, validators,
  a run's Trainer options, exit codes, peer addresses, the secrets rule.
- ``runtime/``: what a worker process runs on: a run's code package and requirements, logging, a child
  process that ends with its parent.
- ``_hivemind_compat.py``: every workaround of hivemind's behaviour, applied by its ``install()``.
- ``context.py``: what a user's code may ask of its worker (``from worker.context import current_worker``).
- ``arguments.py``: a run spec's constructor arguments checked against the classes' annotations.
- ``files.py``: atomic files and locks.
- ``examples/``: what a user's LightningModule looks like.

The orchestrator imports ``protocol``, ``_hivemind_compat``, ``admission`` and ``runtime`` of this
package, and nothing else (pyproject.toml's import contracts). Importing this package is cheap: heavy
modules (torch, lightning, hivemind) load only when the strategy or the agent's training is used. This
package never imports ``orchestrator``.
"""
