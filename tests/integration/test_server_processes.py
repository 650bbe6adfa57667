"""What a stopping server counts as its own processes (``orchestrator/cli/stopping.py``): real child
processes read through ``/proc``. torch's shared-memory manager is left alone (it frees the shared memory
segments of its clients as it leaves), though Linux keeps only the first 15 bytes of its name."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator import processes
from orchestrator.cli.stopping import TORCH_SHM_MANAGER, own_processes


@pytest.fixture
def program_named(tmp_path: Path) -> Iterator[Callable[[str], int]]:
    """Start ``sleep`` under another name as a child of this process; every one is killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    sleep = shutil.which("sleep")
    assert sleep is not None

    def start(name: str) -> int:
        program = tmp_path / name
        shutil.copy(sleep, program)
        child = subprocess.Popen([str(program), "60"])
        started.append(child)
        return child.pid

    yield start
    for child in started:
        child.kill()
        child.wait(timeout=10)


@pytest.mark.timeout(30)
def test_a_stopping_server_leaves_torchs_shared_memory_manager_alone(
    program_named: Callable[[str], int],
) -> None:
    manager = program_named(TORCH_SHM_MANAGER)
    other = program_named("p2pd")
    assert processes.command_name(manager) == "torch_shm_manag"  # what Linux keeps of its name
    own = own_processes(include_workers=False)
    assert other in own
    assert manager not in own
