"""The Terraform module, offline: formatting, validation, plan tests with a mocked AWS provider, and the
worker cloud-init template rendering the same in Terraform as in the EC2 launcher (see
:mod:`tests.terraform_support` for how Terraform runs here).
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.launchers.ec2_userdata import DEFAULT_WORKER_TEMPLATE, render_worker_user_data
from tests.helpers import REPO_ROOT
from tests.terraform_support import init, module_workspace, run_terraform


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of terraform/ and deploy/ (the module reads ../deploy), initialised without a backend."""
    return module_workspace(tmp_path_factory.mktemp("tf"))


@pytest.mark.timeout(60)
def test_terraform_files_are_formatted() -> None:
    module = str(REPO_ROOT / "terraform")
    run_terraform(["fmt", "-check", "-recursive", "-diff", "-no-color", module], REPO_ROOT)


@pytest.mark.timeout(120)
def test_module_and_minimal_example_validate(workspace: Path) -> None:
    assert "The configuration is valid" in run_terraform(["validate", "-no-color"], workspace)
    example = workspace / "examples" / "minimal"
    init(example)
    assert "The configuration is valid" in run_terraform(["validate", "-no-color"], example)


@pytest.mark.timeout(180)
def test_plan_tests_pass_with_mocked_provider(workspace: Path) -> None:
    output = run_terraform(["test", "-no-color"], workspace, timeout_s=170)
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
    run_terraform(["init", "-input=false", "-no-color"], tmp_path)
    run_terraform(["apply", "-auto-approve", "-input=false", "-no-color"], tmp_path)
    rendered = run_terraform(["output", "-raw", "rendered"], tmp_path)
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
    run_terraform(["init", "-input=false", "-no-color"], tmp_path)
    run_terraform(["apply", "-auto-approve", "-input=false", "-no-color"], tmp_path)
    rendered = run_terraform(["output", "-raw", "rendered"], tmp_path)

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
