"""Code packages and the create-time checks against a real `spotswarm serve`, with the package store on
the local disk and on S3 (a moto server): upload, who may download, what a bad spec gets."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli.packaging import pack
from tests.support.aws import FakeAws
from tests.support.cli import cli
from tests.support.orchestrator import NO_RECONCILE, Orchestrator, start_orchestrator
from tests.support.processes import ProcessRegistry
from tests.support.specs import run_spec

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
def orch(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchestrator]:
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
    orch: Orchestrator, project: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    data, sha = packed(project, tmp_path)
    with orch.admin() as http:
        assert http.get(f"/api/v1/packages/{sha}").status_code == 404
        first = http.put(f"/api/v1/packages/{sha}", content=data)
        again = http.put(f"/api/v1/packages/{sha}", content=data)
        assert (first.status_code, again.status_code) == (201, 200), first.text
        assert first.json() == again.json() == {"sha256": sha, "size_bytes": len(data)}
        created = http.post("/api/v1/runs", json=spec(workdir=sha))
        other = http.post("/api/v1/runs", json=spec(workdir=sha))
    assert created.status_code == 201, created.text
    name, join = created.json()["name"], created.json()["join_token"]
    path = f"/api/v1/runs/{name}/package"
    with orch.client(join) as http:
        download = http.get(path)
    assert download.content == data and download.headers["x-checksum-sha256"] == sha
    with orch.client(other.json()["join_token"]) as http:
        assert http.get(path).status_code == 403
    with orch.client() as http:
        assert http.get(path).status_code == 401
        public = http.get(f"/api/v1/runs/{name}").json()["spec"]
    assert public["workdir"] == sha
    on_disk = (orch.data_dir / "checkpoints" / "packages" / f"{sha}.tar.gz").exists()
    assert on_disk == (request.node.callspec.params["orch"] == "local")
    # Deleted with the last run that names it.
    with orch.admin() as http:
        for run in (name, other.json()["name"]):
            assert http.get(f"/api/v1/packages/{sha}").status_code == 200
            http.post(f"/api/v1/runs/{run}/stop").raise_for_status()
            assert http.delete(f"/api/v1/runs/{run}").status_code == 204
        assert http.get(f"/api/v1/packages/{sha}").status_code == 404


@pytest.mark.timeout(120)
def test_uploads_that_are_not_what_they_claim_are_refused(orch: Orchestrator) -> None:
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w:gz") as archive:
        info = tarfile.TarInfo("../outside.py")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"x"))
    evil_sha = hashlib.sha256(evil.getvalue()).hexdigest()
    big = b"x" * (300 << 10)
    with orch.admin() as http:
        mismatch = http.put(f"/api/v1/packages/{'0' * 64}", content=b"some bytes")
        unsafe = http.put(f"/api/v1/packages/{evil_sha}", content=evil.getvalue())
        too_big = http.put(f"/api/v1/packages/{hashlib.sha256(big).hexdigest()}", content=big)
        missing = http.post("/api/v1/runs", json=spec(workdir="f" * 64))
    with orch.client() as http:
        anonymous = http.put(f"/api/v1/packages/{evil_sha}", content=evil.getvalue())
    assert mismatch.status_code == 400 and "sha256" in mismatch.text
    assert unsafe.status_code == 422 and "../outside.py" in unsafe.text
    assert too_big.status_code == 413
    assert missing.status_code == 422 and "no package" in missing.text and "--workdir" in missing.text
    assert anonymous.status_code == 401


@pytest.mark.timeout(240)
def test_create_refuses_arguments_the_constructor_does_not_take(orch: Orchestrator) -> None:
    bad_module = spec(module="tests.support.models:TinyModule", module_args={"hiden": 64})
    bad_data = spec(
        module="tests.support.models:TinyModule",
        datamodule="tests.support.models:TinyDataModule",
        datamodule_args={"size": 8, "shuffle": True},
    )
    with orch.admin() as http:
        module = http.post("/api/v1/runs", json=bad_module)
        data = http.post("/api/v1/runs", json=bad_data)
    assert module.status_code == 422, module.text
    assert module.json()["detail"] == "module_args: TinyModule takes no argument 'hiden' (it takes: hidden)"
    assert data.status_code == 422 and "datamodule_args" in data.text and "'shuffle'" in data.text


@pytest.mark.timeout(240)
def test_a_module_the_server_cannot_import_suggests_shipping_it_with_workdir(
    orch: Orchestrator, project: Path, tmp_path: Path
) -> None:
    _, sha = packed(project, tmp_path)
    classes = ["--module", "byopkg.model:Net", "--datamodule", "byopkg.model:Data"]
    sizes = ["--target-batch-size", "8", "--batch-size", "4", "--workers", "0", "--min-workers", "0"]
    result = cli(orch, "runs", "create", "--name", f"code-{next(_names)}", *classes, *sizes)
    assert result.exit_code == 1
    assert "ModuleNotFoundError: No module named 'byopkg'" in result.output
    assert "the orchestrator imports from its working directory" in result.output
    assert "spotswarm runs create --workdir DIR" in result.output

    shipped = cli(
        orch, "runs", "create", "--name", f"code-{next(_names)}", "--workdir", str(project), *classes, *sizes
    )
    assert shipped.exit_code == 0, shipped.output
    assert f"package {sha[:12]}" in shipped.output

    inner = str(project / "byopkg")  # the package itself, not the project holding it
    misplaced = cli(
        orch, "runs", "create", "--name", f"code-{next(_names)}", "--workdir", inner, *classes, *sizes
    )
    assert misplaced.exit_code == 1 and "at the top of the workdir" in misplaced.output


@pytest.mark.timeout(120)
def test_launcher_options_are_checked_when_the_run_is_created(orch: Orchestrator) -> None:
    with orch.admin() as http:
        answer = http.post("/api/v1/runs", json=spec(
            module="tests.support.models:TinyModule",
            datamodule="tests.support.models:TinyDataModule",
            launcher_options={"workdir": "/tmp/x"},
        ))  # fmt: skip
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"] == (
        "launcher_options: the local launcher takes no options but cpus_per_worker, got ['workdir'] "
        "(a run's code travels with runs create --workdir DIR)"
    )


@pytest.mark.timeout(240)
def test_secret_values_never_come_back_and_a_round_trip_must_give_them_again(
    orch: Orchestrator, tmp_path: Path
) -> None:
    classes = ["--module", "tests.support.models:TinyModule", "--datamodule",
               "tests.support.models:TinyDataModule", "--target-batch-size", "8", "--batch-size", "4",
               "--workers", "0", "--min-workers", "0"]  # fmt: skip
    name = f"code-{next(_names)}"
    created = cli(orch, "runs", "create", "--name", name, *classes, "--env", "DATA_URL=s3://bucket/x",
                  "--secret-env", "API_KEY=value-never-shown", "--json")  # fmt: skip
    assert created.exit_code == 0, created.output
    shown = cli(orch, "runs", "show", name, "--json")
    table = cli(orch, "runs", "show", name)
    assert "env          DATA_URL, API_KEY (secret)" in table.output, table.output
    assert "value-never-shown" not in created.output + shown.output
    with orch.client() as http:
        public = http.get(f"/api/v1/runs/{name}").json()["spec"]
    assert (public["env"], public["secret_env"]) == ({}, {})
    (tmp_path / "spec.json").write_text(json.dumps(json.loads(shown.output)["run"]["spec"]))
    copy = cli(orch, "runs", "create", "-f", str(tmp_path / "spec.json"), "--name", f"{name}-copy")
    assert copy.exit_code == 1 and "secret_env: no value for API_KEY" in copy.output
    again = cli(orch, "runs", "create", "-f", str(tmp_path / "spec.json"), "--name", f"{name}-copy",
                "--secret-env", "API_KEY", env={"API_KEY": "from-my-shell"})  # fmt: skip
    assert again.exit_code == 0, again.output
