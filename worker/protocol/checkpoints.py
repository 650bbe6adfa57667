"""What a run's checkpoint holds besides Lightning's own keys, and the exported form a plain user loads.

A stored checkpoint is ``trainer.save_checkpoint`` output of the checkpointer, with ``HivemindStrategy``'s
optimizer state: the wrapped torch optimizer's ``state_dict`` plus ``state["local_epoch"]`` (the swarm
epoch) and, with a hivemind scheduler, :data:`HIVEMIND_SCHEDULER_KEY`, or in DiLoCo mode
:data:`DILOCO_STATE_KEY`; schedulers wrapped by ``SwarmEpochScheduler`` save
``{SCHEDULER_INNER_KEY: ..., SCHEDULER_SWARM_EPOCH_KEY: ...}``. In DiLoCo mode the checkpoint's
``state_dict`` is the run's model, the global weights every peer agreed on in the last round; the
checkpointer's own local weights, which trained on since, are only in the DiLoCo state, for a resume.
Its ``epoch`` and ``global_step`` are the checkpointer's own Lightning loop counters, not the swarm's.

:func:`exported` turns it into what ``spotswarm runs export`` writes: the same Lightning checkpoint with
plain torch optimizer and scheduler states (so a plain ``Trainer().fit(model, ckpt_path=...)`` resumes),
a top-level :data:`SPOTSWARM_KEY` dict naming the run and its swarm epoch, and ``hyper_parameters``
filled from the run's ``module_args`` when the module did not save its own. Only plain containers and
tensors are added, so ``torch.load(path, weights_only=True)`` still loads it. Pure: no torch import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LOCAL_EPOCH_KEY = "local_epoch"  # hivemind.Optimizer.state_dict() puts it inside "state"
#: DiLoCo's outer state beside torch's "state" and "param_groups": global weights, outer momentum and
#: the peer's local weights (the checkpoint's ``state_dict`` holds the global weights)
DILOCO_STATE_KEY = "diloco"
HIVEMIND_SCHEDULER_KEY = "hivemind_scheduler"
SCHEDULER_INNER_KEY = "scheduler"
SCHEDULER_SWARM_EPOCH_KEY = "swarm_epoch"
SPOTSWARM_KEY = "spotswarm"
HYPER_PARAMETERS_KEY = "hyper_parameters"  # Lightning's LightningModule.CHECKPOINT_HYPER_PARAMS_KEY
EXPORT_FORMAT_VERSION = 1


def swarm_epoch_of(checkpoint: Mapping[str, Any]) -> int | None:
    """The swarm epoch a checkpoint was saved at (from its optimizer state); None if it has none."""
    for optimizer_state in checkpoint.get("optimizer_states") or ():
        epoch = (optimizer_state.get("state") or {}).get(LOCAL_EPOCH_KEY)
        if isinstance(epoch, int):
            return epoch
    return None


def plain_optimizer_state(saved: Mapping[str, Any]) -> dict[str, Any]:
    """The wrapped torch optimizer's own ``state_dict``, without hivemind's or DiLoCo's additions (the
    latter holds the checkpointer's local weights, which are not the run's model)."""
    ours = (HIVEMIND_SCHEDULER_KEY, DILOCO_STATE_KEY)
    plain = {key: value for key, value in saved.items() if key not in ours}
    plain["state"] = {
        key: value for key, value in (saved.get("state") or {}).items() if key != LOCAL_EPOCH_KEY
    }
    return plain


def plain_scheduler_state(saved: Any) -> Any:
    """The wrapped scheduler's own ``state_dict`` (a ``SwarmEpochScheduler`` state is unwrapped)."""
    if isinstance(saved, Mapping) and set(saved) == {SCHEDULER_INNER_KEY, SCHEDULER_SWARM_EPOCH_KEY}:
        return saved[SCHEDULER_INNER_KEY]
    return saved


def exported(
    checkpoint: Mapping[str, Any],
    *,
    run: str,
    checkpoint_epoch: int,
    target_batch_size: int | None = None,
    module: str | None = None,
    module_args: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The export of a stored ``checkpoint`` of run ``run`` (see the module docstring).

    ``checkpoint_epoch`` is the epoch the orchestrator stored it under; the swarm epoch recorded is the
    one in the optimizer state when there is one (they are the same for checkpoints of a checkpointer).
    """
    out = dict(checkpoint)
    swarm_epoch = swarm_epoch_of(checkpoint)
    swarm_epoch = checkpoint_epoch if swarm_epoch is None else swarm_epoch
    out["optimizer_states"] = [plain_optimizer_state(s) for s in checkpoint.get("optimizer_states") or ()]
    out["lr_schedulers"] = [plain_scheduler_state(s) for s in checkpoint.get("lr_schedulers") or ()]
    if HYPER_PARAMETERS_KEY not in out and module_args:
        out[HYPER_PARAMETERS_KEY] = dict(module_args)
    out[SPOTSWARM_KEY] = {
        "format": EXPORT_FORMAT_VERSION,
        "run": run,
        "swarm_epoch": swarm_epoch,
        "checkpoint_epoch": checkpoint_epoch,
        "target_batch_size": target_batch_size,
        # every swarm epoch is at least target_batch_size samples, from all peers together
        "samples_at_least": swarm_epoch * target_batch_size if target_batch_size else None,
        "module": module,
        "local_epoch": checkpoint.get("epoch"),
        "local_global_step": checkpoint.get("global_step"),
    }
    return out
