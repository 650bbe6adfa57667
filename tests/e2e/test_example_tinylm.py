"""The language-model example, end to end, as docs/getting-started/your-model.md shows it: the example
copied into a user's project in a temporary directory (with a requirement), created with the documented
`spotswarm runs create --workdir` command (bf16 included: without a GPU, Lightning runs bf16 autocast on
the CPU), trained by a local worker of `spotswarm serve` that installs the requirement, until the run's
``val_ppl`` is well below uniform guessing; the documented command for the installed example passes the
orchestrator's import check."""

from __future__ import annotations

import math
import shlex
import shutil
from pathlib import Path

import pytest

from tests.e2e.test_workdir_run import READY_RE
from tests.support.cli import cli
from tests.support.orchestrator import Orchestrator
from tests.support.processes import REPO_ROOT
from tests.support.runs import RunReader, digits_run
from tests.support.waiting import wait_until
from tests.support.wheels import build_wheel
from worker.examples import tinylm

pytestmark = [pytest.mark.swarm]
DOC = REPO_ROOT / "docs/getting-started/your-model.md"
TRAIN_S = 150.0  # a worker importing torch, lightning and hivemind on a busy 2-core machine, then training


def documented(prefix: str) -> list[str]:
    """The arguments (after ``spotswarm``) of the one command in the doc that starts with ``prefix``."""
    [line] = [line for line in DOC.read_text().splitlines() if line.startswith(prefix)]
    return shlex.split(line)[1:]


def lm_project(root: Path) -> Path:
    """The project layout of the doc: ``lm/model.py`` a copy of the example, its text in ``lm/data``, and
    a requirement (a wheel built here, found offline) that each worker installs."""
    (root / "lm" / "data").mkdir(parents=True)
    (root / "lm" / "__init__.py").write_text("")
    shutil.copy(tinylm.__file__, root / "lm" / "model.py")
    shutil.copy(tinylm.TEXT_PATH, root / "lm" / "data" / tinylm.TEXT_PATH.name)
    (root / "requirements.txt").write_text("--no-index\n--find-links wheels\nlmextra==0.1.0\n")
    build_wheel(root / "wheels", "lmextra", "0.1.0", requires=["torch"])
    return root


def swarm_options() -> list[str]:
    """One worker, the test runs' swarm options, and a validation every 8 batches for a quick first one."""
    args = ["--workers", "1", "--min-workers", "0", "--max-workers", "1"]
    for key, value in digits_run("options")["strategy_options"].items():
        args += ["--strategy-option", f"{key}={str(value).lower()}"]
    return [*args, "--trainer-option", "val_check_interval=8"]


@pytest.mark.timeout(300)
def test_the_language_model_example_trains_from_a_user_project_with_its_perplexity_in_the_api(
    loop_orch: Orchestrator, tmp_path: Path
) -> None:
    project = lm_project(tmp_path / "my-lm")
    orch = loop_orch
    args = documented("spotswarm runs create --name my-lm --workdir .")
    args[args.index("--workdir") + 1] = str(project)
    args += ["--requirements-file", "requirements.txt"]

    created = cli(orch, *args, *swarm_options(), "--timeout", "120")

    assert created.exit_code == 0, created.output
    reader = RunReader(orch, "my-lm")

    def perplexity_learned() -> dict[str, float] | None:
        metrics = dict(reader.run()["reported"]["metrics"])
        return metrics if metrics.get("val_ppl", math.inf) < tinylm.VOCAB_SIZE / 4 else None

    metrics = wait_until(perplexity_learned, TRAIN_S, interval_s=1, message="val_ppl falls below 64")
    assert metrics is not None
    assert metrics["val_ppl"] == pytest.approx(math.exp(metrics["val_loss"]), rel=1e-4)  # one worker
    assert "train_loss" in metrics
    run = reader.run()
    assert run["spec"]["trainer"]["precision"] == "bf16-mixed"
    [worker] = reader.running()
    assert worker["metrics"]["val_ppl"] < tinylm.VOCAB_SIZE / 4
    log = reader.worker_log(worker["id"])
    assert "Using bfloat16 Automatic Mixed Precision" in log, log[-3000:]
    ready = READY_RE.search(log)
    assert ready is not None and ready.group(3, 4) == ("downloaded", "installed"), log[-3000:]

    installed = documented("spotswarm runs create --name tinylm ")
    installed[installed.index("--name") + 1] = "tinylm-installed"
    checked = cli(orch, *installed, "--workers", "0", "--min-workers", "0", "--timeout", "120")
    assert checked.exit_code == 0, checked.output
