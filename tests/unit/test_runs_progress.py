"""Pure helpers around a run's progress: downsampling, DHT progress parsing, settings, error statuses."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hivemind.utils import ValueWithExpiration
from sqlalchemy.exc import OperationalError, ProgrammingError

from orchestrator import errors
from orchestrator.api.errors import _status_of
from orchestrator.config import Settings
from orchestrator.domain.views import downsample
from orchestrator.progress import SwarmProgressCache
from orchestrator.swarm.dht import parse_progress, progress_key
from orchestrator.tokens import bearer_token, hash_token, token_matches

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("count", "max_points"), [(0, 5), (3, 5), (5, 5), (100, 7), (1000, 2), (10, 1)])
def test_downsample_keeps_the_ends_and_the_order(count: int, max_points: int) -> None:
    items = list(range(count))
    picked = downsample(items, max_points)
    assert len(picked) == min(count, max_points) and picked == sorted(picked)
    if count:
        assert picked[-1] == count - 1 and (max_points == 1 or picked[0] == 0)


def entry(epoch: int, samples: int, speed: float = 1.0, client: bool = False) -> ValueWithExpiration:
    value = {
        "peer_id": b"x",
        "epoch": epoch,
        "samples_accumulated": samples,
        "samples_per_second": speed,
        "time": 1.0,
        "client_mode": client,
    }
    return ValueWithExpiration(value, 1e12)


def test_swarm_progress_is_aggregated_like_progress_tracker() -> None:
    metadata = {
        b"a": entry(4, 30, 2.0),
        b"b": entry(4, 20, 3.0),
        b"c": entry(3, 99, 1.0),  # behind: counted as a peer and for speed, not for samples
        b"d": entry(9, 5, 0.5, client=True),  # a client's epoch does not move the swarm's
        b"e": ValueWithExpiration(None, 1e12),  # a peer that left
        b"f": ValueWithExpiration({"epoch": "bad"}, 1e12),
    }
    progress = parse_progress(metadata, 128, NOW)
    assert progress is not None
    assert (progress.epoch, progress.samples_accumulated, progress.num_peers, progress.num_clients) == (
        4,
        50,
        4,
        1,
    )
    assert progress.samples_per_s == pytest.approx(6.5) and progress.target_batch_size == 128
    assert parse_progress(None, 128, NOW) is None and parse_progress({}, 128, NOW) is None
    assert progress_key("run-1a2b") == "run-1a2b_progress"


def test_an_empty_read_keeps_the_epoch_but_shows_no_peers() -> None:
    cache = SwarmProgressCache()
    cache.update("s", parse_progress({b"a": entry(7, 10)}, 64, NOW), NOW)
    cache.update("s", None, NOW)
    kept = cache.get("s")
    assert kept is not None and kept.epoch == 7 and kept.num_peers == 0 and kept.samples_per_s == 0
    cache.forget_except(set())
    assert cache.get("s") is None


def test_settings_read_env_lists_and_derive_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPOTSWARM_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SPOTSWARM_DHT_ANNOUNCE_MADDRS", "/ip4/1.2.3.4/tcp/31330, /dns4/x.example/tcp/31330")
    monkeypatch.setenv("SPOTSWARM_PUBLIC_READS", "false")
    settings = Settings(dht_port=4000)
    assert settings.dht.announce_maddrs == ["/ip4/1.2.3.4/tcp/31330", "/dns4/x.example/tcp/31330"]
    assert settings.dht.resolved_host_maddrs() == ["/ip4/0.0.0.0/tcp/4000"] and not settings.public_reads
    assert settings.resolved_database_url() == f"sqlite:///{tmp_path.resolve() / 'spotswarm.db'}"
    assert settings.resolved_checkpoint_dir() == tmp_path / "checkpoints"
    with pytest.raises(ValueError):
        Settings(heartbeat_interval_s=0)


def test_each_failure_kind_has_one_status() -> None:
    cases = {
        errors.Unauthorized("x"): 401,
        errors.Forbidden("x"): 403,
        errors.NotFound("x"): 404,
        errors.RunExists("x"): 409,
        errors.IllegalTransition("x"): 409,
        errors.InvalidRequest("x"): 422,
        errors.ChecksumMismatch("x"): 400,
        errors.PayloadTooLarge("x"): 413,
        errors.Unavailable("x"): 503,
        OperationalError("SELECT 1", {}, Exception("down")): 503,
        ProgrammingError("SELECT 1", {}, Exception("bad")): 500,
        RuntimeError("surprise"): 500,
    }
    assert {type(e).__name__: _status_of(e) for e in cases} == {type(e).__name__: s for e, s in cases.items()}


def test_tokens_are_compared_by_hash() -> None:
    digest = hash_token("ssw_secret")
    assert token_matches("ssw_secret", digest) and not token_matches("ssw_other", digest)
    assert not token_matches("ssw_secret", None)
    assert bearer_token("Bearer abc") == "abc" and bearer_token("bearer  abc ") == "abc"
    assert (
        bearer_token("Basic abc") is None and bearer_token(None) is None and bearer_token("Bearer ") is None
    )
