"""The run spec's code fields (workdir, requirements, env, secret_env) and the constructor checks the import
probe and the agent make with the arguments the agent will pass (their names and their values' types)."""

from __future__ import annotations

from typing import Any, Literal

import pytest
import torch
from pydantic import ValidationError

from orchestrator.domain.views import public_spec
from worker.agent.boot import PermanentError, build_user_objects, call_arguments
from worker.agent.probe import _bind_error
from worker.arguments import argument_type_problem
from worker.protocol.runs import RunSpec
from worker.protocol.trainer import arguments_problem

BASE: dict[str, Any] = {
    "name": "r",
    "module": "a.b:C",
    "datamodule": "a.b:D",
    "target_batch_size": 8,
    "batch_size": 4,
}


def spec(**fields: Any) -> RunSpec:
    return RunSpec.model_validate({**BASE, **fields})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"workdir": "not-a-digest"}, "workdir"),
        ({"env": {"SPOTSWARM_TOKEN": "x"}}, "names starting with SPOTSWARM_"),
        ({"env": {"PYTHONPATH": "/x"}}, "read by the interpreter at start-up"),
        ({"secret_env": {"LD_PRELOAD": "/x.so"}}, "LD_PRELOAD"),
        ({"env": {"2BAD": "x"}}, "env.2BAD"),
        ({"env": {"A": "x"}, "secret_env": {"A": "y"}}, "A: in both env and secret_env"),
        ({"requirements": ["einops\n-e /etc"]}, "control character"),
        ({"requirements": [""]}, "requirements.0"),
    ],
)
def test_bad_code_fields_are_refused_with_the_field_named(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(**fields)
    text = str(caught.value)
    assert message in text or message.replace(".", "\n  ") in text, text


def test_secret_values_are_left_out_of_what_reads_show() -> None:
    full = spec(env={"DATA": "s3://b"}, secret_env={"KEY": "v4lue"}, requirements=["-r requirements.txt"])
    assert full.without_secret_values().secret_env == {"KEY": None}
    assert full.without_secret_values().missing_secrets() == ["KEY"] and full.missing_secrets() == []
    public = public_spec(full.without_secret_values())
    assert (public.env, public.secret_env, public.requirements) == ({}, {}, [])


class Model:
    def __init__(self, hidden: int, lr: float = 0.1) -> None: ...


class Data:
    def __init__(self, batch_size: int, n: int = 8) -> None: ...


class Flexible:
    def __init__(self, **options: Any) -> None: ...


def test_the_constructor_check_names_what_does_not_fit() -> None:
    assert _bind_error(Model, {"hidden": 4}, None) is None
    typo = _bind_error(Model, {"hiden": 4}, None)
    assert typo is not None and "'hiden'" in typo and "it takes: hidden, lr" in typo
    missing = _bind_error(Model, {}, None)
    assert missing is not None and "'hidden'" in missing
    assert _bind_error(Flexible, {"anything": 1}, None) is None


def test_the_datamodule_gets_the_batch_size_as_the_agent_gives_it() -> None:
    assert call_arguments(Data, {"n": 2}, 32) == {"n": 2, "batch_size": 32}
    assert call_arguments(Data, {"batch_size": 8}, 32) == {"batch_size": 8}
    assert call_arguments(Model, {"hidden": 1}, 32) == {"hidden": 1}
    assert _bind_error(Data, {}, 32) is None  # required, and given by the agent
    assert _bind_error(Data, {}, None) is not None


class Shapes:
    def __init__(
        self,
        channels: int,
        lr: float = 0.1,
        mode: Literal["a", "b"] = "a",
        sizes: tuple[int, ...] = (1,),
        limit: int | None = None,
        net: torch.nn.Module | None = None,
        extra: Any = None,
    ) -> None: ...


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"channels": "sixteen"}, ("channels", "expected int, got 'sixteen'")),
        ({"channels": 16.0}, ("channels", "expected int, got 16.0")),
        ({"channels": True}, ("channels", "expected int, got True")),  # JSON true is no number
        ({"channels": 1, "mode": "c"}, ("mode", "expected Literal['a', 'b'], got 'c'")),
        ({"channels": 1, "sizes": [1, "x"]}, ("sizes", "expected tuple[int, ...], got [1, 'x']")),
        ({"channels": 1, "limit": "all"}, ("limit", "expected int | None, got 'all'")),
        # what JSON gives and the annotation takes; annotations that are not plain are not checked
        ({"channels": 1, "lr": 1, "sizes": [2, 3], "limit": None, "net": "relu", "extra": {"a": 1}}, None),
    ],
)
def test_argument_values_are_checked_against_the_constructors_annotations(
    args: dict[str, Any], problem: tuple[str, str] | None
) -> None:
    assert argument_type_problem(Shapes, args) == problem


def test_a_worker_refuses_a_mistyped_argument_before_the_users_constructor_runs() -> None:
    run = spec(module="tests.support.models:TinyModule", datamodule="tests.support.models:TinyDataModule")
    with pytest.raises(PermanentError, match=r"module_args\.hidden: expected int, got 'sixteen'"):
        build_user_objects(run.model_copy(update={"module_args": {"hidden": "sixteen"}}))
    module, _ = build_user_objects(run.model_copy(update={"module_args": {"hidden": 16}}))
    assert module.layer.out_features == 16


class GradNorm:
    def __init__(self, every: int = 10, norm_type: float = 2.0) -> None: ...


def test_a_callback_argument_typo_lists_the_arguments_it_takes() -> None:
    assert arguments_problem(GradNorm, {"every": 5}) is None
    typo = arguments_problem(GradNorm, {"evry": 5})
    assert typo == "got an unexpected keyword argument 'evry' (it takes: every, norm_type)"
