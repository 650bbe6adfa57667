"""The export format (worker/protocol/checkpoints.py): hivemind's additions become plain torch
states, the swarm epoch and the run are written under ``spotswarm``, and ``hyper_parameters`` is filled
only when the module saved none. Loading real exports with Lightning and torch is in
tests/integration/test_stop_keeps_work.py."""

from __future__ import annotations

import io
from typing import Any

import torch

from worker.protocol.checkpoints import exported, swarm_epoch_of


def stored_checkpoint(**extra: Any) -> dict[str, Any]:
    """What a checkpointer's ``trainer.save_checkpoint`` writes with HivemindStrategy (the keys used)."""
    return {
        "epoch": 1,
        "global_step": 200,
        "state_dict": {"layer.weight": torch.ones(2, 2)},
        "optimizer_states": [
            {
                "state": {0: {"step": torch.tensor(3.0)}, "local_epoch": 25},
                "param_groups": [{"lr": 0.01, "params": [0]}],
                "hivemind_scheduler": {"last_epoch": 25},
            }
        ],
        "lr_schedulers": [{"scheduler": {"last_epoch": 25}, "swarm_epoch": 25}],
        **extra,
    }


def test_export_writes_plain_optimizer_and_scheduler_states_and_the_swarm_epoch() -> None:
    out = exported(
        stored_checkpoint(),
        run="mlp1",
        checkpoint_epoch=25,
        target_batch_size=64,
        module="pkg.mod:Net",
        module_args={"hidden": 32},
    )
    assert out["optimizer_states"] == [
        {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.01, "params": [0]}]}
    ]
    assert out["lr_schedulers"] == [{"last_epoch": 25}]
    assert out["spotswarm"] == {
        "format": 1,
        "run": "mlp1",
        "swarm_epoch": 25,
        "checkpoint_epoch": 25,
        "target_batch_size": 64,
        "samples_at_least": 1600,
        "module": "pkg.mod:Net",
        "local_epoch": 1,
        "local_global_step": 200,
    }
    assert out["hyper_parameters"] == {"hidden": 32}, "filled: the module saved none"
    assert (out["epoch"], out["global_step"]) == (1, 200), "Lightning's own counters stay for a resume"


def test_export_keeps_the_modules_own_hyper_parameters_and_the_stored_file_untouched() -> None:
    stored = stored_checkpoint(hyper_parameters={"hidden": 8, "lr": 0.1})
    out = exported(stored, run="r", checkpoint_epoch=25, module_args={"hidden": 32})
    assert out["hyper_parameters"] == {"hidden": 8, "lr": 0.1}
    assert stored["optimizer_states"][0]["state"]["local_epoch"] == 25, "the input is not changed"
    assert swarm_epoch_of(stored) == 25


def test_export_without_hivemind_state_takes_the_stored_epoch_and_loads_weights_only() -> None:
    plain = {
        "epoch": 0,
        "global_step": 4,
        "state_dict": {},
        "optimizer_states": [{"state": {}, "param_groups": []}],
    }
    out = exported(plain, run="r", checkpoint_epoch=7)
    assert out["spotswarm"]["swarm_epoch"] == 7 and out["spotswarm"]["samples_at_least"] is None
    assert "hyper_parameters" not in out
    buffer = io.BytesIO()
    torch.save(out, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["spotswarm"]["run"] == "r"
