"""``launcher_options: {"cpus_per_worker": N}`` on the local launcher: each real worker agent (forked
from the launcher's fork server, pointed at a closed port so that it keeps retrying its registration)
runs on cores of its own, and a run whose desired workers need more cores than the machine has is
refused when it is created."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.launchers.base import LaunchRequest
from orchestrator.launchers.local import LocalLauncher
from orchestrator.launchers.local_cpus import usable_cpus
from orchestrator.processes import descendants
from tests.integration.test_local_preload import registering, running_launcher
from tests.support import api
from tests.support.inprocess import inprocess_orchestrator
from tests.support.orchestrator import HAND_ONLY
from tests.support.specs import run_spec
from tests.support.waiting import wait_until


def allowed_cpus(pid: int) -> str | None:
    """The ``Cpus_allowed_list`` line of ``/proc/<pid>/status`` (``0``, ``2-3``...)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return None


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[LocalLauncher]:
    with running_launcher(tmp_path / "data") as launcher:
        yield launcher


def pinned(request: LaunchRequest) -> LaunchRequest:
    return LaunchRequest(request.request_id, request.run_name, request.env, {"cpus_per_worker": 1})


@pytest.mark.timeout(120)
def test_each_local_worker_runs_on_a_core_of_its_own(tmp_path: Path, launcher: LocalLauncher) -> None:
    cores = usable_cpus()
    assert len(cores) >= 2, "this test needs a machine with two cores"
    handles = [int(launcher.launch(pinned(registering(f"req-{i}")))) for i in range(2)]

    def agents_cores() -> list[str | None]:
        found = []
        for supervisor in handles:
            children = descendants(supervisor)
            found.append(allowed_cpus(children[0]) if children else None)
        return found

    expected = [str(cores[0]), str(cores[1])]
    wait_until(
        lambda: agents_cores() == expected,
        60,
        message=lambda: f"each agent pins itself to a core of its own, {expected}: {agents_cores()}",
    )
    for request_id, core in (("req-0", cores[0]), ("req-1", cores[1])):
        log = tmp_path / "data" / "workers" / f"{request_id}.log"
        wait_until(lambda log=log: "torch with 1 threads" in log.read_text(), 30, message=f"{log} says")
        assert f"pinned to cores [{core}], torch with 1 threads" in log.read_text()


@pytest.mark.timeout(120)
def test_a_run_needing_more_cores_than_the_machine_has_is_refused_when_created(
    tmp_path: Path, launcher: LocalLauncher
) -> None:
    cores = len(usable_cpus())
    spec = run_spec("too-many-cores", desired_workers=2, launcher_options={"cpus_per_worker": cores})
    fits = run_spec("fits", desired_workers=1, launcher_options={"cpus_per_worker": cores})
    app = inprocess_orchestrator(tmp_path / "orch", env=HAND_ONLY, launchers={"local": launcher})
    with app as orch, orch.admin() as http:
        refused = http.post(api.runs(), json=spec)
        accepted = http.post(api.runs(), json=fits)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"] == (
        f"launcher_options: cpus_per_worker={cores} for 2 desired worker(s) needs {2 * cores} cores, and "
        f"this machine gives the orchestrator {cores}: lower desired_workers or cpus_per_worker "
        f"(at most {cores // 2} per worker for 2 worker(s))"
    )
    assert accepted.status_code == 201, accepted.text
