"""The AWS deployment's front door, for real: nginx on the configuration the Terraform module ships
(``deploy/nginx/nginx.conf``, rendered by Terraform with this machine's ports and paths), a certificate
made by the deployment's own script, and a real ``spotswarm serve`` behind it on 127.0.0.1.

It proves what users and workers get: HTTPS with a self-signed certificate they can trust (httpx, the
CLI with ``--ca-cert``, OpenSSL's strict checks), and bounds that keep one client from starving the
rest. Attackers connect from 127.0.0.2 (still loopback, but another client address to nginx); users
and workers from 127.0.0.1. The orchestrator runs with 1024 file descriptors, so the closing contrast
(the same kind of flood sent straight to it takes all of them) is small and quick.

The module's tests run one after the other in one process (an xdist group of their own in `make
test`'s lanes): a flood's thousands of connections take ephemeral ports, among them the ones another of
its tests had just found free for an nginx, which then cannot bind them (seen in three-lane runs).
"""

from __future__ import annotations

import getpass
import hashlib
import io
import os
import re
import shutil
import socket
import ssl
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from orchestrator.config import Settings
from tests.support import api
from tests.support.orchestrator import NO_RECONCILE, Orchestrator, start_orchestrator
from tests.support.ports import PORT_ATTEMPTS, free_port, free_ports, port_was_taken
from tests.support.processes import VENV_BIN, ManagedProcess, ProcessRegistry
from tests.support.sockets import ATTACKER, close_all, open_half_requests
from tests.support.specs import run_spec
from tests.support.terraform import (
    NGINX_TEMPLATE,
    module_default,
    render_orchestrator_cloud_init,
    render_template,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.xdist_group("tls-proxy")  # one process: see the module docstring
DOMAIN = "spotswarm.example.com"
HEADER_TIMEOUT_S = 10  # client_header_timeout in the template
ORCHESTRATOR_FILES = 1024


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found is None:
        pytest.fail("nginx is missing: `make nginx` installs Debian's (the tests run their own process)")
    return found


@dataclass
class FrontDoor:
    """nginx (HTTPS for users, plain HTTP for workers) in front of a real orchestrator."""

    orch: Orchestrator
    https_url: str
    worker_url: str
    ca_cert: Path
    fingerprint: str
    self_signed_script: Path
    nginx_conf: Path

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_cert))

    def user(self, **kwargs: Any) -> httpx.Client:
        """A user's client: HTTPS, trusting the deployment's certificate, from 127.0.0.1."""
        return httpx.Client(base_url=self.https_url, verify=self.tls(), timeout=10, **kwargs)


def make_certificate(script: Path, directory: Path, *names: str) -> str:
    """Run the deployment's certificate script; return what it printed."""
    done = subprocess.run(
        ["bash", str(script), str(directory), *names], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def render_nginx(workdir: Path, **ports_and_paths: Any) -> Path:
    """The shipped nginx template with this machine's ports and paths and the module's own limits."""
    variables = {
        "nginx_user": getpass.getuser(),
        "max_connections_per_client": module_default("proxy_max_connections_per_client"),
        "checkpoint_max_bytes": Settings.model_fields["checkpoint_max_bytes"].default,
        "package_max_bytes": Settings.model_fields["package_max_bytes"].default,
        "domain_name": "",
        **ports_and_paths,
    }
    conf = workdir / "nginx.conf"
    conf.write_text(render_template(workdir / "render", NGINX_TEMPLATE, variables))
    return conf


def proxies_or_exited(nginx: ManagedProcess, worker_port: int) -> bool:
    """Whether nginx has exited or answers ``/readyz`` from the orchestrator behind it. The answer must
    be nginx's (its ``Server`` header): a server of another test that holds the port answers too, while
    this nginx retries its bind for a few seconds and then exits."""
    if not nginx.alive():
        return True
    answer = httpx.get(f"http://127.0.0.1:{worker_port}/readyz", timeout=5)
    return answer.status_code == 200 and answer.headers.get("server") == "nginx"


def start_nginx(
    processes: ProcessRegistry, root: Path, *, upstream_port: int, tls_dir: Path | None = None, **extra: Any
) -> tuple[Path, int, int]:
    """Start nginx on free ports and wait until it proxies ``/readyz``; return its configuration and its
    HTTPS and worker ports. Started again on new ports when one was taken (:mod:`tests.support.ports`).
    ``extra`` are more template variables (``domain_name``, ``http_port``).
    """
    holders: list[str] = []
    for attempt in range(1, PORT_ATTEMPTS + 1):
        https_port, worker_port, spare_port = free_ports(3)
        conf = render_nginx(
            root,
            run_dir=str(root / "run"),
            https_port=https_port,
            worker_port=worker_port,
            http_port=extra.pop("http_port", None) or spare_port,
            upstream_port=upstream_port,
            tls_dir=str(tls_dir or root / "tls"),
            acme_dir=str(root / "acme"),
            **extra,
        )
        nginx = processes.start(
            f"nginx-{attempt}", [nginx_binary(), "-c", str(conf), "-e", "stderr", "-g", "daemon off;"]
        )

        wait_until(
            lambda n=nginx, port=worker_port: proxies_or_exited(n, port),
            30,
            message=lambda n=nginx: f"nginx up:\n{n.log()[-2000:]}",
        )
        if nginx.alive():
            return conf, https_port, worker_port
        if not port_was_taken(nginx.log()):
            pytest.fail(f"nginx exited at start:\n{nginx.log()[-2000:]}")
        holders.append(_holders((https_port, worker_port, spare_port)))
    pytest.fail(
        f"nginx found its ports taken {PORT_ATTEMPTS} times:\n{nginx.log()[-2000:]}\n"
        + "\n".join(f"attempt {n}, the sockets on its ports:\n{h}" for n, h in enumerate(holders, 1))
    )


def _holders(ports: tuple[int, ...]) -> str:
    """The sockets on ``ports`` and their processes (``ss``), for a failure message."""
    if shutil.which("ss") is None:
        return "(no ss on this machine)"
    wanted = " or ".join(f"sport = :{port}" for port in ports)
    shown = subprocess.run(["ss", "-Htanp", f"( {wanted} )"], capture_output=True, text=True, timeout=10)
    return shown.stdout.strip() or "(none left)"


@pytest.fixture(scope="module")
def front_door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    root = tmp_path_factory.mktemp("tls-proxy")
    processes = ProcessRegistry(root)
    try:
        cloud_init = yaml.safe_load(render_orchestrator_cloud_init(root / "cloud-init"))
        files = {f["path"]: f["content"] for f in cloud_init["write_files"]}
        script = root / "spotswarm-tls-self-signed"
        script.write_text(files["/usr/local/bin/spotswarm-tls-self-signed"])
        printed = make_certificate(script, root / "tls", "127.0.0.1", "localhost")
        fingerprint = re.search(r"Fingerprint=([0-9A-F:]+)", printed)
        assert fingerprint, printed

        orch = start_orchestrator(
            processes,
            root / "data",
            extra_env={
                **NO_RECONCILE,
                "SPOTSWARM_TLS_PROXY": "true",
                "SPOTSWARM_CHECK_IMPORTS": "false",
                "SPOTSWARM_TRUSTED_HOSTS": DOMAIN,  # as the Terraform module sets it with a domain_name
            },
            command_prefix=["prlimit", f"--nofile={ORCHESTRATOR_FILES}:{ORCHESTRATOR_FILES}", "--"],
        )
        (root / "run").mkdir()
        conf, https_port, worker_port = start_nginx(processes, root, upstream_port=orch.port)
        worker_url = f"http://127.0.0.1:{worker_port}"
        yield FrontDoor(
            orch,
            f"https://127.0.0.1:{https_port}",
            worker_url,
            root / "tls" / "cert.pem",
            fingerprint[1],
            script,
            conf,
        )
    finally:
        processes.kill_all()


# -- TLS ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_users_get_https_with_a_certificate_they_can_trust(front_door: FrontDoor, tmp_path: Path) -> None:
    with front_door.user() as http:
        assert http.get("/readyz").status_code == 200
        assert (
            http.get(
                api.runs(), headers={"Authorization": f"Bearer {front_door.orch.admin_token}"}
            ).status_code
            == 200
        )

    strict = front_door.tls()
    strict.verify_flags |= ssl.VERIFY_X509_STRICT  # Python 3.13's default; browsers are as strict
    with httpx.Client(base_url=front_door.https_url, verify=strict, timeout=10) as http:
        assert http.get("/readyz").status_code == 200

    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{front_door.https_url}/readyz", timeout=10)  # the usual authorities do not know it
    plain = httpx.get(front_door.https_url.replace("https://", "http://") + "/readyz", timeout=10)
    assert plain.status_code == 400, "no plain HTTP on the users' port"

    # What the docs tell users to do: fetch the certificate, compare its fingerprint, hand it to the CLI.
    port = front_door.https_url.rsplit(":", 1)[1]
    fetched = tmp_path / "orchestrator.pem"
    subprocess.run(
        f"openssl s_client -connect 127.0.0.1:{port} </dev/null 2>/dev/null | openssl x509 > {fetched}",
        shell=True, check=True, timeout=30,
    )  # fmt: skip
    shown = subprocess.run(["openssl", "x509", "-in", str(fetched), "-noout", "-fingerprint", "-sha256"],
                           capture_output=True, text=True, check=True, timeout=30).stdout  # fmt: skip
    assert shown.strip().endswith(front_door.fingerprint)
    cli = [str(VENV_BIN / "spotswarm"), "runs", "list", "--url", front_door.https_url,
           "--token", front_door.orch.admin_token]  # fmt: skip
    env = {**os.environ, "SPOTSWARM_CONFIG": str(tmp_path / "no-config.toml")}
    env.pop("SPOTSWARM_CA_CERT", None)
    trusted = subprocess.run(
        [*cli, "--ca-cert", str(fetched)], capture_output=True, text=True, timeout=60, env=env
    )
    assert trusted.returncode == 0 and trusted.stdout == "(no runs)\n", trusted.stderr
    from_env = subprocess.run(cli, capture_output=True, text=True, timeout=60,
                              env={**env, "SPOTSWARM_CA_CERT": str(fetched)})  # fmt: skip
    assert from_env.returncode == 0, from_env.stderr
    untrusted = subprocess.run(cli, capture_output=True, text=True, timeout=60, env=env)
    assert untrusted.returncode == 3 and "--ca-cert" in untrusted.stderr, untrusted.stderr
    assert len(untrusted.stderr.strip().splitlines()) == 1


@pytest.mark.timeout(120)
def test_the_certificate_script_keeps_a_good_certificate_and_replaces_one_for_other_addresses(
    front_door: FrontDoor, tmp_path: Path
) -> None:
    first = make_certificate(front_door.self_signed_script, tmp_path, "127.0.0.1", "localhost")
    again = make_certificate(front_door.self_signed_script, tmp_path, "127.0.0.1", "localhost")
    moved = make_certificate(front_door.self_signed_script, tmp_path, "203.0.113.9", "10.0.0.5")

    assert "new self-signed certificate" in first
    assert (
        "new self-signed" not in again
        and again.splitlines()[-1].split("(")[0] == first.splitlines()[-1].split("(")[0]
    )
    assert "new self-signed certificate for 203.0.113.9 10.0.0.5" in moved
    text = subprocess.run(["openssl", "x509", "-in", str(tmp_path / "cert.pem"), "-noout", "-text"],
                          capture_output=True, text=True, check=True, timeout=30).stdout  # fmt: skip
    assert "IP Address:203.0.113.9, IP Address:10.0.0.5" in text
    assert oct((tmp_path / "key.pem").stat().st_mode & 0o777) == "0o600"


@pytest.mark.timeout(120)
def test_the_shipped_configuration_with_a_domain_is_valid_nginx(
    front_door: FrontDoor, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    https_port, worker_port, http_port = free_ports(3)
    conf = render_nginx(
        tmp_path,
        run_dir=str(run_dir),
        https_port=https_port,
        worker_port=worker_port,
        http_port=http_port,
        upstream_port=front_door.orch.port,
        tls_dir=str(front_door.ca_cert.parent),
        acme_dir=str(tmp_path / "acme"),
        domain_name="spotswarm.example.com",
    )
    checked = subprocess.run([nginx_binary(), "-t", "-c", str(conf), "-e", "stderr"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    assert checked.returncode == 0 and "test is successful" in checked.stderr, checked.stderr
    assert "/.well-known/acme-challenge/" in conf.read_text()


# -- which hosts, what size, which headers --------------------------------------------------------------


def answered(url: str, host: str, **kwargs: Any) -> int | None:
    """The status of ``GET url`` sent with ``Host: host``; None when the connection closed unanswered."""
    try:
        return httpx.get(url, headers={"Host": host}, timeout=10, **kwargs).status_code
    except (httpx.RemoteProtocolError, httpx.ReadError):  # nginx's 444: closed (or reset), no word
        return None


@pytest.mark.timeout(120)
def test_a_request_naming_another_host_gets_no_answer_through_the_proxy(
    front_door: FrontDoor, processes: ProcessRegistry, tmp_path: Path
) -> None:
    """DNS rebinding: a page on a name made to resolve to the orchestrator sends that name as Host."""
    tls = {"verify": front_door.tls()}
    for url, options in ((front_door.https_url, tls), (front_door.worker_url, {})):
        port = url.rsplit(":", 1)[1]
        assert answered(f"{url}/api/v1/runs", f"rebind.attacker.example:{port}", **options) is None
        assert answered(f"{url}/api/v1/runs", f"127.0.0.1:{port}", **options) == 200
        assert answered(f"{url}/api/v1/runs", f"localhost:{port}", **options) == 200
        assert answered(f"{url}/api/v1/runs", f"10.0.3.7:{port}", **options) == 200  # a private address

    # With a domain: its name is served (by the orchestrator too: Terraform names it a trusted host),
    # plain HTTP on port 80's stand-in sends it to HTTPS on that name, and another name gets nothing.
    (tmp_path / "run").mkdir()
    http_port = free_port()
    tls_dir = front_door.ca_cert.parent
    _, https_port, _ = start_nginx(
        processes,
        tmp_path,
        upstream_port=front_door.orch.port,
        tls_dir=tls_dir,
        domain_name=DOMAIN,
        http_port=http_port,
    )
    https = f"https://127.0.0.1:{https_port}"
    assert answered(f"{https}/api/v1/runs", DOMAIN, **tls) == 200
    assert answered(f"{https}/api/v1/runs", "rebind.attacker.example", **tls) is None
    moved = httpx.get(f"http://127.0.0.1:{http_port}/api/v1/runs", headers={"Host": DOMAIN}, timeout=10)
    assert moved.status_code == 301 and moved.headers["location"] == f"https://{DOMAIN}/api/v1/runs"
    assert answered(f"http://127.0.0.1:{http_port}/api/v1/runs", "rebind.attacker.example") is None


@pytest.mark.timeout(120)
def test_users_get_hsts_over_https_and_workers_plain_http_without(front_door: FrontDoor) -> None:
    with front_door.user() as http:
        hsts = http.get("/readyz").headers.get("strict-transport-security")
    assert hsts == "max-age=31536000"
    assert "strict-transport-security" not in httpx.get(f"{front_door.worker_url}/readyz").headers


@pytest.mark.timeout(120)
def test_a_code_package_over_the_json_limit_uploads_through_the_proxy(front_door: FrontDoor) -> None:
    # A package of 3 MiB (nginx's JSON limit is 2 MiB), uploaded as `runs create --workdir` does.
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        payload = os.urandom(3 << 20)  # does not compress
        member = tarfile.TarInfo("project/weights.bin")
        member.size = len(payload)
        archive.addfile(member, io.BytesIO(payload))
    body = buffer.getvalue()
    assert len(body) > 3 << 20
    digest = hashlib.sha256(body).hexdigest()
    admin = {"Authorization": f"Bearer {front_door.orch.admin_token}"}
    with front_door.user(headers=admin) as http:
        stored = http.put(api.package(digest), content=body)
    assert stored.status_code == 201, stored.text
    assert stored.json()["size_bytes"] == len(body)


# -- one client cannot starve the others ---------------------------------------------------------------


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other side has closed ``sock`` (whatever it sent first is read and dropped)."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset: nginx's reset_timedout_connection
        return True


def open_files(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


@dataclass
class Worker:
    worker_id: str
    token: str


def register_worker(front_door: FrontDoor, run: str) -> Worker:
    """A run and a worker registered with its join token, over the workers' plain-HTTP port."""
    with front_door.user(headers={"Authorization": f"Bearer {front_door.orch.admin_token}"}) as http:
        created = http.post(api.runs(), json=run_spec(run, desired_workers=0))
    assert created.status_code == 201, created.text
    join = {"Authorization": f"Bearer {created.json()['join_token']}"}
    joined = httpx.post(f"{front_door.worker_url}/api/v1/workers/register", json={"hostname": "w1"},
                        headers=join, timeout=10)  # fmt: skip
    assert joined.status_code == 200, joined.text
    return Worker(joined.json()["worker_id"], joined.json()["worker_token"])


def heartbeat_answered(front_door: FrontDoor, worker: Worker) -> float:
    """Send one heartbeat through the proxy; return how long its 200 took."""
    started = time.monotonic()
    response = httpx.post(f"{front_door.worker_url}/api/v1/workers/{worker.worker_id}/heartbeat", json={},
                          headers={"Authorization": f"Bearer {worker.token}"}, timeout=5)  # fmt: skip
    assert response.status_code == 200, response.text
    return time.monotonic() - started


@pytest.mark.timeout(240)
def test_a_slowloris_flood_through_the_proxy_neither_reaches_the_orchestrator_nor_stops_heartbeats(
    front_door: FrontDoor,
) -> None:
    worker = register_worker(front_door, "flooded")
    https_port = int(front_door.https_url.rsplit(":", 1)[1])
    worker_port = int(front_door.worker_url.rsplit(":", 1)[1])
    files_before = open_files(front_door.orch.proc.pid)

    # 3,000 connections from one client: 2,000 HTTP requests whose header never ends on the workers'
    # port, 1,000 TLS connections that never say hello on the users' port. Straight at the
    # orchestrator, a third of that exhausts its 1,024 file descriptors (last test).
    flood = open_half_requests(worker_port, 2000, b"GET /api/v1/runs HTTP/1.1\r\nHost: x\r\n")
    try:
        flood += open_half_requests(https_port, 1000, b"")
        opened_at = time.monotonic()
        slowest = max(heartbeat_answered(front_door, worker) for _ in range(5))
        with front_door.user() as http:
            assert http.get("/readyz").status_code == 200
        assert slowest < 2.0, f"a heartbeat took {slowest:.1f} s during the flood"
        assert open_files(front_door.orch.proc.pid) < files_before + 40, (
            "nothing half-sent reached the orchestrator"
        )

        # nginx drops every connection whose header (or TLS hello) did not arrive within the timeout.
        wait_until(lambda: all(closed_by_peer(s) for s in flood), HEADER_TIMEOUT_S + 20,
                   message="the proxy closed every half-open connection")  # fmt: skip
        assert time.monotonic() - opened_at >= HEADER_TIMEOUT_S - 1, "not before the header timeout"
    finally:
        close_all(flood)
    heartbeat_answered(front_door, worker)


@pytest.mark.timeout(120)
def test_one_client_gets_429_beyond_its_share_while_others_are_served(front_door: FrontDoor) -> None:
    limit = module_default("proxy_max_connections_per_client")
    worker = register_worker(front_door, "greedy")
    worker_port = int(front_door.worker_url.rsplit(":", 1)[1])
    # Requests whose header is complete but whose body never comes: each holds one of the client's slots.
    holding = b"POST /api/v1/workers/register HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n"
    greedy = open_half_requests(worker_port, limit + 8, holding)
    replies: dict[int, bytes] = {}

    def refusals() -> int:
        for index, sock in enumerate(greedy):
            if index not in replies:
                try:
                    replies[index] = sock.recv(65536)
                except BlockingIOError:
                    continue
        return len(replies)

    try:
        wait_until(lambda: refusals() >= 8, 10, message="the requests beyond the client's share refused")
        assert len(replies) == 8, replies
        assert all(reply.startswith(b"HTTP/1.1 429 ") for reply in replies.values()), replies
        assert heartbeat_answered(front_door, worker) < 2.0, "another client is served meanwhile"
    finally:
        close_all(greedy)
    released = httpx.Client(transport=httpx.HTTPTransport(local_address=ATTACKER), timeout=10)
    with released:
        wait_until(lambda: released.get(f"{front_door.worker_url}/readyz").status_code == 200, 20,
                   message="the client's slots are free again once it lets go")  # fmt: skip


@pytest.mark.timeout(120)
def test_without_the_proxy_the_same_kind_of_flood_takes_every_file_descriptor_of_the_orchestrator(
    front_door: FrontDoor,
) -> None:
    """The contrast (last: it leaves the orchestrator damaged). Through the proxy, 3,000 half-open
    connections left the orchestrator's open files where they were; straight at it, a third of that
    holds all it may open, and then whatever it needs a descriptor for fails."""
    pid = front_door.orch.proc.pid
    flood = open_half_requests(front_door.orch.port, ORCHESTRATOR_FILES + 100,
                               b"GET /api/v1/runs HTTP/1.1\r\nHost: x\r\n")  # fmt: skip
    try:
        # At the limit, every accept fails and frees nothing; a slot freed now and then is taken at once.
        wait_until(lambda: open_files(pid) >= ORCHESTRATOR_FILES - 4, 30,
                   message=f"all {ORCHESTRATOR_FILES} descriptors taken")  # fmt: skip
    finally:
        close_all(flood)
