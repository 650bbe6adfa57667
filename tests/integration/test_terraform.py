"""The Terraform module, offline: formatting, validation, plan tests with a mocked AWS provider, and the
worker cloud-init template rendering the same in Terraform as in the EC2 launcher.

Terraform and the mirrored AWS provider (/opt/tf-plugins) are part of the toolchain: a missing one
fails these tests, it does not skip them. Everything runs in a temporary copy (``.terraform`` and state
never land in the repository).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.launchers.ec2_userdata import DEFAULT_WORKER_TEMPLATE, render_worker_user_data
from tests.helpers import REPO_ROOT

PLUGIN_DIR = Path(os.environ.get("SPOTSWARM_TF_PLUGIN_DIR", "/opt/tf-plugins"))


def _terraform() -> str:
    path = shutil.which("terraform")
    if path is None:
        pytest.fail("terraform is not installed (expected Terraform >= 1.9 on PATH)")
    if not (PLUGIN_DIR / "registry.terraform.io" / "hashicorp" / "aws").is_dir():
        pytest.fail(f"the AWS provider mirror is missing at {PLUGIN_DIR}")
    return path


def _run(args: list[str], cwd: Path, timeout_s: float = 120) -> str:
    env = {
        **os.environ,
        "CHECKPOINT_DISABLE": "1",  # no version check over the network
        "TF_IN_AUTOMATION": "1",
        "TF_CLI_CONFIG_FILE": os.devnull,
        "TF_DATA_DIR": str(cwd / ".terraform"),
    }
    result = subprocess.run(
        [_terraform(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"terraform {' '.join(args)} failed in {cwd}:\n{output}"
    return output


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of terraform/ and deploy/ (the module reads ../deploy), initialised without a backend."""
    root = tmp_path_factory.mktemp("tf")
    ignore = shutil.ignore_patterns(".terraform", "*.tfstate*", ".terraform.lock.hcl")
    shutil.copytree(REPO_ROOT / "terraform", root / "terraform", ignore=ignore)
    shutil.copytree(REPO_ROOT / "deploy", root / "deploy")
    module = root / "terraform"
    _run(["init", "-backend=false", f"-plugin-dir={PLUGIN_DIR}", "-input=false", "-no-color"], module)
    return module


@pytest.mark.timeout(60)
def test_terraform_files_are_formatted() -> None:
    _run(["fmt", "-check", "-recursive", "-diff", "-no-color", str(REPO_ROOT / "terraform")], REPO_ROOT)


@pytest.mark.timeout(120)
def test_module_and_minimal_example_validate(workspace: Path) -> None:
    assert "The configuration is valid" in _run(["validate", "-no-color"], workspace)
    example = workspace / "examples" / "minimal"
    _run(["init", "-backend=false", f"-plugin-dir={PLUGIN_DIR}", "-input=false", "-no-color"], example)
    assert "The configuration is valid" in _run(["validate", "-no-color"], example)


@pytest.mark.timeout(180)
def test_plan_tests_pass_with_mocked_provider(workspace: Path) -> None:
    output = _run(["test", "-no-color"], workspace, timeout_s=170)
    assert "0 failed" in output and "passed" in output, output


@pytest.mark.timeout(60)
def test_worker_template_renders_the_same_in_terraform_and_python(tmp_path: Path) -> None:
    env = {"SPOTSWARM_URL": "http://10.0.0.5:8000", "SPOTSWARM_JOIN_TOKEN": "tok$en"}
    expected = render_worker_user_data(
        DEFAULT_WORKER_TEMPLATE, worker_image="registry.example/w:1", env=env, gpus=False
    )
    env_b64 = base64.b64encode(b"SPOTSWARM_JOIN_TOKEN=tok$en\nSPOTSWARM_URL=http://10.0.0.5:8000\n").decode()
    (tmp_path / "main.tf").write_text(
        'output "rendered" {\n'
        f'  value = templatefile("{DEFAULT_WORKER_TEMPLATE}", {{ worker_image = "registry.example/w:1", '
        f'worker_env_b64 = "{env_b64}", docker_gpus = "none" }})\n'
        "}\n"
    )
    _run(["init", "-input=false", "-no-color"], tmp_path)
    _run(["apply", "-auto-approve", "-input=false", "-no-color"], tmp_path)
    rendered = _run(["output", "-raw", "rendered"], tmp_path)
    assert rendered == expected


@pytest.mark.timeout(60)
def test_orchestrator_cloud_init_renders_valid_cloud_config(tmp_path: Path) -> None:
    template = REPO_ROOT / "deploy" / "cloud-init" / "orchestrator.yaml"
    env_b64 = base64.b64encode(b"SPOTSWARM_PORT=8000\n").decode()
    (tmp_path / "main.tf").write_text(
        'output "rendered" {\n'
        f'  value = templatefile("{template}", {{ orchestrator_image = "reg.example/o:1", '
        'postgres_image = "postgres:16.9-bookworm", data_volume_id = "vol-0123456789abcdef0", '
        f'api_port = 8000, dht_port = 31330, env_file_b64 = "{env_b64}" }})\n'
        "}\n"
    )
    _run(["init", "-input=false", "-no-color"], tmp_path)
    _run(["apply", "-auto-approve", "-input=false", "-no-color"], tmp_path)
    rendered = _run(["output", "-raw", "rendered"], tmp_path)

    assert rendered.startswith("#cloud-config\n")
    config = yaml.safe_load(rendered)
    files = {f["path"]: f["content"] for f in config["write_files"]}
    setup = files["/usr/local/bin/spotswarm-orchestrator-setup"]
    assert "nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0" in setup
    assert "SPOTSWARM_DHT_ANNOUNCE_MADDRS=/ip4/$ip/tcp/31330" in setup
    (tmp_path / "setup.sh").write_text(setup)
    subprocess.run(["bash", "-n", str(tmp_path / "setup.sh")], check=True, timeout=10)
    orchestrator_unit = files["/etc/systemd/system/spotswarm-orchestrator.service"]
    assert "--network host" in orchestrator_unit and "reg.example/o:1" in orchestrator_unit
    assert "Requires=docker.service spotswarm-postgres.service" in orchestrator_unit
    assert "postgres:16.9-bookworm" in files["/etc/systemd/system/spotswarm-postgres.service"]
    assert base64.b64decode(files["/etc/spotswarm/orchestrator.env"]) == b"SPOTSWARM_PORT=8000\n"
