"""Who this worker is, for the run's code: its id, a stable index and the run's live worker count.

User code shards its data with it (docs/guides/worker-agent.md)::

    from worker.context import current_worker
    ctx = current_worker()          # None outside a spotswarm worker
    shard = range(ctx.worker_index, len(dataset), max(ctx.num_workers, ctx.worker_index + 1))

The agent sets ``SPOTSWARM_WORKER_ID``, ``SPOTSWARM_WORKER_INDEX`` and ``SPOTSWARM_NUM_WORKERS`` when it
registers (before the run's code is imported), and keeps the live count here up to date from each
heartbeat reply (the environment is written only once: setting variables while other threads may read
them is not safe in C libraries). The index is the lowest slot free among the run's live workers when
this one registered, held while it lives and reused by its replacement; the count changes with churn.

It also seeds what decides each worker's sampling order (:func:`seed_sampling`): one
``seed_everything(42)`` in user code would otherwise make every worker draw the same batches.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass

WORKER_ID_ENV = "SPOTSWARM_WORKER_ID"
WORKER_INDEX_ENV = "SPOTSWARM_WORKER_INDEX"
NUM_WORKERS_ENV = "SPOTSWARM_NUM_WORKERS"
USER_SEED_ENV = "PL_GLOBAL_SEED"  # what Lightning's seed_everything records

_lock = threading.Lock()
_live_count: int | None = None


@dataclass(frozen=True)
class WorkerContext:
    worker_id: str
    worker_index: int  # stable while the worker lives; its replacement gets it again
    num_workers: int  # the count to shard by: desired workers, or more when more run


def current_worker() -> WorkerContext | None:
    """This worker's context, or None when not running under the spotswarm agent."""
    worker_id = os.environ.get(WORKER_ID_ENV)
    index = os.environ.get(WORKER_INDEX_ENV)
    if not worker_id or index is None:
        return None
    with _lock:
        count = _live_count
    if count is None:
        count = int(os.environ.get(NUM_WORKERS_ENV) or 1)
    return WorkerContext(worker_id, int(index), max(1, count))


def publish(worker_id: str, worker_index: int, num_workers: int) -> None:
    """The agent's side, once at registration (before the run's code is imported)."""
    os.environ[WORKER_ID_ENV] = worker_id
    os.environ[WORKER_INDEX_ENV] = str(worker_index)
    os.environ[NUM_WORKERS_ENV] = str(num_workers)
    set_live_count(num_workers)


def set_live_count(num_workers: int | None) -> None:
    """The agent's side, from each heartbeat reply (None: an orchestrator that does not say)."""
    global _live_count
    if num_workers is None:
        return
    with _lock:
        _live_count = num_workers


def sampling_seed(worker_id: str, user_seed: str | None) -> int:
    """A 32-bit seed of this worker: from its id and the user's own seed (reproducible per worker)."""
    digest = hashlib.sha256(f"{user_seed or ''}/{worker_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def seed_sampling(worker_id: str) -> int:
    """Seed ``random``, numpy and torch (what the DataLoader's shuffling and its workers' seeds draw from)
    from this worker's identity, and return the seed.

    As hivemind's own examples do ("shuffle data independently for each peer to avoid duplicating
    batches"): call it after the user's module and datamodule were built and before the first training
    dataloader is iterated. Lightning's ``seed_everything`` also records the seed for dataloader workers.
    """
    from lightning.fabric.utilities.seed import seed_everything

    return int(seed_everything(sampling_seed(worker_id, os.environ.get(USER_SEED_ENV)), verbose=False))
