"""``/api/v1/packages``: code packages no run names are swept once older than the grace period, while
those a run names stay. The app in-process, its store on the local disk, the grace period short."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from orchestrator.cli.packaging import pack
from tests.support import api
from tests.support.inprocess import InProcessOrchestrator as Orchestrator
from tests.support.orchestrator import HAND_ONLY
from tests.support.specs import run_spec
from tests.support.waiting import wait_until

ORCHESTRATOR_ENV = {
    **HAND_ONLY,
    "SPOTSWARM_PACKAGE_ORPHAN_GRACE_S": "3",
    "SPOTSWARM_PACKAGE_SWEEP_INTERVAL_S": "0.2",
}


def package_bytes(tmp_path: Path, text: str) -> tuple[bytes, str]:
    root = tmp_path / text
    root.mkdir()
    (root / "model.py").write_text(f"X = {text!r}\n")
    data = pack(root, root.parent, 1 << 20).archive.read_bytes()
    return data, hashlib.sha256(data).hexdigest()


@pytest.mark.timeout(60)
def test_packages_no_run_names_are_swept_after_the_grace_period(
    api_app: Orchestrator, tmp_path: Path
) -> None:
    (named, named_sha), (orphan, orphan_sha) = package_bytes(tmp_path, "a"), package_bytes(tmp_path, "b")
    with api_app.admin() as http:
        assert http.put(api.package(named_sha), content=named).status_code == 201
        assert http.post(api.runs(), json=run_spec("named", workdir=named_sha)).status_code == 201
        assert http.put(api.package(orphan_sha), content=orphan).status_code == 201
        assert http.get(api.package(orphan_sha)).status_code == 200  # within its grace period

        def swept() -> bool:
            return http.get(api.package(orphan_sha)).status_code == 404

        wait_until(swept, 20, message="the package no run names is deleted")
        assert http.get(api.package(named_sha)).status_code == 200
    assert sorted(p.name for p in (api_app.data_dir / "checkpoints" / "packages").iterdir()) == [
        f"{named_sha}.tar.gz"
    ]
