"""What ``spotswarm serve`` does about being reachable from the network: the start-up warning for plain
HTTP beyond loopback (silenced by ``--tls-proxy``), the open-files limit raised to the hard limit, a
DHT peer that never asks a router to open its port, a generated admin token that is never written to
its output, a data dir private to its user, no answer to a host it is not served as (DNS rebinding),
and half-open connections of one client that cannot keep others out. Each test starts the real server.

The module's server has lowered connection bounds (the defaults are 2,048 connections, 256 per client
and 10 s for a header), so a few hundred sockets show what thousands would. The attacker connects from
127.0.0.2 (loopback, but another client address), everyone else from 127.0.0.1."""

from __future__ import annotations

import hashlib
import socket
import stat
import time
from pathlib import Path

import pytest

from orchestrator.processes import descendants
from tests.support import api
from tests.support.checkpoint_files import checkpoint_bytes
from tests.support.orchestrator import HAND_ONLY, Orchestrator, start_orchestrator
from tests.support.processes import ProcessRegistry, command_line
from tests.support.sockets import close_all, open_half_requests
from tests.support.specs import run_spec
from tests.support.waiting import wait_until
from tests.support.workers import become_checkpointer, register
from worker.protocol.paths import CHECKSUM_HEADER

WARNING = "serving plain HTTP on 0.0.0.0"
LIMIT_CONCURRENCY = 64
PER_CLIENT = 32
HEADER_TIMEOUT_S = 3.0
ORCHESTRATOR_ENV = {
    **HAND_ONLY,
    "SPOTSWARM_HTTP_LIMIT_CONCURRENCY": str(LIMIT_CONCURRENCY),
    "SPOTSWARM_HTTP_MAX_CONNECTIONS_PER_CLIENT": str(PER_CLIENT),
    "SPOTSWARM_HTTP_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
}


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

    # below the server, in a process group of its own (a terminal's Ctrl-C reaches only the server)
    daemons = [cmd for cmd in map(command_line, descendants(orch.proc.pid)) if "p2pd" in cmd]
    assert daemons, "the orchestrator's DHT daemon runs below it"
    assert all("-natPortMap=0" in cmd for cmd in daemons), daemons


# -- the admin token and the data dir --------------------------------------------------------------------


def test_the_generated_admin_token_is_not_in_the_server_output(served_orch: Orchestrator) -> None:
    output = served_orch.proc.log()
    assert served_orch.admin_token not in output
    assert str(served_orch.data_dir / "admin_token") in output  # where to read it


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_data_dir_and_its_files_are_private(served_orch: Orchestrator) -> None:
    with served_orch.admin() as http:
        created = http.post(api.runs(), json=run_spec("private-files"))
        assert created.status_code == 201, created.text
    worker = register(served_orch, created.json()["join_token"])
    blob = checkpoint_bytes(b"weights" * 100)
    become_checkpointer(served_orch, worker)  # only the run's checkpointer uploads
    with served_orch.client(worker["worker_token"]) as http:
        uploaded = http.put(
            api.checkpoint_upload(worker["worker_id"], 3),
            content=blob,
            headers={CHECKSUM_HEADER: hashlib.sha256(blob).hexdigest()},
        )
    assert uploaded.status_code == 201, uploaded.text
    data = served_orch.data_dir
    checkpoints = [p for p in (data / "checkpoints").rglob("*") if p.is_file()]
    assert checkpoints
    wait_until(lambda: (data / "spotswarm.db").exists(), 10)
    paths = [data, data / "spotswarm.db", data / "checkpoints", data / "tmp", data / "workers", *checkpoints]
    open_to_others = {str(p): oct(_mode(p)) for p in paths if _mode(p) & 0o077}
    assert not open_to_others, open_to_others


# -- Host names and half-open connections ---------------------------------------------------------------


def test_a_request_naming_a_host_the_server_is_not_served_as_gets_400(served_orch: Orchestrator) -> None:
    """DNS rebinding: a page on a name made to resolve to 127.0.0.1 sends that name as Host."""
    port = served_orch.port
    with served_orch.client() as http:
        refused = http.get(api.runs(), headers={"Host": f"rebind.attacker.example:{port}"})
        assert refused.status_code == 400 and "Host" in refused.text, refused.text
        assert http.get("/healthz", headers={"Host": "rebind.attacker.example"}).status_code == 400
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LocalHost.", f"[::1]:{port}", "10.0.3.7"):
            assert http.get(api.runs(), headers={"Host": host}).status_code == 200, host


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return not sock.recv(65536)
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


@pytest.mark.timeout(120)
def test_one_client_holding_half_open_connections_keeps_no_one_else_out(served_orch: Orchestrator) -> None:
    """Without bounds, connections past limit_concurrency get every caller, /healthz included, a 503 for
    as long as one client holds them. Here the client's connections past its share are closed at once,
    and the rest once their header is late; /healthz answers 200 throughout."""
    flood = open_half_requests(
        served_orch.port, 5 * LIMIT_CONCURRENCY, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    )
    try:
        opened_at = time.monotonic()
        with served_orch.client() as http:
            for _ in range(5):
                assert http.get("/healthz").status_code == 200
        wait_until(lambda: sum(map(_closed_by_server, flood)) >= len(flood) - PER_CLIENT, 10,
                   message="the connections beyond the client's share closed at once")  # fmt: skip
        wait_until(lambda: all(map(_closed_by_server, flood)), HEADER_TIMEOUT_S + 10,
                   message="every half-open connection closed after the header timeout")  # fmt: skip
        assert time.monotonic() - opened_at >= HEADER_TIMEOUT_S - 0.5, "not before the header timeout"
    finally:
        close_all(flood)
