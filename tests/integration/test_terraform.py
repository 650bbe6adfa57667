"""The Terraform module, offline: formatting, validation, plan tests with a mocked AWS provider, and the
worker cloud-init template rendering the same in Terraform as in the EC2 launcher (see
:mod:`tests.support.terraform` for how Terraform runs here).
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.launchers.ec2.userdata import DEFAULT_WORKER_TEMPLATE, render_worker_user_data
from tests.support.processes import REPO_ROOT
from tests.support.terraform import (
    init,
    module_workspace,
    render_orchestrator_cloud_init,
    render_template,
    run_terraform,
)


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
    variables = {"worker_image": "registry.example/w:1", "worker_env_b64": env_b64, "docker_gpus": "none"}
    assert render_template(tmp_path, DEFAULT_WORKER_TEMPLATE, variables) == expected


@pytest.mark.timeout(90)
@pytest.mark.parametrize("domain", ["", "spotswarm.example.com"], ids=["self-signed", "domain"])
def test_orchestrator_cloud_init_renders_valid_cloud_config(tmp_path: Path, domain: str) -> None:
    env_b64 = base64.b64encode(b"SPOTSWARM_PORT=8001\n").decode()
    nginx_b64 = base64.b64encode(b"events {}\n").decode()
    rendered = render_orchestrator_cloud_init(
        tmp_path, domain_name=domain, env_file_b64=env_b64, nginx_conf_b64=nginx_b64
    )

    assert rendered.startswith("#cloud-config\n")
    config = yaml.safe_load(rendered)
    files = {f["path"]: f["content"] for f in config["write_files"]}
    setup = files["/usr/local/bin/spotswarm-orchestrator-setup"]
    assert "nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0" in setup
    assert "SPOTSWARM_DHT_ANNOUNCE_MADDRS=/ip4/$ip/tcp/31330" in setup
    assert "SPOTSWARM_PUBLIC_URL=http://$ip:8000" in setup, "workers use the private plain-HTTP port"
    for script in (
        "spotswarm-orchestrator-setup",
        "spotswarm-tls-self-signed",
        "spotswarm-tls-boot",
        "spotswarm-certbot",
    ):
        (tmp_path / script).write_text(files[f"/usr/local/bin/{script}"])
        subprocess.run(["bash", "-n", str(tmp_path / script)], check=True, timeout=10)
    assert f'domain="{domain}"' in files["/usr/local/bin/spotswarm-tls-boot"]
    orchestrator_unit = files["/etc/systemd/system/spotswarm-orchestrator.service"]
    assert "--network host" in orchestrator_unit and "reg.example/o:1" in orchestrator_unit
    assert "Requires=docker.service spotswarm-postgres.service" in orchestrator_unit
    assert "postgres:16.9-bookworm" in files["/etc/systemd/system/spotswarm-postgres.service"]
    assert base64.b64decode(files["/etc/spotswarm/orchestrator.env"]) == b"SPOTSWARM_PORT=8001\n"
    assert base64.b64decode(files["/etc/spotswarm/nginx.conf"]) == b"events {}\n"
    proxy_unit = files["/etc/systemd/system/spotswarm-proxy.service"]
    assert "ExecStartPre=/usr/local/bin/spotswarm-tls-boot" in proxy_unit
    assert "-v /etc/spotswarm/nginx.conf:/etc/nginx/nginx.conf:ro" in proxy_unit
    assert "nginx:1.28.0-alpine" in proxy_unit and "--network host" in proxy_unit
    assert "certbot/certbot:v4.0.0" in files["/usr/local/bin/spotswarm-certbot"]
    started = [c for c in config["runcmd"] if c[:3] == ["systemctl", "enable", "--now"]]
    assert ["systemctl", "enable", "--now", "spotswarm-postgres.service", "spotswarm-orchestrator.service",
            "spotswarm-proxy.service"] in started  # fmt: skip
    certbot = ["systemctl", "enable", "--now", "spotswarm-certbot.timer"]
    assert (certbot in started) == bool(domain), "certbot runs only for a domain"
