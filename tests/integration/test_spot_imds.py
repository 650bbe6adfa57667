"""The local metadata service the simulated spot market posts its notices to, read by the worker agent's
own spot watcher (``worker/agent/spot.py``) as on EC2: each worker's URL is its own instance, a notice
reaches only the worker it names, and a read without a token this service issued is refused."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from orchestrator.launchers.spot_imds import LocalMetadataService
from worker.agent.spot import SpotNotice, SpotWatcher
from worker.protocol.imds import INSTANCE_ACTION_PATH


@pytest.fixture
def metadata() -> Iterator[LocalMetadataService]:
    service = LocalMetadataService()
    try:
        yield service
    finally:
        service.close()


@pytest.mark.timeout(30)
def test_a_notice_reaches_the_watcher_of_its_worker_only(metadata: LocalMetadataService) -> None:
    notices: dict[str, list[SpotNotice]] = {"w1": [], "w2": []}
    watchers = {rid: SpotWatcher(notices[rid].append, metadata_url=metadata.url_for(rid)) for rid in notices}
    assert all(watcher.poll_once() for watcher in watchers.values())  # answered, no notice yet

    metadata.interrupt("w1", 10.0, now=datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC))

    assert watchers["w1"].poll_once() is False  # a notice ends the watching
    assert notices["w1"] == [SpotNotice("interruption", "terminate", "2026-01-01T12:00:10Z")]
    assert watchers["w2"].poll_once() is True
    assert notices["w2"] == []


@pytest.mark.timeout(30)
def test_a_read_without_a_token_is_refused(metadata: LocalMetadataService) -> None:
    metadata.interrupt("w1", 10.0)
    request = urllib.request.Request(metadata.url_for("w1") + INSTANCE_ACTION_PATH)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(request, timeout=5)
    assert refused.value.code == 401
