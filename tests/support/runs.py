"""Shared pieces of the end-to-end run tests: an orchestrator with the reconcile loop on, the digits run,
and small readers of the API that the tests wait on."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Container, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.support import api
from tests.support.orchestrator import LOOP_ENV, Orchestrator, start_orchestrator
from tests.support.processes import ProcessRegistry


def start_loop_orchestrator(
    processes: ProcessRegistry, data_dir: Path, extra_env: dict[str, str] | None = None, **kwargs: Any
) -> Orchestrator:
    """A real `spotswarm serve` with the reconcile loop and the local launcher."""
    return start_orchestrator(processes, data_dir, extra_env={**LOOP_ENV, **(extra_env or {})}, **kwargs)


#: the short hivemind timeouts of a one-machine swarm
_ONE_MACHINE = {"matchmaking_time": 1.0, "averaging_timeout": 10.0}
#: Strategy options of the tests' runs: the sync mode new runs get (none named: DiLoCo), with rounds every
#: 2 s so that a test sees rounds within seconds. Swarm admission stays at its default (on): the
#: configuration users get.
ROUNDS = {**_ONE_MACHINE, "sync_every_s": 2.0}
#: The same for the tests of hivemind's gradient averaging (``sync: gradients``), whose swarm epoch is a
#: run's ``target_batch_size`` samples.
GRADIENTS = {"sync": "gradients", **_ONE_MACHINE}
#: the tests' digits model (:mod:`tests.support.paced_digits`)
PACED_DIGITS = "tests.support.paced_digits:PacedDigitsModule"


def digits_run(name: str, **overrides: Any) -> dict[str, Any]:
    """A run of the digits example sized for two CPU workers on a busy 2-core machine, at a steady pace
    (:mod:`tests.support.paced_digits`: its steps leave the CPU to the other tests), in the default sync
    mode (:data:`ROUNDS`)."""
    spec: dict[str, Any] = {
        "name": name,
        "module": PACED_DIGITS,
        "module_args": {"hidden": 32, "lr": 0.05},
        "datamodule": "worker.examples.digits:DigitsDataModule",
        "target_batch_size": 128,
        "batch_size": 32,
        "strategy_options": dict(ROUNDS),
        "min_workers": 0,
        "max_workers": 4,
        "desired_workers": 2,
        "checkpoint_every_epochs": 2,
        "keep_checkpoints": 3,
        # hand-started agents of some tests checkpoint in place of launched workers
        "hand_joined_checkpoint": True,
    }
    spec.update(overrides)
    return spec


class RunReader:
    """Reads one run through the API (no admin rights needed: reads are public by default)."""

    def __init__(self, orch: Orchestrator, name: str) -> None:
        self.orch = orch
        self.name = name

    def get(self, path: str) -> Any:
        """``GET /api/v1/runs/<name><path>``, its JSON."""
        with self.orch.client(timeout_s=15) as http:
            response = http.get(f"/api/v1/runs/{self.name}{path}")
            response.raise_for_status()
            return response.json()

    def run(self) -> dict[str, Any]:
        return self.get("")  # type: ignore[no-any-return]

    def admin_post(self, path: str) -> None:
        with self.orch.admin() as http:
            http.post(f"/api/v1/runs/{self.name}{path}", json={}, timeout=60).raise_for_status()

    def worker_log(self, worker_id: str | int) -> str:
        """The tail of a worker's log (an admin read, as `spotswarm runs logs NAME --worker ID` does)."""
        with self.orch.admin() as http:
            response = http.get(api.run_worker_log(self.name, worker_id))
            response.raise_for_status()
            return str(response.json()["text"])

    def workers(self) -> list[dict[str, Any]]:
        return list(self.get("/workers?limit=500")["items"])

    def running(self) -> list[dict[str, Any]]:
        return [w for w in self.workers() if w["state"] == "running" and w["registered_at"]]

    def events(self) -> list[dict[str, Any]]:
        return list(self.get("/events?limit=1000")["items"])

    def checkpoints(self) -> list[dict[str, Any]]:
        return list(self.get("/checkpoints")["items"])

    def epoch(self) -> int:
        return int(self.run()["reported"]["swarm_epoch"])


def admin_post(orch: Orchestrator, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    with orch.admin() as http:
        response = http.post(path, json=body or {}, timeout=180)
    response.raise_for_status()
    return response


def run_names(orch: Orchestrator) -> set[str]:
    """The names of every run on ``orch``."""
    with orch.client(timeout_s=15) as http:
        items = http.get(api.runs(), params={"limit": 500}).raise_for_status().json()["items"]
    return {str(run["name"]) for run in items}


def stop_runs(orch: Orchestrator, names: Iterable[str]) -> None:
    """Stop each of ``names`` that is still active (a stop of an ended run is refused; that is fine)."""
    with orch.admin() as http:
        for name in names:
            http.post(api.run_stop(name), json={}, timeout=60)


@contextlib.contextmanager
def runs_stopped_after(orch: Orchestrator) -> Iterator[Orchestrator]:
    """``orch`` for one test of several that share it: the runs the test made are stopped when it ends
    and their local workers killed, so the next test shares nothing live (run names must differ between
    the tests: a stopped run keeps its name)."""
    before = run_names(orch)
    try:
        yield orch
    finally:
        made = run_names(orch) - before
        stop_runs(orch, made)
        kill_local_workers(orch.data_dir, made)


def kill_worker(worker: dict[str, Any]) -> None:
    """``kill -9`` a local worker's whole process group (its handle is the group leader's PID)."""
    pid = int(worker["launcher_handle"])
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def kill_local_workers(data_dir: Path, runs: Container[str] | None = None) -> None:
    """Kill (by PID, group-wise) every worker the local launcher started under ``data_dir`` (only those
    of ``runs``, if given, and not yet seen gone).

    Workers run in their own sessions so that they outlive an orchestrator restart; a test therefore
    kills them itself, from the launcher's state files, when it ends.
    """
    import json

    for state in (data_dir / "launcher-local").glob("*.json"):
        try:
            record = json.loads(state.read_text())
        except (OSError, ValueError):
            continue
        pid = record.get("pid")
        if runs is not None and (record.get("run_name") not in runs or record.get("gone_at") is not None):
            continue
        if pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(pid), signal.SIGKILL)
