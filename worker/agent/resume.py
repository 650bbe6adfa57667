"""Which of the run's checkpoints a starting worker resumes from: the newest that loads into its module.

A checkpoint came over the network, uploaded by whichever worker held the checkpointer role, so it may
not load: bytes the server's format check let through, a state of another model, a file cut short. Before,
``trainer.fit`` then raised, the worker failed before training, and every launched worker after it failed
the same way until the run failed on start-up failures. Now each candidate (the registration's
``resume_checkpoint``, then its ``older_checkpoints``, newest first) is downloaded and loaded first, as
``fit`` will load it (``weights_only=True``, so no code in it runs); its ``state_dict`` must fit the
module's keys and shapes, and the keys Lightning's restore reads must be there. One that does not is
reported to the orchestrator (an event that names it and its uploader) and skipped; when none fits, the
worker starts from its module's own weights or the swarm's. Loading it twice costs the checkpoint's size
in memory for a moment at start.
"""

from __future__ import annotations

import logging
import pickle
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from worker.agent.checkpoints import fetch_checkpoint
from worker.agent.client import ApiError, NotFound, OrchestratorClient
from worker.protocol.workers import CheckpointRef, WorkerRegistered

logger = logging.getLogger(__name__)

#: what ``torch.load`` raises for bytes it cannot read or will not unpickle with ``weights_only``
LOAD_ERRORS = (
    pickle.UnpicklingError,
    RuntimeError,
    ValueError,
    EOFError,
    OSError,
    KeyError,
    AttributeError,
    TypeError,
    ImportError,
    zipfile.BadZipFile,
)
SHOWN_NAMES = 3  # of the keys that differ, how many a message names
#: what ``trainer.fit(ckpt_path=...)`` reads besides the state_dict (a KeyError there without them)
LIGHTNING_KEYS = ("pytorch-lightning_version", "optimizer_states")


def checkpoint_problem(path: Path, module: Any) -> str | None:
    """Why the checkpoint at ``path`` cannot resume ``module`` (a LightningModule), or None if it can."""
    import torch

    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except LOAD_ERRORS as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        return f"it does not load: {type(exc).__name__}: {first_line}"
    state = checkpoint.get("state_dict") if isinstance(checkpoint, Mapping) else None
    if not isinstance(state, Mapping):
        return "it holds no state_dict"
    problem = state_problem(state, module.state_dict(), strict=getattr(module, "strict_loading", True))
    if problem is not None:
        return problem
    missing = [key for key in LIGHTNING_KEYS if key not in checkpoint]
    return f"it is no Lightning checkpoint: no {', '.join(missing)}" if missing else None


def state_problem(
    state: Mapping[str, Any], expected: Mapping[str, Any], *, strict: bool = True
) -> str | None:
    """How ``state`` (a checkpoint's ``state_dict``) does not fit ``expected`` (the module's), or None.

    With ``strict`` (Lightning's ``strict_loading``, on by default) the keys must be the same; shapes must
    match for every key both have."""
    if strict:
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        if missing or unexpected:
            return (
                f"its state_dict does not fit the module: missing {missing[:SHOWN_NAMES]}, unexpected "
                f"{unexpected[:SHOWN_NAMES]}"
            )
    wrong = [
        key
        for key, tensor in expected.items()
        if key in state and tuple(getattr(state[key], "shape", ())) != tuple(tensor.shape)
    ]
    if wrong:
        return f"its state_dict's shapes differ from the module's at {wrong[:SHOWN_NAMES]}"
    return None


def resume_path(
    client: OrchestratorClient,
    registration: WorkerRegistered,
    worker_dir: Path,
    module: Any,
    candidates: Sequence[CheckpointRef],
) -> str | None:
    """The path of the newest of ``candidates`` that loads into ``module``, downloaded; None if none does.

    Each one that does not is logged, reported (``POST /workers/{id}/resume-failures``) and deleted. A
    failed download of the newest ends the search (as before: training starts without it); an older one
    that is gone (pruned meanwhile) is skipped.
    """
    for index, ref in enumerate(candidates):
        try:
            if index == 0:  # if it was pruned meanwhile, the run's latest is newer still
                path = fetch_checkpoint(client, registration.run.name, ref, worker_dir)
            else:
                dest = worker_dir / "resume" / "resume.ckpt"
                path = client.download_checkpoint(ref.download_path, dest, ref.sha256)
        except NotFound:
            logger.info("checkpoint of epoch %d is gone; trying an older one", ref.epoch)
            continue
        except ApiError as exc:
            logger.error("could not download checkpoint of epoch %d: %s", ref.epoch, exc)
            return None
        problem = checkpoint_problem(path, module)
        if problem is None:
            logger.info("resuming from the run's checkpoint of epoch %d", ref.epoch)
            return str(path)
        logger.warning("not resuming from the checkpoint of epoch %d: %s", ref.epoch, problem)
        path.unlink(missing_ok=True)
        _report(client, registration.worker_id, ref.epoch, problem)
    if candidates:
        logger.warning("no checkpoint of the run loads: starting from the module's own state or the swarm's")
    return None


def _report(client: OrchestratorClient, worker_id: str, epoch: int, problem: str) -> None:
    try:
        client.report_resume_failure(worker_id, epoch, problem)
    except ApiError as exc:  # the event is for people; training goes on without it
        logger.warning("could not report the unloadable checkpoint of epoch %d: %s", epoch, exc)
