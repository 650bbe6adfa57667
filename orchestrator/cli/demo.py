"""``spotswarm demo``: the orchestrator with a local run of the digits example, until Ctrl-C.

It is ``spotswarm serve`` with demo defaults (SQLite in ``data/demo``, short heartbeats, the local
launcher) plus a client that creates (or resumes) the run ``digits-demo`` through the REST API, prints
where to look, and reports progress every few seconds. Ctrl-C stops the run (its workers leave the
swarm and deregister), then the server.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import click
import httpx
import uvicorn

from orchestrator.cli.command import EXIT_INTERRUPTED
from orchestrator.cli.stopping import StoppingServer
from orchestrator.domain.states import FINISHED_RUN_STATES, RunState
from worker.protocol.paths import API_PREFIX, ApiPath

DEMO_RUN = "digits-demo"
STOP_WAIT_S = 60.0


def demo_spec(workers: int) -> dict[str, Any]:
    """The demo run: digits on 2 CPU workers, in the sync mode new runs get (DiLoCo: it names none).

    Rounds every 10 s, a few hundred steps of each worker, so the page counts a round every 10 s and a
    round's cost (about a second with the short hivemind timeouts of a one-machine swarm) stays a small
    share of the time; a checkpoint every 6 rounds, one a minute."""
    return {
        "name": DEMO_RUN,
        "module": "worker.examples.digits:DigitsModule",
        "module_args": {"hidden": 64, "lr": 0.05},
        "datamodule": "worker.examples.digits:DigitsDataModule",
        "target_batch_size": 16384,
        "batch_size": 32,
        "strategy_options": {"matchmaking_time": 1.0, "averaging_timeout": 10.0, "sync_every_s": 10.0},
        "min_workers": 0,
        "max_workers": max(8, workers),
        "desired_workers": workers,
        "checkpoint_every_epochs": 6,
        "keep_checkpoints": 3,
        "launcher": "local",
    }


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@click.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("data/demo"), show_default=True)
@click.option("--port", type=int, default=8000, show_default=True, help="HTTP port of the orchestrator.")
@click.option("--dht-port", type=int, default=31337, show_default=True, help="TCP port of its DHT peer.")
@click.option("--workers", type=click.IntRange(1, 8), default=2, show_default=True)
def demo(data_dir: Path, port: int, dht_port: int, workers: int) -> None:
    """Run the orchestrator with a local demo run of the digits example (Ctrl-C stops everything)."""
    from orchestrator.app import create_app
    from orchestrator.cli.serve import (
        _configure_logging,
        build_settings,
        keep_new_files_private,
        stop_stale_dht_peer,
    )
    from orchestrator.config import ensure_admin_token

    # as flags would give them: what the environment sets beside these still counts
    settings = build_settings(
        {
            "host": "127.0.0.1",
            "port": port,
            "data_dir": data_dir,
            "dht_port": dht_port,
            "dht_host_maddrs": [f"/ip4/127.0.0.1/tcp/{dht_port}"],
            "heartbeat_interval_s": 2.0,
            "heartbeat_timeout_s": 30.0,
            "dht_refresh_interval_s": 2.0,
            "progress_sample_interval_s": 2.0,
            "log_level": "warning",
        }
    )
    _configure_logging(settings)
    keep_new_files_private()
    stop_stale_dht_peer(settings)  # a crashed demo's peer would hold the DHT port
    for what, number in (("--port", port), ("--dht-port", dht_port)):
        if not _port_free("127.0.0.1", number):
            raise click.ClickException(f"port {number} is in use; pick another with {what}")
    admin_token, _ = ensure_admin_token(settings)
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {admin_token}"}
    client = httpx.Client(base_url=base + API_PREFIX, headers=auth, timeout=30)  # the API's paths: ApiPath
    config = uvicorn.Config(
        create_app(settings), host=settings.host, port=port, log_level="warning", lifespan="on"
    )
    server = _DemoServer(config, settings.shutdown_grace_s, on_exit=lambda: _stop_run(client))
    driver = threading.Thread(
        target=_drive,
        args=(server, client, base, admin_token, settings.data_dir, workers),
        name="demo",
        daemon=True,
    )
    driver.start()
    try:
        server.run()  # in the main thread: uvicorn handles Ctrl-C and SIGTERM (see _DemoServer)
    finally:
        client.close()
    if not server.started:
        raise click.ClickException("the orchestrator failed to start; see the log above")
    click.echo("stopped.")


class _DemoServer(StoppingServer):
    """The server of the demo: the first Ctrl-C stops the demo run (workers leave cleanly), then the
    server; a second Ctrl-C kills everything at once, workers included (see orchestrator/cli/stopping.py).
    """

    def __init__(self, config: uvicorn.Config, shutdown_grace_s: float, on_exit: Callable[[], None]) -> None:
        super().__init__(config, shutdown_grace_s, include_workers=True)
        self.on_exit = on_exit
        self.stopping = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stopping or self.should_exit or not self.started:
            if sig == signal.SIGINT and self.stopping:
                self.exit_now("a second Ctrl-C", EXIT_INTERRUPTED)
            super().handle_exit(sig, frame)
            return
        self.stopping = True
        self.arm_deadline(STOP_WAIT_S + self.shutdown_grace_s)
        click.echo("\nstopping the demo run (workers leave the swarm; Ctrl-C again to force)...")
        threading.Thread(target=self._stop_then_exit, name="demo-stop", daemon=True).start()

    def _stop_then_exit(self) -> None:
        self.on_exit()
        self.should_exit = True


def _drive(
    server: Any, client: httpx.Client, base: str, admin_token: str, data_dir: Path, workers: int
) -> None:
    """Create or resume the demo run once the server is up, then print progress until it stops.

    ``base`` is the server's root (the page, the docs and the CLI's URL), not the API client's base URL,
    which ends in the API's prefix."""
    try:
        _wait_ready(server)
        _ensure_run(client, workers)
        _banner(base, client, admin_token, data_dir)
        _follow(client, server)
    except click.ClickException as exc:
        click.echo(f"error: {exc.message}", err=True)
        server.should_exit = True
    except httpx.HTTPError as exc:
        click.echo(f"error: the orchestrator did not answer: {exc!r}", err=True)
        server.should_exit = True


def _wait_ready(server: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if server.should_exit:
            raise click.ClickException("the orchestrator failed to start; see the log above")
        if time.monotonic() > deadline:
            raise click.ClickException(f"the orchestrator did not start within {timeout_s:.0f} s")
        time.sleep(0.1)


def _ensure_run(client: httpx.Client, workers: int) -> None:
    """Create the demo run, or resume it (and set its worker count) when it exists from a last demo."""
    # The first create imports the example in a probe process: allow for a slow, busy machine.
    response = client.post(ApiPath.runs, json=demo_spec(workers), timeout=180)
    if response.status_code == 201:
        return
    if response.status_code != 409:
        raise click.ClickException(f"creating the demo run failed: {response.status_code} {response.text}")
    run_path = ApiPath.run.format(name=DEMO_RUN)
    state = RunState(client.get(run_path).json()["state"])
    if state in FINISHED_RUN_STATES:
        if state == RunState.completed:
            client.delete(run_path).raise_for_status()
            client.post(ApiPath.runs, json=demo_spec(workers)).raise_for_status()
            return
        client.post(ApiPath.run_resume.format(name=DEMO_RUN)).raise_for_status()
    client.post(ApiPath.run_scale.format(name=DEMO_RUN), json={"desired_workers": workers})


def _banner(base: str, client: httpx.Client, admin_token: str, data_dir: Path) -> None:
    peers = client.get(ApiPath.peers).json().get("initial_peers", [])
    click.echo(
        f"\nspotswarm demo is running: run '{DEMO_RUN}', digits on local workers\n"
        f"  status page : {base}/\n"
        f"  run page    : {base}/runs/{DEMO_RUN}\n"
        f"  API docs    : {base}/docs\n"
        f"  admin token : {token_shown(admin_token, data_dir / 'admin_token', sys.stdout.isatty())}\n"
        f"  CLI         : SPOTSWARM_URL={base} SPOTSWARM_TOKEN=<admin token> spotswarm runs show {DEMO_RUN}\n"
        f"  peers       : INITIAL_PEERS={','.join(peers)}\n"
        f"  data        : {data_dir}/ (SQLite, checkpoints, worker logs in workers/)\n"
        "Press Ctrl-C to stop.\n"
    )


def token_shown(admin_token: str, path: Path, on_terminal: bool) -> str:
    """The banner's admin-token line: the token itself only on a terminal (someone is looking at it),
    else where to read it (output sent to a file or a log keeps no secret)."""
    use = "for the page's scale/stop buttons and the CLI"
    return f"{admin_token}  ({use})" if on_terminal else f"in {path} ({use}: cat {path})"


def _follow(client: httpx.Client, server: Any, every_s: float = 5.0) -> None:
    """Print one progress line every few seconds until Ctrl-C or SIGTERM."""
    first_loss: float | None = None
    while True:
        deadline = time.monotonic() + every_s
        while time.monotonic() < deadline:
            if server.stopping or server.should_exit:
                return
            time.sleep(0.2)
        try:
            response = client.get(ApiPath.run.format(name=DEMO_RUN))
            response.raise_for_status()
            run = response.json()
        except httpx.HTTPError as exc:
            click.echo(f"  (status unavailable: {exc})")
            continue
        reported, counts = run["reported"], run["workers"]
        loss = reported.get("loss")
        if loss is not None and first_loss is None:
            first_loss = loss
        loss_text = (
            "-" if loss is None else f"{loss:.3f}" + (f" (from {first_loss:.3f})" if first_loss else "")
        )
        epoch = "round" if run.get("sync") == "diloco" else "swarm epoch"  # a DiLoCo epoch is a round
        click.echo(
            f"  {time.strftime('%H:%M:%S')} {run['state']:<9} workers {counts['running']}/{counts['desired']}"
            f"  {epoch} {reported['swarm_epoch']:<5} loss {loss_text:<22}"
            f" {reported['samples_per_s']:.0f} samples/s"
        )


def _stop_run(client: httpx.Client) -> None:
    """Stop the demo run and wait (bounded) until its workers have left."""
    try:
        client.post(ApiPath.run_stop.format(name=DEMO_RUN), json={"reason": "demo ended (Ctrl-C)"})
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            response = client.get(ApiPath.run.format(name=DEMO_RUN))
            if response.is_success and RunState(response.json()["state"]) in FINISHED_RUN_STATES:
                return
            time.sleep(0.5)
        click.echo(f"  workers did not all leave within {STOP_WAIT_S:.0f} s; stopping anyway")
    except httpx.HTTPError as exc:
        click.echo(f"  could not stop the run cleanly: {exc}")
