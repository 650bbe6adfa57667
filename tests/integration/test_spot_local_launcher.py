"""The local launcher in a simulated spot market, with real subprocesses: a tiny worker that watches its
metadata with the agent's own spot watcher (``worker/agent/spot.py``) stands in for the agent. The market
follows a trace the test appends to, so each event comes when the test is ready for it."""

from __future__ import annotations

import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.launchers.base import LaunchRequest
from orchestrator.launchers.local import LocalLauncher
from orchestrator.launchers.spot_local import SpotMarketLauncher
from orchestrator.launchers.spot_market import SpotMarket, SpotMarketSettings
from tests.support.waiting import wait_until

REPO = Path(__file__).parents[2]
NOTICED_WORKER = textwrap.dedent(
    """
    import os, threading
    from worker.agent.spot import SpotWatcher
    leave = threading.Event()
    def on_notice(notice):
        with open(os.path.join(os.environ["SPOTSWARM_WORKER_DIR"], "notice"), "w") as f:
            f.write(notice.time)
        if os.environ["FAKE_MODE"] == "leave":
            leave.set()
    SpotWatcher(on_notice, metadata_url=os.environ["SPOTSWARM_METADATA_URL"], poll_interval_s=0.2).start()
    print("fake worker up", flush=True)
    leave.wait(600)
    """
)


class Market:
    """A launcher in a market whose trace the test writes; every worker is killed at the end."""

    def __init__(self, tmp_path: Path, **settings: object) -> None:
        script = tmp_path / "noticed_worker.py"
        script.write_text(NOTICED_WORKER)
        self.trace = tmp_path / "trace.jsonl"
        self.trace.write_text('[0, "add", {"nodes": ["a", "b"]}]\n')
        self.settings = SpotMarketSettings(slots=2, trace=self.trace, follow=True, **settings)  # type: ignore[arg-type]
        self.data_dir = tmp_path / "data"
        local = LocalLauncher(self.data_dir, [sys.executable, str(script)], cwd=REPO, grace_s=2.0)
        self.launcher = SpotMarketLauncher(local, SpotMarket(self.settings, time.time), time.time)
        self.local = local

    def event(self, kind: str, *nodes: str) -> None:
        with self.trace.open("a") as out:
            out.write(f'[0, "{kind}", {{"nodes": {list(nodes)!r}}}]\n'.replace("'", '"'))

    def launch(self, request_id: str, mode: str = "leave") -> str:
        env = {"FAKE_MODE": mode, "SPOTSWARM_REQUEST_ID": request_id}
        return self.launcher.launch(LaunchRequest(request_id, "demo", env))

    def alive(self) -> set[str]:
        return {i.request_id for i in self.launcher.describe() if i.alive}

    def up(self, request_id: str) -> bool:
        log = self.data_dir / "workers" / f"{request_id}.log"
        return log.exists() and "fake worker up" in log.read_text()

    def noticed(self, request_id: str) -> bool:
        self.launcher.describe()  # the market steps when the launcher is looked at, as the loop does
        return (self.data_dir / "workers" / request_id / "notice").exists()

    def close(self) -> None:
        for request_id in self.alive():
            self.local.kill(request_id)
        wait_until(lambda: not self.alive(), 30, message="every worker is gone")
        self.launcher.close()


@pytest.fixture
def market_of(tmp_path: Path) -> Iterator[Callable[..., Market]]:
    made: list[Market] = []

    def make(**settings: object) -> Market:
        market = Market(tmp_path, **settings)
        made.append(market)
        return market

    yield make
    for market in made:
        market.close()


@pytest.mark.timeout(120)
def test_a_full_market_refuses_a_shrinking_one_notices_a_drawn_worker_and_a_growing_one_launches(
    market_of: Callable[..., Market],
) -> None:
    market = market_of(seed=11, compress=60.0)  # a 2 s notice
    assert market.launch("w1") and market.launch("w2")
    assert market.launch("w3") == ""
    [refused] = market.launcher.poll_errors()
    assert refused.request_id == "w3" and refused.retryable
    assert "InsufficientInstanceCapacity" in refused.reason
    assert refused.capacity, "a capacity failure, as EC2's"
    wait_until(lambda: market.up("w1") and market.up("w2"), 60, message="both workers run")

    market.event("remove", "a")
    [victim] = SpotMarket(market.settings, time.time).draw(["w1", "w2"], 1)  # the seed decides
    wait_until(lambda: market.alive() == {"w1", "w2"} - {victim}, 30, message="the drawn worker leaves")
    assert market.noticed(victim) and not market.noticed(({"w1", "w2"} - {victim}).pop())
    assert market.launcher.poll_errors() == []  # it left by itself: no failure
    [gone] = [i for i in market.launcher.describe() if i.request_id == victim]
    assert gone.details["interrupted"] is True and gone.details["exit_code"] == 0
    assert market.launch("w4") == ""  # one slot, taken

    market.event("add", "c")
    market.launcher.poll_errors()
    assert market.launch("w5")
    wait_until(lambda: market.up("w5"), 60, message="the worker on the slot given back runs")


@pytest.mark.timeout(120)
def test_a_worker_that_outstays_its_notice_is_terminated(market_of: Callable[..., Market]) -> None:
    market = market_of(compress=60.0)  # a 2 s notice
    assert market.launch("w1", mode="stay")
    wait_until(lambda: market.up("w1"), 60, message="the worker runs")
    market.event("remove", "a", "b")
    wait_until(lambda: market.noticed("w1"), 30, message="the notice reaches it")
    wait_until(lambda: not market.alive(), 30, message="it is terminated when the notice ends")
    assert market.launcher.poll_errors() == []  # a termination the launcher asked for


@pytest.mark.timeout(120)
def test_a_kill_share_of_one_kills_without_notice(market_of: Callable[..., Market]) -> None:
    market = market_of(kill_share=1.0)
    assert market.launch("w1")
    wait_until(lambda: market.up("w1"), 60, message="the worker runs")
    market.event("remove", "a", "b")
    wait_until(lambda: not market.alive(), 30, message="the worker is killed")
    [failure] = wait_until(market.launcher.poll_errors, 10, message="the death is reported")
    assert not failure.capacity, "a worker that died is no capacity refusal"
    assert "SIGKILL" in failure.reason
    assert not market.noticed("w1")
