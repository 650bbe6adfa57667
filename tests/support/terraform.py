"""Terraform for tests, offline: the binary, the mirrored AWS provider, a throwaway copy of the module.

Terraform and the mirrored AWS provider (/opt/tf-plugins) are part of the toolchain: a missing one
fails the tests that need them, it does not skip them. Everything runs in a temporary copy
(``.terraform`` and state never land in the repository).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import REPO_ROOT

PLUGIN_DIR = Path(os.environ.get("SPOTSWARM_TF_PLUGIN_DIR", "/opt/tf-plugins"))
DEPLOY = REPO_ROOT / "deploy"
ORCHESTRATOR_CLOUD_INIT = DEPLOY / "cloud-init" / "orchestrator.yaml"
NGINX_TEMPLATE = DEPLOY / "nginx" / "nginx.conf"
# The module's required inputs, with values its validations accept; tests add or override others.
REQUIRED_VARIABLES: dict[str, Any] = {
    "allowed_api_cidrs": ["203.0.113.7/32"],
    "orchestrator_image": "registry.example/spotswarm-orchestrator:0.1.0",
    "worker_image": "registry.example/spotswarm-worker:0.1.0",
}


def terraform_binary() -> str:
    path = shutil.which("terraform")
    if path is None:
        pytest.fail("terraform is not installed (expected Terraform >= 1.9 on PATH)")
    if not (PLUGIN_DIR / "registry.terraform.io" / "hashicorp" / "aws").is_dir():
        pytest.fail(f"the AWS provider mirror is missing at {PLUGIN_DIR}")
    return path


def run_terraform(args: list[str], cwd: Path, timeout_s: float = 120, stdin: str | None = None) -> str:
    """``terraform ARGS`` in ``cwd`` without network or user config; fails the test on a non-zero exit."""
    env = {
        **os.environ,
        "CHECKPOINT_DISABLE": "1",  # no version check over the network
        "TF_IN_AUTOMATION": "1",
        "TF_CLI_CONFIG_FILE": os.devnull,
        "TF_DATA_DIR": str(cwd / ".terraform"),
    }
    result = subprocess.run(
        [terraform_binary(), *args],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"terraform {' '.join(args)} failed in {cwd}:\n{output}"
    return output


def init(directory: Path) -> None:
    """``terraform init`` from the provider mirror, without a backend."""
    args = ["init", "-backend=false", f"-plugin-dir={PLUGIN_DIR}", "-input=false", "-no-color"]
    run_terraform(args, directory)


def module_workspace(root: Path) -> Path:
    """A copy of terraform/ and deploy/ (the module reads ../deploy) under ``root``, initialised."""
    ignore = shutil.ignore_patterns(".terraform", "*.tfstate*", ".terraform.lock.hcl")
    shutil.copytree(REPO_ROOT / "terraform", root / "terraform", ignore=ignore)
    shutil.copytree(REPO_ROOT / "deploy", root / "deploy")
    module = root / "terraform"
    init(module)
    return module


def evaluate(module: Path, expression: str, variables: Mapping[str, Any]) -> Any:
    """The value of ``expression`` (locals, variables) in the module, as Terraform computes it.

    ``terraform console`` evaluates without AWS credentials; values that depend on resources are
    unknown there, so ask only for what variables decide. One expression per call (console prints
    only the last one).
    """
    args = ["console", "-no-color"]
    for name, value in {**REQUIRED_VARIABLES, **variables}.items():
        args += ["-var", f"{name}={json.dumps(value) if not isinstance(value, str) else value}"]
    output = run_terraform(args, module, stdin=f"jsonencode({expression})\n", timeout_s=150)
    return json.loads(json.loads(output.strip().splitlines()[-1]))


def render_template(workdir: Path, template: Path, variables: Mapping[str, Any]) -> str:
    """``templatefile(template, variables)`` exactly as Terraform renders it (needs no provider)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "variables.json").write_text(json.dumps(dict(variables)))
    (workdir / "main.tf").write_text(
        'output "rendered" {\n'
        f'  value = templatefile("{template}", jsondecode(file("variables.json")))\n'
        "}\n"
    )
    run_terraform(["init", "-input=false", "-no-color"], workdir)
    run_terraform(["apply", "-auto-approve", "-input=false", "-no-color"], workdir)
    return run_terraform(["output", "-raw", "rendered"], workdir)


def module_default(variable: str) -> Any:
    """The default of one of the module's variables (a number, string or bool), read from variables.tf."""
    text = (REPO_ROOT / "terraform" / "variables.tf").read_text()
    block = re.search(rf'variable "{variable}" {{(.*?)\n}}', text, re.S)
    assert block, f"terraform/variables.tf has no variable {variable!r}"
    default = re.search(r"^\s*default\s*=\s*(.+)$", block[1], re.M)
    assert default, f"variable {variable!r} has no default"
    return json.loads(default[1])


def render_orchestrator_cloud_init(workdir: Path, **overrides: Any) -> str:
    """The orchestrator's cloud-init as Terraform renders it, with test values (``overrides`` win)."""
    variables = {
        "orchestrator_image": "reg.example/o:1",
        "postgres_image": "postgres:16.9-bookworm",
        "proxy_image": "nginx:1.28.0-alpine",
        "certbot_image": "certbot/certbot:v4.0.0",
        "domain_name": "",
        "data_volume_id": "vol-0123456789abcdef0",
        "api_port": 8000,
        "dht_port": 31330,
        "nginx_conf_b64": "",
        "env_file_b64": "",
        **overrides,
    }
    return render_template(workdir, ORCHESTRATOR_CLOUD_INIT, variables)
