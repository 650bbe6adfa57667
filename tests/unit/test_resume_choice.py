"""How a starting worker judges a checkpoint's ``state_dict`` against its module's
(``worker/agent/resume.py``): the keys Lightning's strict loading wants, and the shapes of every key."""

from __future__ import annotations

import torch

from worker.agent.resume import state_problem

MODULE = {"layer.weight": torch.zeros(4, 2), "layer.bias": torch.zeros(4)}


def test_a_state_of_the_same_keys_and_shapes_fits() -> None:
    assert state_problem({k: v.clone() for k, v in MODULE.items()}, MODULE) is None


def test_missing_or_extra_keys_do_not_fit_a_strictly_loading_module() -> None:
    problem = state_problem({"layer.weight": torch.zeros(4, 2), "head.bias": torch.zeros(1)}, MODULE)
    assert (
        problem == "its state_dict does not fit the module: missing ['layer.bias'], unexpected ['head.bias']"
    )


def test_a_module_that_loads_loosely_takes_other_keys_but_never_other_shapes() -> None:
    assert (
        state_problem({"layer.weight": torch.zeros(4, 2), "x": torch.zeros(1)}, MODULE, strict=False) is None
    )
    wider = {"layer.weight": torch.zeros(7, 2)}
    assert state_problem(wider, MODULE, strict=False) == (
        "its state_dict's shapes differ from the module's at ['layer.weight']"
    )
