"""The cloud-init user data of one EC2 worker, rendered from ``deploy/cloud-init/worker.yaml``.

The same template feeds Terraform's ``templatefile()`` (the launch template's inert default). Both
tools read ``${name}`` as a variable and ``$${name}`` as a literal ``${name}``; Python's
:class:`string.Template` does the same, which is why it is the renderer here. The worker's environment
travels base64-encoded, so no token or value can break the YAML around it.

An instance of several peers (one per GPU) carries them all in that one file: the lines they share as
they are, and each peer's own as ``PEER<gpu>_NAME=value``; the template's start script splits them into
one environment file per peer and runs peer ``i`` as container ``spotswarm-worker-<i>`` on GPU ``i``.
A file without ``PEER`` lines runs one container on every GPU, as before.
"""

from __future__ import annotations

import base64
import re
import string
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.launchers.base import LauncherConfigError

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_WORKER_TEMPLATE = REPO_ROOT / "deploy" / "cloud-init" / "worker.yaml"
TEMPLATE_VARIABLES = frozenset({"worker_image", "worker_env_b64", "docker_gpus"})
MAX_USER_DATA_BYTES = 16 * 1024  # EC2's limit on raw user data
PEER_PREFIX = "PEER"  # PEER<gpu>_NAME=value: one peer's own variable on an instance of several

_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_LITERAL = re.compile(r"\$\$\{")  # "$${" renders as a literal "${" in both tools
# Once literals are removed, a dollar sign not followed by "{name}" means the renderers would disagree.
_STRAY_DOLLAR = re.compile(r"\$(?!\{[A-Za-z_][A-Za-z0-9_]*\})")


def encode_env_file(env: Mapping[str, str]) -> str:
    """``KEY=VALUE`` lines (docker ``--env-file`` syntax), base64-encoded.

    Raises LauncherConfigError for a name that is not an environment variable name or a value with a
    line break (``--env-file`` has no quoting).
    """
    lines = []
    for name, value in sorted(env.items()):
        if not _ENV_NAME.match(name):
            raise LauncherConfigError(f"worker environment name {name!r} is not NAME_LIKE_THIS")
        if "\n" in value or "\r" in value:
            raise LauncherConfigError(f"worker environment value of {name} contains a line break")
        lines.append(f"{name}={value}\n")
    return base64.b64encode("".join(lines).encode()).decode("ascii")


def check_template(text: str) -> None:
    """Raise LauncherConfigError unless ``text`` renders the same in Python and in Terraform."""
    plain = _LITERAL.sub("{", text)
    stray = _STRAY_DOLLAR.search(plain)
    if stray:
        line = plain.count("\n", 0, stray.start()) + 1
        raise LauncherConfigError(f"worker template line {line}: write a literal as $${{name}}")
    used = {m.group(1) for m in re.finditer(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", plain)}
    unknown = used - TEMPLATE_VARIABLES
    if unknown:
        raise LauncherConfigError(f"worker template uses unknown variables {sorted(unknown)}")
    if "%{" in text:
        raise LauncherConfigError("worker template must not use Terraform directives (%{...})")


def machine_env(peer_envs: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """One environment for the peers of an instance: what all share, plus each peer's own values as
    ``PEER<i>_NAME`` (nothing prefixed for a lone peer)."""
    if len(peer_envs) == 1:
        return dict(peer_envs[0])
    names = {name for env in peer_envs for name in env}
    shared = {
        n: peer_envs[0][n] for n in names if all(env.get(n) == peer_envs[0].get(n) for env in peer_envs)
    }
    own = {
        f"{PEER_PREFIX}{i}_{n}": v
        for i, env in enumerate(peer_envs)
        for n, v in env.items()
        if n not in shared
    }
    return {**shared, **own}


def render_worker_user_data(
    template_path: Path, *, worker_image: str, env: Mapping[str, str], gpus: bool
) -> str:
    """The user data for one worker instance (``env``: one peer's, or :func:`machine_env`'s for several).
    Raises LauncherConfigError (bad template, env, or too large)."""
    try:
        text = template_path.read_text()
    except OSError as exc:
        raise LauncherConfigError(f"cannot read worker user-data template {template_path}: {exc}") from exc
    check_template(text)
    if not worker_image or any(c.isspace() for c in worker_image):
        raise LauncherConfigError(f"worker image {worker_image!r} must be one word (registry/name:tag)")
    rendered = string.Template(text).substitute(
        worker_image=worker_image,
        worker_env_b64=encode_env_file(env),
        docker_gpus="all" if gpus else "none",
    )
    if len(rendered.encode()) > MAX_USER_DATA_BYTES:
        raise LauncherConfigError(f"worker user data is {len(rendered.encode())} bytes; EC2 allows 16 KiB")
    return rendered
