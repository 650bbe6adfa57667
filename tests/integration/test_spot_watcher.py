"""SpotWatcher against a fake instance metadata service (IMDSv2 rules) served on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.support.imds import FakeImds, serving_imds
from tests.support.ports import free_port
from tests.support.waiting import wait_until
from worker.agent.spot import SpotNotice, SpotWatcher
from worker.protocol.imds import (
    METADATA_URL_ENV,
)


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    with serving_imds() as server:
        yield server


@pytest.fixture
def short_token_imds() -> Iterator[FakeImds]:
    """Tokens live 0.3 s whatever the client asks: the watcher must notice and renew."""
    with serving_imds(max_token_lifetime_s=0.3) as server:
        yield server


class Recorder:
    def __init__(self) -> None:
        self.notices: list[tuple[float, SpotNotice]] = []

    def __call__(self, notice: SpotNotice) -> None:
        self.notices.append((time.monotonic(), notice))


@pytest.mark.timeout(30)
def test_interruption_notice_fires_once_within_the_poll_interval(imds: FakeImds) -> None:
    got = Recorder()
    watcher = SpotWatcher(got, metadata_url=imds.url, poll_interval_s=0.2)
    watcher.start()
    try:
        wait_until(lambda: imds.action_polls >= 3, timeout_s=10, message="watcher polls instance-action")
        assert got.notices == [], "404 means no notice"

        issued_at = time.monotonic()
        imds.instance_action = {"action": "terminate", "time": "2030-01-02T03:04:05Z"}
        wait_until(lambda: got.notices, timeout_s=10, message="callback after the notice")

        [(fired_at, notice)] = got.notices
        assert notice == SpotNotice("interruption", "terminate", "2030-01-02T03:04:05Z")
        assert fired_at - issued_at < 0.2 + 1.0, "fires within one poll interval (plus request time)"
        wait_until(lambda: not watcher.running, timeout_s=5, message="watcher ends after the notice")
        assert len(got.notices) == 1 and watcher.interruption == notice
        assert imds.refused == 0
    finally:
        watcher.stop()


@pytest.mark.timeout(30)
def test_expired_token_is_replaced_and_the_notice_still_arrives(short_token_imds: FakeImds) -> None:
    imds = short_token_imds
    got = Recorder()
    watcher = SpotWatcher(got, metadata_url=imds.url, poll_interval_s=0.1)
    watcher.start()
    try:
        wait_until(
            lambda: imds.refused >= 2 and len(imds.tokens) >= 3, timeout_s=15, message="token renewals"
        )
        assert got.notices == [] and watcher.running

        imds.instance_action = {"action": "stop", "time": "2030-01-02T03:04:05Z"}
        wait_until(lambda: got.notices, timeout_s=10, message="notice after token renewals")
        assert got.notices[0][1].action == "stop"
    finally:
        watcher.stop()


@pytest.mark.timeout(30)
def test_short_lived_tokens_are_renewed_before_they_expire(imds: FakeImds) -> None:
    watcher = SpotWatcher(Recorder(), metadata_url=imds.url, poll_interval_s=0.1, token_ttl_s=1)
    watcher.start()
    try:
        wait_until(lambda: len(imds.tokens) >= 3, timeout_s=15, message="proactive token renewals")
        assert imds.refused == 0, "a token is replaced before EC2 would refuse it"
    finally:
        watcher.stop()


@pytest.mark.timeout(30)
def test_rebalance_recommendation_is_reported_once_and_watching_goes_on(imds: FakeImds) -> None:
    interruptions, rebalances = Recorder(), Recorder()
    watcher = SpotWatcher(interruptions, metadata_url=imds.url, poll_interval_s=0.1, on_rebalance=rebalances)
    watcher.start()
    try:
        imds.rebalance = {"noticeTime": "2030-01-02T03:00:00Z"}
        wait_until(lambda: rebalances.notices, timeout_s=10, message="rebalance callback")
        polls = imds.action_polls
        wait_until(lambda: imds.action_polls >= polls + 3, timeout_s=10, message="still watching")
        assert [n for _, n in rebalances.notices] == [
            SpotNotice("rebalance", "rebalance", "2030-01-02T03:00:00Z")
        ]
        assert interruptions.notices == [] and watcher.running

        imds.instance_action = {"action": "terminate", "time": "2030-01-02T03:02:00Z"}
        wait_until(lambda: interruptions.notices, timeout_s=10, message="interruption after rebalance")
        assert len(rebalances.notices) == 1
    finally:
        watcher.stop()


@pytest.mark.timeout(30)
def test_watcher_turns_itself_off_where_no_metadata_service_answers() -> None:
    got = Recorder()
    watcher = SpotWatcher(
        got, metadata_url=f"http://127.0.0.1:{free_port()}", poll_interval_s=0.05, timeout_s=0.5
    )
    watcher.start()
    wait_until(lambda: not watcher.running, timeout_s=10, message="watcher gives up")
    assert got.notices == []


def test_metadata_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(METADATA_URL_ENV, "http://127.0.0.1:9/")
    watcher = SpotWatcher.from_env(Recorder(), poll_interval_s=1.0)
    assert watcher is not None and watcher.client.base_url == "http://127.0.0.1:9"
    monkeypatch.setenv(METADATA_URL_ENV, "off")
    assert SpotWatcher.from_env(Recorder()) is None
    monkeypatch.delenv(METADATA_URL_ENV)
    default = SpotWatcher.from_env(Recorder())
    assert default is not None and default.client.base_url == "http://169.254.169.254"
