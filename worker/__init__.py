"""spotswarm's worker side: the Lightning ``HivemindStrategy``, the worker agent and examples.

- ``strategy/``: ``HivemindStrategy`` for Lightning 2.x and its hivemind pieces (usable on its own).
- ``admission/``: swarm admission on the peer side (the token authorizer, the averaging guard).
- ``agent/``: ``spotswarm-worker``, which joins a run, trains, heartbeats, checkpoints and leaves.
- ``runtime/``: a run's code package and requirements on a worker.
- ``wire.py``, ``wire_trainer.py``: the JSON both sides speak (the orchestrator imports these).
- ``context.py``: what a user's code may ask of its worker (``from worker.context import current_worker``).
- ``trainer_options.py``: the Trainer options and plugins a run spec may name.
- ``arguments.py``: a run spec's constructor arguments checked against the classes' annotations.
- ``logsetup.py``, ``lifeline.py``, ``peer_addresses.py``, ``files.py``, ``comma_list.py``: small pieces
  several of the above (and the orchestrator) share: logging, a child process that ends with its parent,
  which peer addresses are usable, atomic files and locks, settings given as ``a, b``.
- ``examples/``: what a user's LightningModule looks like.

Importing this package is cheap: heavy modules (torch, lightning, hivemind) load only when the strategy
or the agent's training is used. This package never imports ``orchestrator``.
"""
