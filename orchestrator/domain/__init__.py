"""The service layer: the rules of runs and workers, and the use cases routes call. The rules take a
session and ``now``, raise the typed errors of ``orchestrator/errors.py`` and never commit; a use case
(``usecases.py``) owns the transaction around them, the store, and one "changed" signal after the commit.

- ``usecases.py``: create a run, scale, stop, resume, delete it, replace its join token, revoke
  hand-joined workers, a worker leaves, upload and delete checkpoints, one that did not load: each
  checks once, commits, and signals "changed" when the heartbeat cache must reload.
- ``registration.py``: a worker joins its run, in a transaction shared with the registrations arriving
  with it; the new worker goes into the heartbeat cache at once.

- ``states.py``: the allowed run and worker transitions, and every set of states a rule names.
- ``runs.py``: run operations and the only functions that change a run's or a worker's state.
- ``events.py``: a run's history (each event is a row and a log line).
- ``checkpointer.py``: which live worker of a run saves its checkpoints (the eligibility rule, the election).
- ``workers.py``: launch intents, registration, leaving, retiring.
- ``checkpoints.py``: checkpoint records (newest first, the last K kept) and upload slots.
- ``views.py``: the read side: runs with their live numbers, events, progress series, workers, peers.
- ``estimates.py``: a run's cost so far and ETA, returned in its view (page, CLI and ``/metrics`` show them).
- ``crash_budget.py``: launched workers failing with the same error fail the run.
- ``averaging.py``: whether a run's workers average together, and its warning.
- ``swarm_forming.py``: whether its swarm formed at all: the warning within seconds, the note it ends with.
- ``reported.py``: a run's loss and metrics from its workers' latest reports.
- ``progress_samples.py``: one aggregated progress point per run and interval, thinned.
- ``churn.py``: desired workers over time, notice and loss marks, and goodput (defined there alone).
- ``deployment_facts.py``: what every orchestrator on one database must agree on (the swarm authority).
"""
