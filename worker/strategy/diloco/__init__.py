"""DiLoCo mode of ``HivemindStrategy`` (``strategy_options: {"sync": "diloco"}``): rare averaging rounds.

Each peer trains with its own (inner) optimizer every batch; once per round the peers all-reduce their
pseudo-gradients (the last global weights minus their local weights), weighted by the samples each
computed in the round, and each applies one outer Nesterov SGD step to its CPU copy of the global
weights, which then become the local weights. A round costs one all-reduce of the parameters' size, so
rounds that come every ``sync_every_s`` seconds keep the peers computing most of the time.

- ``settings.py``: the mode's knobs, their defaults and checks (also run when a run is created).
- ``outer.py``: the global copy, the pseudo-gradients and the outer step (plain torch, no hivemind).
- ``averager.py``: hivemind's ``DecentralizedAverager`` for pseudo-gradients, handing the global state
  to joiners.
- ``schedule.py``: when a round is due (by the swarm's clock or by steps).
- ``optimizer.py``: the optimizer Lightning steps: the inner step every batch, a round when due, its
  checkpoint state (the outer state and the local weights).
- ``model_state.py``: the module's state with the global weights, a checkpoint's ``state_dict``.
"""
