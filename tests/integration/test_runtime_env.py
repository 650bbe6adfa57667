"""A run's requirements on a worker: installed by uv or pip into an environment layered on the worker's
own, which sees torch (never reinstalled), reused while the requirements stay the same."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT
from tests.support.wheels import build_wheel
from worker.runtime.env import InstallFailed, ensure_requirements_env, find_installer, requirements_key

CHECK = """
import sys
from pathlib import Path
from worker.runtime.env import activate
activate(None, Path(sys.argv[1]))
import {name}, torch
print({name}.VALUE, "|", torch.__file__)
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_requirements_install_beside_the_workers_own_packages_once(tmp_path: Path, installer: str) -> None:
    name = f"tinydep_{installer}"
    package_dir = tmp_path / "package"
    build_wheel(package_dir / "wheels", name, "0.1.0", requires=["torch", "lightning"])
    # Offline: only the package's own wheels; the dependency on torch resolves only if torch is seen.
    requirements = ["--no-index", "--find-links wheels", name]
    cache = tmp_path / "cache"

    def ensure() -> tuple[Path, bool]:
        return ensure_requirements_env(
            cache,
            requirements,
            package_dir=package_dir,
            package_digest="a" * 64,
            installer=find_installer(installer),
            environ=dict(os.environ),
            timeout_s=180,
        )

    site_dir, cached = ensure()
    assert not cached and (site_dir / name).is_dir()
    assert not (site_dir / "torch").exists() and not (site_dir / "lightning").exists()
    assert importlib.util.find_spec(name) is None  # not in the worker's own environment
    seen = subprocess.run(
        [sys.executable, "-c", CHECK.format(name=name), str(site_dir)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert seen.startswith(f"{name} 0.1.0 |") and str(Path(sys.prefix)) in seen.split("|")[1]
    assert ensure() == (site_dir, True)


def test_the_environment_key_follows_the_package_only_where_lines_can_refer_to_it() -> None:
    plain = ["einops>=0.7", "numpy; python_version >= '3.8'", "rich[jupyter]==13.0"]
    assert (
        requirements_key(plain, "a" * 64)
        == requirements_key(plain, "b" * 64)
        == requirements_key(plain, None)
    )
    for line in ("-r requirements.txt", "./wheels/x.whl", "x @ file:///tmp/x.whl", "--find-links wheels"):
        assert requirements_key([line], "a" * 64) != requirements_key([line], "b" * 64), line


@pytest.mark.timeout(120)
def test_a_requirement_that_cannot_install_fails_with_the_installers_words(tmp_path: Path) -> None:
    """The installer's words, without the paths of the environment it made (a temporary directory of the
    server's import probe, which a user reads in the error of ``runs create``: half of it was the path)."""
    with pytest.raises(InstallFailed, match="no-such-dist-spotswarm") as failed:
        ensure_requirements_env(
            tmp_path / "cache",
            ["--no-index", "no-such-dist-spotswarm==1.0"],
            package_dir=None,
            package_digest=None,
            installer=find_installer("auto"),
            environ=dict(os.environ),
            timeout_s=60,
        )
    assert not any((tmp_path / "cache" / "envs").glob("*.ready"))
    assert str(tmp_path) not in str(failed.value) and "environment at" not in str(failed.value)


@pytest.mark.timeout(240)
def test_the_bench_compares_cold_and_cached_with_uv_and_pip(tmp_path: Path) -> None:
    """bench/runtime_env.py in miniature: offline, on a wheel made here that needs the worker's torch."""
    build_wheel(tmp_path / "wheels", "benchdep", "0.1.0", requires=["torch"])
    requirements = ["--no-index", f"--find-links={tmp_path / 'wheels'}", "benchdep"]
    done = subprocess.run(
        [sys.executable, "bench/runtime_env.py", *(f"--requirement={line}" for line in requirements)],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"^uv +[0-9.]+ +[0-9.]+ +[0-9]+x$", done.stdout, re.M), done.stdout
    assert re.search(r"^pip +[0-9.]+ +[0-9.]+ +[0-9]+x$", done.stdout, re.M), done.stdout
    assert "cold install, pip / uv:" in done.stdout and "load average" in done.stdout
