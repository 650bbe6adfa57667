"""Code packages and the create-time checks against a real `spotswarm serve`, with the package store on
the local disk and on S3 (a moto server): upload, who may download, what a bad spec gets."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.packaging import pack
from tests.support import api
from tests.support.archives import path_max_escape
from tests.support.aws import FakeAws
from tests.support.cli import cli
from tests.support.orchestrator import NO_RECONCILE, Orchestrator, start_orchestrator
from tests.support.processes import ProcessRegistry
from tests.support.specs import run_spec
from tests.support.wheels import build_wheel

_names = itertools.count()
MODEL = """
import lightning.pytorch as pl
import torch


class Net(pl.LightningModule):
    def __init__(self, hidden: int = 4, lr: float = 0.1) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, hidden)


class Data(pl.LightningDataModule):
    def __init__(self, batch_size: int, n: int = 8) -> None:
        super().__init__()
"""


@pytest.fixture(scope="module", params=["local", "s3"])
def store_orch(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Orchestrator]:
    """An orchestrator (import checks on, no reconcile loop) storing packages locally or in S3."""
    root = tmp_path_factory.mktemp(f"run-code-{request.param}")
    env = {**NO_RECONCILE, "SPOTSWARM_PACKAGE_MAX_BYTES": str(256 << 10)}
    if request.param == "s3":
        fake = FakeAws(request.getfixturevalue("moto_endpoint"))  # session-wide: a bucket of our own
        bucket = f"spotswarm-packages-{root.name.lower().replace('_', '-')}"[:63]
        fake.client("s3").create_bucket(Bucket=bucket)
        env |= {
            "SPOTSWARM_S3_BUCKET": bucket,
            "SPOTSWARM_S3_REGION": fake.region,
            "SPOTSWARM_S3_ENDPOINT_URL": fake.endpoint_url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_CONFIG_FILE": str(root / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(root / "no-aws-config"),
        }
    registry = ProcessRegistry(root)
    try:
        yield start_orchestrator(registry, root / "data", extra_env=env)
    finally:
        registry.kill_all()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "byopkg").mkdir(parents=True)
    (root / "byopkg" / "__init__.py").write_text("")
    (root / "byopkg" / "model.py").write_text(MODEL)
    return root


def own_bytes(project: Path) -> Path:
    """``project`` with a file of its own, so that its package is no other test's (runs of the module's
    other tests name theirs, and a package a run names is kept)."""
    (project / "byopkg" / "own.py").write_text(f"N = {next(_names)}\n")
    return project


def packed(project: Path, tmp_path: Path) -> tuple[bytes, str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    package = pack(project, out, 1 << 20)
    return package.archive.read_bytes(), package.sha256


def spec(**overrides: Any) -> dict[str, Any]:
    base = {"module": "byopkg.model:Net", "datamodule": "byopkg.model:Data"}
    return run_spec(f"code-{next(_names)}", **{**base, **overrides})


@pytest.mark.timeout(240)
def test_a_package_uploads_once_and_only_the_runs_workers_download_it(
    store_orch: Orchestrator, project: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    data, sha = packed(project, tmp_path)
    with store_orch.admin() as http:
        assert http.get(api.package(sha)).status_code == 404
        first = http.put(api.package(sha), content=data)
        again = http.put(api.package(sha), content=data)
        assert (first.status_code, again.status_code) == (201, 200), first.text
        assert first.json() == again.json() == {"sha256": sha, "size_bytes": len(data)}
        created = http.post(api.runs(), json=spec(workdir=sha))
        other = http.post(api.runs(), json=spec(workdir=sha))
    assert created.status_code == 201, created.text
    name, join = created.json()["name"], created.json()["join_token"]
    path = api.run_package(name)
    with store_orch.client(join) as http:
        download = http.get(path)
    assert download.content == data and download.headers["x-checksum-sha256"] == sha
    with store_orch.client(other.json()["join_token"]) as http:
        assert http.get(path).status_code == 403
    with store_orch.client() as http:
        assert http.get(path).status_code == 401
        public = http.get(api.run(name)).json()["spec"]
    assert public["workdir"] == sha
    on_disk = (store_orch.data_dir / "checkpoints" / "packages" / f"{sha}.tar.gz").exists()
    assert on_disk == (request.node.callspec.params["store_orch"] == "local")
    # Deleted with the last run that names it.
    with store_orch.admin() as http:
        for run in (name, other.json()["name"]):
            assert http.get(api.package(sha)).status_code == 200
            http.post(api.run_stop(run)).raise_for_status()
            assert http.delete(api.run(run)).status_code == 204
        assert http.get(api.package(sha)).status_code == 404


@pytest.mark.timeout(120)
def test_uploads_that_are_not_what_they_claim_are_refused(store_orch: Orchestrator, tmp_path: Path) -> None:
    escape = path_max_escape(tmp_path).read_bytes()  # CVE-2025-4517: tarfile's filter lets it through
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w:gz") as archive:
        info = tarfile.TarInfo("../outside.py")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"x"))
    evil_sha = hashlib.sha256(evil.getvalue()).hexdigest()
    big = b"x" * (300 << 10)
    with store_orch.admin() as http:
        mismatch = http.put(api.package("0" * 64), content=b"some bytes")
        unsafe = http.put(api.package(evil_sha), content=evil.getvalue())
        too_big = http.put(api.package(hashlib.sha256(big).hexdigest()), content=big)
        missing = http.post(api.runs(), json=spec(workdir="f" * 64))
        escaping = http.put(api.package(hashlib.sha256(escape).hexdigest()), content=escape)
    with store_orch.client() as http:
        anonymous = http.put(api.package(evil_sha), content=evil.getvalue())
    assert mismatch.status_code == 400 and "sha256" in mismatch.text
    assert unsafe.status_code == 422 and "../outside.py" in unsafe.text
    assert too_big.status_code == 413
    assert missing.status_code == 422 and "no package" in missing.text and "--workdir" in missing.text
    assert anonymous.status_code == 401
    assert escaping.status_code == 422 and "below the link" in escaping.text


@pytest.mark.timeout(240)
def test_create_refuses_arguments_the_constructor_does_not_take(store_orch: Orchestrator) -> None:
    bad_module = spec(module="tests.support.models:TinyModule", module_args={"hiden": 64})
    bad_data = spec(
        module="tests.support.models:TinyModule",
        datamodule="tests.support.models:TinyDataModule",
        datamodule_args={"size": 8, "shuffle": True},
    )
    with store_orch.admin() as http:
        module = http.post(api.runs(), json=bad_module)
        data = http.post(api.runs(), json=bad_data)
    assert module.status_code == 422, module.text
    assert module.json()["detail"] == "module_args: TinyModule takes no argument 'hiden' (it takes: hidden)"
    assert data.status_code == 422 and "datamodule_args" in data.text and "'shuffle'" in data.text


@pytest.mark.timeout(240)
def test_spec_errors_a_worker_would_meet_are_refused_at_create_in_one_line_naming_the_field(
    store_orch: Orchestrator, project: Path
) -> None:
    # what a first real use got through the create-time check, and then failed on every worker
    classes = ["--workdir", str(project), "--module", "byopkg.model:Net", "--datamodule", "byopkg.model:Data"]
    sizes = ["--target-batch-size", "8", "--batch-size", "4", "--workers", "0", "--min-workers", "0"]
    wandb = 'loggers=["lightning.pytorch.loggers:WandbLogger"]'  # wandb is not installed
    mistakes = [
        (["--module-arg", "hidden=sixteen"], "module_args.hidden: expected int, got 'sixteen'"),
        (
            ["--strategy-option", "sync=gradients", "--strategy-option", "delay_optimizer_step=true"],
            "strategy_options: a delayed optimizer step (delay_optimizer_step or delay_grad_averaging)",
        ),
        (["--trainer-option", wandb], "it needs wandb>=0.12.10, which the run does not install"),
    ]
    for extra, expected in mistakes:
        name = f"code-{next(_names)}"
        result = cli(store_orch, "runs", "create", "--name", name, *classes, *sizes, *extra)
        assert result.exit_code == 1, result.output
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and expected in errors[0], result.output
        with store_orch.client() as http:
            assert http.get(api.run(name)).status_code == 404, "a refused create leaves no run"
    assert "--requirement 'wandb>=0.12.10'" in errors[0] and "pip install" not in result.output
    fine = cli(
        store_orch,
        "runs",
        "create",
        "--name",
        f"code-{next(_names)}",
        *classes,
        *sizes,
        "--module-arg",
        "hidden=16",
    )
    assert fine.exit_code == 0, fine.output


@pytest.mark.timeout(240)
def test_a_module_the_server_cannot_import_suggests_shipping_it_with_workdir(
    store_orch: Orchestrator, project: Path, tmp_path: Path
) -> None:
    _, sha = packed(project, tmp_path)
    classes = ["--module", "byopkg.model:Net", "--datamodule", "byopkg.model:Data"]
    sizes = ["--target-batch-size", "8", "--batch-size", "4", "--workers", "0", "--min-workers", "0"]
    result = cli(store_orch, "runs", "create", "--name", f"code-{next(_names)}", *classes, *sizes)
    assert result.exit_code == 1
    assert "ModuleNotFoundError: No module named 'byopkg'" in result.output
    assert "the orchestrator imports from its working directory" in result.output
    assert "spotswarm runs create --workdir DIR" in result.output

    shipped = cli(
        store_orch,
        "runs",
        "create",
        "--name",
        f"code-{next(_names)}",
        "--workdir",
        str(project),
        *classes,
        *sizes,
    )
    assert shipped.exit_code == 0, shipped.output
    assert f"package {sha[:12]}" in shipped.output

    inner = str(project / "byopkg")  # the package itself, not the project holding it
    misplaced = cli(
        store_orch, "runs", "create", "--name", f"code-{next(_names)}", "--workdir", inner, *classes, *sizes
    )
    assert misplaced.exit_code == 1 and "at the top of the workdir" in misplaced.output


@pytest.mark.timeout(120)
def test_a_workdir_shipping_its_own_worker_package_is_refused_in_one_line_naming_what_to_rename(
    store_orch: Orchestrator, tmp_path: Path
) -> None:
    project = tmp_path / "clash"
    (project / "worker").mkdir(parents=True)
    (project / "worker" / "__init__.py").write_text("")
    (project / "worker" / "model.py").write_text(MODEL)
    classes = ["--module", "worker.model:Net", "--datamodule", "worker.model:Data"]
    sizes = ["--target-batch-size", "8", "--batch-size", "4", "--workers", "0", "--min-workers", "0"]
    name = f"code-{next(_names)}"
    result = cli(store_orch, "runs", "create", "--name", name, "--workdir", str(project), *classes, *sizes)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    assert "the package ships a top-level package 'worker' (worker/__init__.py)" in errors[0]
    assert "rename it" in errors[0]
    with store_orch.client() as http:
        assert http.get(api.run(name)).status_code == 404


@pytest.mark.timeout(120)
def test_launcher_options_are_checked_when_the_run_is_created(store_orch: Orchestrator) -> None:
    with store_orch.admin() as http:
        answer = http.post(api.runs(), json=spec(
            module="tests.support.models:TinyModule",
            datamodule="tests.support.models:TinyDataModule",
            launcher_options={"workdir": "/tmp/x"},
        ))  # fmt: skip
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"] == (
        "launcher_options: the local launcher takes no options but cpus_per_worker and peers_per_machine, "
        "got ['workdir'] "
        "(a run's code travels with runs create --workdir DIR)"
    )


@pytest.mark.timeout(240)
def test_secret_values_never_come_back_and_a_round_trip_must_give_them_again(
    store_orch: Orchestrator, tmp_path: Path
) -> None:
    classes = ["--module", "tests.support.models:TinyModule", "--datamodule",
               "tests.support.models:TinyDataModule", "--target-batch-size", "8", "--batch-size", "4",
               "--workers", "0", "--min-workers", "0"]  # fmt: skip
    name = f"code-{next(_names)}"
    created = cli(store_orch, "runs", "create", "--name", name, *classes, "--env", "DATA_URL=s3://bucket/x",
                  "--secret-env", "API_KEY=value-never-shown", "--json")  # fmt: skip
    assert created.exit_code == 0, created.output
    shown = cli(store_orch, "runs", "show", name, "--json")
    table = cli(store_orch, "runs", "show", name)
    assert "env          DATA_URL, API_KEY (secret)" in table.output, table.output
    assert "value-never-shown" not in created.output + shown.output
    with store_orch.client() as http:
        public = http.get(api.run(name)).json()["spec"]
    assert (public["env"], public["secret_env"]) == ({}, {})
    (tmp_path / "spec.json").write_text(json.dumps(json.loads(shown.output)["run"]["spec"]))
    copy = cli(store_orch, "runs", "create", "-f", str(tmp_path / "spec.json"), "--name", f"{name}-copy")
    assert copy.exit_code == 1 and "secret_env: no value for API_KEY" in copy.output
    again = cli(store_orch, "runs", "create", "-f", str(tmp_path / "spec.json"), "--name", f"{name}-copy",
                "--secret-env", "API_KEY", env={"API_KEY": "from-my-shell"})  # fmt: skip
    assert again.exit_code == 0, again.output


def secrets_beside(project: Path, above: Path) -> Path:
    """``above``: the project's code beside an orchestrator's data dir, a worker's directory and key files,
    as ``--workdir`` one directory too high finds them."""
    shutil.copytree(project / "byopkg", above / "byopkg")
    files = {
        "orch/data/admin_token": "ssa_admin",
        "orch/data/swarm_authority.pem": "-----BEGIN PRIVATE KEY-----",
        "orch/data/spotswarm.db": "SQLite format 3",
        "orch/data/checkpoints/packages/old.tar.gz": "x",
        "worker/registration.json": '{"secret_env": {"API_KEY": "sk-1"}}',
        "worker/swarm/7/identity.key": "k",
        "worker/swarm/7/token.json": "{}",
        ".env": "API_KEY=sk-1",
        "deploy/id_rsa": "k",
        "tokenizer.json": "{}",
    }
    for name, text in files.items():
        (above / name).parent.mkdir(parents=True, exist_ok=True)
        (above / name).write_text(text)
    return above


SECRET_FILES = ("admin_token", "swarm_authority.pem", "spotswarm.db", "registration.json", "identity.key",
                "token.json", ".env", "id_rsa", "old.tar.gz")  # fmt: skip


@pytest.mark.timeout(240)
def test_a_workdir_one_directory_too_high_leaves_secrets_out_and_says_so(
    store_orch: Orchestrator, project: Path, tmp_path: Path
) -> None:
    above = secrets_beside(project, tmp_path / "above")
    name = f"code-{next(_names)}"
    args = ["runs", "create", "--name", name, "--workdir", str(above), "--module", "byopkg.model:Net",
            "--datamodule", "byopkg.model:Data", "--target-batch-size", "8", "--batch-size", "4",
            "--workers", "0", "--min-workers", "0"]  # fmt: skip

    dry = cli(store_orch, *args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    listed = [line.split()[0] for line in dry.output.splitlines() if line.startswith("  ")]
    assert listed == ["byopkg/__init__.py", "byopkg/model.py", "tokenizer.json"], dry.output
    assert "orch/data/: an orchestrator's data dir (it holds admin_token)" in dry.output
    assert ".env: looks like a secret" in dry.output and "deploy/id_rsa" in dry.output
    assert "worker/registration.json" in dry.output and "worker/swarm/7/token.json" in dry.output
    assert "nothing was uploaded or created" in dry.output
    with store_orch.admin() as http:
        assert http.get(api.run(name)).status_code == 404

    created = cli(store_orch, *args)
    assert created.exit_code == 0, created.output
    assert (
        f"workdir {above}: 3 files" in created.output
        and "byopkg/ (2 files), tokenizer.json" in created.output
    )
    assert "left out 6 (--include-secrets packs them)" in created.output
    with store_orch.admin() as http:
        shipped = http.get(api.run_package(name))
    with tarfile.open(fileobj=io.BytesIO(shipped.content), mode="r:gz") as archive:
        assert archive.getnames() == ["byopkg/__init__.py", "byopkg/model.py", "tokenizer.json"]

    as_json = cli(store_orch, *args, "--dry-run", "--json", "--secret-env", "API_KEY=sk-never-shown")
    assert as_json.exit_code == 0 and "sk-never-shown" not in as_json.output
    report = json.loads(as_json.stdout)
    assert [f["name"] for f in report["files"]] == listed and len(report["left_out"]) == 6
    assert report["dry_run"] and report["spec"]["secret_env"] == {"API_KEY": None}

    opted_in = cli(store_orch, *args, "--dry-run", "--include-secrets")
    assert opted_in.exit_code == 0 and "left out" not in opted_in.output
    assert all(secret in opted_in.output for secret in SECRET_FILES), opted_in.output


@pytest.mark.timeout(120)
def test_a_spec_missing_fields_is_refused_before_anything_is_packed_or_uploaded(
    store_orch: Orchestrator, project: Path, tmp_path: Path
) -> None:
    _, sha = packed(own_bytes(project), tmp_path)
    refused = cli(store_orch, "runs", "create", "--workdir", str(project))
    assert refused.exit_code == 1
    assert refused.output.strip() == (
        "error: spec: missing fields: name, module, datamodule, target_batch_size, batch_size (nothing was "
        "packed or uploaded)"
    )
    with store_orch.admin() as http:
        assert http.get(api.package(sha)).status_code == 404


@pytest.mark.timeout(300)
def test_the_workdirs_requirements_txt_is_used_by_default_and_a_missing_dependency_hints_at_it(
    store_orch: Orchestrator, project: Path
) -> None:
    model = project / "byopkg" / "model.py"
    model.write_text("import byoreq  # the project's dependency\n" + MODEL)
    (project / "requirements.txt").write_text("--no-index\n--find-links wheels\nbyoreq==0.1.0\n")
    build_wheel(project / "wheels", "byoreq", "0.1.0")
    args = ["runs", "create", "--workdir", str(project), "--module", "byopkg.model:Net", "--datamodule",
            "byopkg.model:Data", "--target-batch-size", "8", "--batch-size", "4", "--workers", "0",
            "--min-workers", "0"]  # fmt: skip

    name = f"code-{next(_names)}"
    created = cli(store_orch, *args, "--name", name)
    assert created.exit_code == 0, created.output
    assert "requirements: the workdir's requirements.txt, installed on every worker" in created.output
    with store_orch.admin() as http:
        assert http.get(api.run(name)).json()["spec"]["requirements"] == ["-r requirements.txt"]

    without = cli(store_orch, *args, "--name", f"code-{next(_names)}", "--no-requirements-txt")
    assert without.exit_code == 1
    assert "No module named 'byoreq'" in without.output and "requirements:" not in without.output
    assert "--requirement byoreq or --requirements-file requirements.txt" in without.output, without.output
    assert "at the top of the workdir" not in without.output


@pytest.mark.timeout(240)
def test_a_refused_create_leaves_no_package_stored_unless_a_run_names_it(
    store_orch: Orchestrator, project: Path, tmp_path: Path
) -> None:
    _, sha = packed(own_bytes(project), tmp_path)
    args = ["runs", "create", "--workdir", str(project), "--module", "byopkg.model:Net", "--datamodule",
            "byopkg.model:Data", "--target-batch-size", "8", "--batch-size", "4", "--workers", "0",
            "--min-workers", "0"]  # fmt: skip
    name = f"code-{next(_names)}"
    refused = cli(store_orch, *args, "--name", name, "--module-arg", "hiden=8")
    assert refused.exit_code == 1 and "takes no argument 'hiden'" in refused.output
    assert f"package {sha[:12]}" in refused.output and "uploaded" in refused.output
    with store_orch.admin() as http:
        assert http.get(api.package(sha)).status_code == 404

    assert cli(store_orch, *args, "--name", name).exit_code == 0
    taken = cli(
        store_orch, *args, "--name", name
    )  # the same package, refused: the run that names it keeps it
    assert taken.exit_code == 6 and "exists already" in taken.output and "already stored" in taken.output
    with store_orch.admin() as http:
        assert http.get(api.package(sha)).status_code == 200
