"""What ``spotswarm serve`` does about being reachable from the network: the start-up warning for plain
HTTP beyond loopback (silenced by ``--tls-proxy``), the open-files limit raised to the hard limit, a
DHT peer that never asks a router to open its port, a generated admin token that is never written to
its output, and a data dir private to its user. Each test starts the real server."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.orchestrator import Orchestrator, start_orchestrator
from tests.support.processes import ProcessRegistry
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from tests.support.workers import become_checkpointer, register
from worker.wire import CHECKSUM_HEADER

WARNING = "serving plain HTTP on 0.0.0.0"


def _group_processes(pgid: int) -> dict[int, str]:
    """Command lines of the live processes in process group ``pgid``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # it ended meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
            found[int(entry)] = cmdline
    return found


@pytest.mark.timeout(240)
def test_plain_http_beyond_loopback_warns_at_start_unless_a_tls_proxy_is_declared(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    everywhere = {"SPOTSWARM_HOST": "0.0.0.0"}
    exposed = start_orchestrator(processes, tmp_path / "exposed", extra_env=everywhere, name="exposed")
    warnings = [line for line in exposed.proc.log().splitlines() if WARNING in line]
    assert len(warnings) == 1, exposed.proc.log()[-3000:]
    assert "WARNING" in warnings[0] and "SPOTSWARM_TLS_PROXY=true" in warnings[0]
    exposed.stop()

    proxied = start_orchestrator(
        processes,
        tmp_path / "proxied",
        extra_env={**everywhere, "SPOTSWARM_TLS_PROXY": "true"},
        name="proxied",
    )
    assert "plain HTTP" not in proxied.proc.log()
    proxied.stop()


@pytest.mark.timeout(180)
def test_serve_raises_its_open_files_limit_and_its_dht_maps_no_router_port(
    processes: ProcessRegistry, tmp_path: Path
) -> None:
    orch = start_orchestrator(
        processes, tmp_path / "orch", command_prefix=["prlimit", "--nofile=1024:4096", "--"]
    )

    limits = Path(f"/proc/{orch.proc.pid}/limits").read_text()
    [line] = [row for row in limits.splitlines() if row.startswith("Max open files")]
    assert line.split()[3:5] == ["4096", "4096"], line
    assert "open-files limit raised from 1024 to 4096" in orch.proc.log()
    assert "plain HTTP" not in orch.proc.log(), "loopback (the default) needs no warning"

    daemons = [cmd for cmd in _group_processes(orch.proc.pid).values() if "p2pd" in cmd]
    assert daemons, "the orchestrator's DHT daemon runs in its process group"
    assert all("-natPortMap=0" in cmd for cmd in daemons), daemons


# -- the admin token and the data dir --------------------------------------------------------------------


def test_the_generated_admin_token_is_not_in_the_server_output(orch: Orchestrator) -> None:
    output = orch.proc.log()
    assert orch.admin_token not in output
    assert str(orch.data_dir / "admin_token") in output  # where to read it


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_data_dir_and_its_files_are_private(orch: Orchestrator) -> None:
    with orch.admin() as http:
        created = http.post("/api/v1/runs", json=run_spec("private-files"))
        assert created.status_code == 201, created.text
    worker = register(orch, created.json()["join_token"])
    blob = checkpoint_bytes(b"weights" * 100)
    become_checkpointer(orch, worker)  # only the run's checkpointer uploads
    with orch.client(worker["worker_token"]) as http:
        uploaded = http.put(
            f"/api/v1/workers/{worker['worker_id']}/checkpoints/3",
            content=blob,
            headers={CHECKSUM_HEADER: hashlib.sha256(blob).hexdigest()},
        )
    assert uploaded.status_code == 201, uploaded.text
    data = orch.data_dir
    checkpoints = [p for p in (data / "checkpoints").rglob("*") if p.is_file()]
    assert checkpoints
    wait_until(lambda: (data / "spotswarm.db").exists(), 10)
    paths = [data, data / "spotswarm.db", data / "checkpoints", data / "tmp", data / "workers", *checkpoints]
    open_to_others = {str(p): oct(_mode(p)) for p in paths if _mode(p) & 0o077}
    assert not open_to_others, open_to_others
