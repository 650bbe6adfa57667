"""Bring your own model: a project outside the repository, shipped with `spotswarm runs create --workdir`,
trained by local workers of an orchestrator started elsewhere, with a requirement installed per run.

The user's project (a LightningModule and DataModule of its own, a requirement satisfied by a wheel
built here) lives in a temporary directory; the orchestrator runs from the repository. Its first worker
downloads the package and installs the requirement into the run's environment (not the main one), a
replacement after ``kill -9`` reuses both from the machine's cache, and an edit of the project after
``runs create`` changes nothing the workers run.
"""

from __future__ import annotations

import importlib.util
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support import api
from tests.support.cli import cli
from tests.support.processes import ProcessRegistry
from tests.support.runs import RunReader, kill_worker, start_loop_orchestrator
from tests.support.waiting import wait_until
from tests.support.wheels import build_wheel

SECRET = "s3cr3t-run-token-4711"
MODEL = textwrap.dedent(
    """
    import json, os, pathlib
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import byoreq  # the run's requirement, installed on each worker

    VERSION = "v1"


    class TeacherMLP(pl.LightningModule):
        def __init__(self, hidden: int = 8, lr: float = 0.05) -> None:
            super().__init__()
            self.save_hyperparameters()
            layers = [torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)]
            self.net = torch.nn.Sequential(*layers)

        def setup(self, stage: str) -> None:
            marks = pathlib.Path(os.environ["MARK_DIR"])
            seen = {"version": VERSION, "cwd": os.getcwd(), "req": byoreq.VALUE,
                    "secret": os.environ.get("USER_TOKEN") == "SECRET"}
            (marks / f"{os.getpid()}.json").write_text(json.dumps(seen))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


    class TeacherData(pl.LightningDataModule):
        def __init__(self, batch_size: int, n: int = 4096) -> None:
            super().__init__()
            self.batch_size, self.n = batch_size, n

        def train_dataloader(self):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(self.n, 4, generator=g)
            y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
            return DataLoader(TensorDataset(x, y), batch_size=self.batch_size, shuffle=True)
    """
).replace("SECRET", SECRET)
READY_RE = re.compile(r"run code ready in ([0-9.]+) s: package (\w+) \((\w+)\), requirements .* \((\w+)\)")


def user_project(root: Path) -> Path:
    """The user's project: code, a requirements file, the wheel it names, and things left out."""
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "model.py").write_text(MODEL)
    (root / "requirements.txt").write_text("--no-index\n--find-links wheels\nbyoreq==0.1.0\n")
    build_wheel(root / "wheels", "byoreq", "0.1.0", requires=["torch"])
    (root / ".gitignore").write_text("data/\n")
    (root / "data").mkdir()
    (root / "data" / "huge.bin").write_bytes(b"0" * (200 << 20 >> 4))  # left out by .gitignore
    return root


def worker_log(orch_data: Path, worker: dict[str, Any]) -> str:
    return (orch_data / "workers" / f"{worker['request_id']}.log").read_text(errors="replace")


def code_ready(orch_data: Path, worker: dict[str, Any]) -> re.Match[str] | None:
    return READY_RE.search(worker_log(orch_data, worker))


@pytest.mark.swarm
@pytest.mark.timeout(420)
def test_a_project_outside_the_repository_trains_with_its_own_requirement_and_replacements_reuse_it(
    processes: ProcessRegistry, loop_data_dir: Path, tmp_path: Path
) -> None:
    project = user_project(tmp_path / "my-project")
    marks, cache = tmp_path / "marks", tmp_path / "worker-cache"
    marks.mkdir()
    orch = start_loop_orchestrator(processes, loop_data_dir, extra_env={"SPOTSWARM_CACHE_DIR": str(cache)})
    args = [
        "runs",
        "create",
        "--name",
        "byo",
        "--workdir",
        str(project),
        "--requirements-file",
        "requirements.txt",
    ]
    args += ["--module", "mypkg.model:TeacherMLP", "--datamodule", "mypkg.model:TeacherData"]
    args += ["--module-arg", "hidden=16", "--target-batch-size", "64", "--batch-size", "16"]
    args += ["--workers", "1", "--min-workers", "0", "--max-workers", "2"]
    args += ["--env", f"MARK_DIR={marks}", "--secret-env", "USER_TOKEN"]
    for option in ("matchmaking_time=1.0", "averaging_timeout=10.0"):
        args += ["--strategy-option", option]

    created = cli(orch, *args, env={"USER_TOKEN": SECRET})

    assert created.exit_code == 0, created.output
    assert re.search(r"workdir .*my-project: 5 files, .*uploaded", created.output), created.output
    (project / "mypkg" / "model.py").write_text(MODEL.replace('VERSION = "v1"', 'VERSION = "v2"'))
    reader = RunReader(orch, "byo")

    def training() -> list[dict[str, Any]]:
        return [w for w in reader.running() if w["samples"] > 0 and code_ready(loop_data_dir, w)]

    [first] = wait_until(training, 240, interval_s=1, message="the first worker trains")
    first_ready = code_ready(loop_data_dir, first)
    assert first_ready is not None and first_ready.group(3, 4) == ("downloaded", "installed")
    kill_worker(first)

    def replaced() -> list[dict[str, Any]]:
        return [w for w in training() if w["id"] != first["id"]]

    [second] = wait_until(replaced, 240, interval_s=1, message="a replacement trains")
    second_ready = code_ready(loop_data_dir, second)
    assert second_ready is not None and second_ready.group(3, 4) == ("cached", "cached")
    assert second_ready.group(2) == first_ready.group(2)  # the same package
    assert float(second_ready.group(1)) < float(first_ready.group(1)), (first_ready[0], second_ready[0])

    seen = [json.loads(p.read_text()) for p in marks.glob("*.json")]
    assert len(seen) >= 2 and {s["version"] for s in seen} == {"v1"}  # the bytes of runs create
    package_dir = cache / "packages" / reader.run()["spec"]["workdir"]
    assert {s["cwd"] for s in seen} == {str(package_dir)} and not (package_dir / "data").exists()
    assert all(s["req"] == "byoreq 0.1.0" and s["secret"] for s in seen)
    assert importlib.util.find_spec("byoreq") is None  # not installed into the main environment
    assert [p.name for p in cache.glob("envs/*/lib/python*/site-packages/byoreq")] == ["byoreq"]

    with orch.admin() as http:
        run = http.get(api.run("byo")).json()
        events = http.get("/api/v1/runs/byo/events?limit=1000").text
    logs = worker_log(loop_data_dir, first) + worker_log(loop_data_dir, second)
    assert run["spec"]["secret_env"] == {"USER_TOKEN": None}
    assert SECRET not in json.dumps(run) + events + logs
