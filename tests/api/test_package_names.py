"""A run whose code ships a top-level ``worker`` or ``orchestrator`` (spotswarm's own packages) is refused
when it is created, with the entry and what to rename; a name that only looks alike is not. The app
in-process, no import probe: the refusal does not depend on it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from orchestrator.cli.packaging import pack
from tests.support import api
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.specs import run_spec


def upload(orch: Orchestrator, root: Path, files: dict[str, str]) -> str:
    """Pack ``files`` (path -> text) as ``runs create --workdir`` does, upload it, return its digest."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    data = pack(root, root.parent, 1 << 20).archive.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    with orch.admin() as http:
        assert http.put(api.package(digest), content=data).status_code == 201
    return digest


@pytest.mark.parametrize(
    ("files", "entry"),
    [
        ({"worker/__init__.py": "", "worker/model.py": "X = 1\n"}, "package 'worker' (worker/__init__.py)"),
        ({"worker/train/model.py": "X = 1\n"}, "package 'worker' (worker/train/model.py)"),  # a namespace one
        ({"orchestrator.py": "X = 1\n", "model.py": "X = 1\n"}, "module 'orchestrator' (orchestrator.py)"),
    ],
    ids=["package", "namespace-package", "module"],
)
def test_a_package_with_a_top_level_worker_or_orchestrator_is_refused_at_create(
    api_app: Orchestrator, tmp_path: Path, files: dict[str, str], entry: str
) -> None:
    digest = upload(api_app, tmp_path / "project", files)
    with api_app.admin() as http:
        refused = http.post(api.runs(), json=run_spec("clash", workdir=digest))
        assert refused.status_code == 422
        detail = refused.json()["detail"]
        assert f"the package ships a top-level {entry}, a name spotswarm's own code takes" in detail
        assert "rename it" in detail and "\n" not in detail
        assert http.get(api.run("clash")).status_code == 404
        assert http.get(api.package(digest)).status_code == 404  # no run names it: deleted


def test_names_that_only_look_alike_are_accepted(api_app: Orchestrator, tmp_path: Path) -> None:
    files = {
        "workers/__init__.py": "",
        "my_orchestrator.py": "X = 1\n",
        "worker/settings.yaml": "data only: nothing imports it\n",
    }
    digest = upload(api_app, tmp_path / "project", files)
    with api_app.admin() as http:
        assert http.post(api.runs(), json=run_spec("alike", workdir=digest)).status_code == 201
