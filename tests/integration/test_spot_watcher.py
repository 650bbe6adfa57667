"""SpotWatcher against a fake instance metadata service (IMDSv2 rules) served on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.ports import free_port
from tests.support.waiting import wait_until
from worker.agent.spot import SpotNotice, SpotWatcher
from worker.protocol.imds import (
    INSTANCE_ACTION_PATH,
    METADATA_URL_ENV,
    REBALANCE_PATH,
    TOKEN_HEADER,
    TOKEN_PATH,
    TOKEN_TTL_HEADER,
)


class FakeImds(ThreadingHTTPServer):
    """Tokens from PUT, 401 for a missing/unknown/expired token, 404 until a notice is set."""

    daemon_threads = True

    def __init__(self, max_token_lifetime_s: float = 3600.0) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.max_token_lifetime_s = max_token_lifetime_s
        self.lock = threading.Lock()
        self.tokens: dict[str, float] = {}  # token -> expiry (monotonic)
        self.refused = 0
        self.action_polls = 0
        self.instance_action: dict[str, str] | None = None
        self.rebalance: dict[str, str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeImds

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_PUT(self) -> None:
        ttl = self.headers.get(TOKEN_TTL_HEADER)
        if self.path != TOKEN_PATH or ttl is None or not 1 <= int(ttl) <= 21600:
            self._reply(400, "")
            return
        with self.server.lock:
            token = f"token-{len(self.server.tokens)}"
            lifetime = min(float(ttl), self.server.max_token_lifetime_s)
            self.server.tokens[token] = time.monotonic() + lifetime
        self._reply(200, token)

    def do_GET(self) -> None:
        with self.server.lock:
            expiry = self.server.tokens.get(self.headers.get(TOKEN_HEADER, ""))
            if expiry is None or time.monotonic() >= expiry:
                self.server.refused += 1
                self._reply(401, "")
                return
            if self.path == INSTANCE_ACTION_PATH:
                self.server.action_polls += 1
                notice = self.server.instance_action
            elif self.path == REBALANCE_PATH:
                notice = self.server.rebalance
            else:
                notice = None
        self._reply(200, json.dumps(notice)) if notice else self._reply(404, "Not Found")

    def _reply(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _serve(server: FakeImds) -> Iterator[FakeImds]:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    yield from _serve(FakeImds())


@pytest.fixture
def short_token_imds() -> Iterator[FakeImds]:
    """Tokens live 0.3 s whatever the client asks: the watcher must notice and renew."""
    yield from _serve(FakeImds(max_token_lifetime_s=0.3))


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
