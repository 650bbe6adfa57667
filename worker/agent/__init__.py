"""``spotswarm-worker``: the agent that joins a run, trains in its swarm, reports and leaves cleanly.

- ``agent.py``: the lifecycle (register, train, stop, deregister) and the exit codes.
- ``config.py``: flags and ``SPOTSWARM_*`` environment variables (the exit codes are
  ``worker/protocol/exit_codes.py``).
- ``cpus.py``: pinning the agent to its own cores (the local launcher's ``cpus_per_worker``).
- ``boot.py``: registration (retried, or from the cached registration), the run's code and environment.
- ``state.py``: what the training thread, the heartbeat and the stop logic share.
- ``training.py``: the swarm's DHT, the resume decision, the Trainer and ``fit``.
- ``callback.py``: the Lightning callback that reports progress and stops at a swarm epoch boundary.
- ``apart.py``: the log line of a worker that trains alone while its run has other workers.
- ``metrics.py``: the loss and the metrics a run reports, read from Lightning.
- ``heartbeat.py``: the heartbeat thread and what the orchestrator answers.
- ``checkpoints.py``: uploading the checkpointer's checkpoints, fetching one to resume from.
- ``resume.py``: which checkpoint a starting worker resumes from: the newest that loads into its module.
- ``client.py``: the typed HTTP client of the orchestrator's worker API.
- ``spot.py``: the watcher of the cloud's spot interruption notice.
- ``token_cache.py``: the cached swarm token and identity, and the token source over the HTTP client.
- ``probe.py``: a run's code checked at create time as a worker would load it (the server's fork server
  runs it by path).

Importing this package loads no torch, Lightning or hivemind; :func:`main` imports the agent when
called. The orchestrator imports none of it.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``spotswarm-worker`` and ``python -m worker.agent``; returns the exit code."""
    from worker.agent.agent import main as run_agent

    return run_agent(argv)
