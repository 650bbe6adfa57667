"""The worker's cached swarm token and identity (worker/agent/token_cache.py), and the agent joining its
swarm with them while the orchestrator cannot be reached (worker.agent.training.swarm_authorizer)."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from orchestrator.swarm.admission import SwarmAuthority, load_or_create_key
from tests.support.ports import free_port
from worker.admission.authorizer import ensure_identity, load_identity
from worker.agent.client import Unreachable
from worker.agent.config import AgentSettings, parse_config
from worker.agent.token_cache import CachingTokenSource, identity_path, load_token, save_token
from worker.agent.training import swarm_authorizer
from worker.protocol.runs import RunSpec
from worker.protocol.swarm_tokens import SwarmToken
from worker.protocol.workers import WorkerRegistered

SWARM = "spotswarm-cache-test"


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> SwarmAuthority:
    return SwarmAuthority(load_or_create_key(tmp_path_factory.mktemp("authority") / "swarm.key"), ttl_s=600)


def peer_key(worker_dir: Path, worker_id: str) -> str:
    """The OpenSSH public key of the worker's (new) identity in the cache."""
    path = identity_path(worker_dir, worker_id)
    ensure_identity(path)
    key, _ = load_identity(path)
    return key.get_public_key().to_bytes().decode()


def grant(authority: SwarmAuthority, public_key: str, now: float | None = None) -> SwarmToken:
    return authority.grant(SWARM, "worker-7", public_key, time.time() if now is None else now)


def test_a_saved_token_loads_back_for_its_worker_and_swarm_until_it_expires(
    tmp_path: Path, authority: SwarmAuthority
) -> None:
    token = grant(authority, peer_key(tmp_path, "7"))
    save_token(tmp_path, "7", token)
    assert load_token(tmp_path, "7", SWARM) == token
    assert load_token(tmp_path, "8", SWARM) is None  # another worker's
    assert load_token(tmp_path, "7", "another-swarm") is None
    assert load_token(tmp_path, "7", SWARM, clock=lambda: time.time() + 601) is None  # expired


def test_the_cache_is_readable_by_its_owner_only(tmp_path: Path, authority: SwarmAuthority) -> None:
    save_token(tmp_path, "7", grant(authority, peer_key(tmp_path, "7")))
    cache = tmp_path / "swarm" / "7"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE((cache / "token.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((cache / "identity.key").stat().st_mode) & 0o077 == 0


@pytest.mark.parametrize("content", ["", "{", '{"worker_id": "7"}', '{"worker_id": "7", "token": {"a": 1}}'])
def test_an_unreadable_cache_is_ignored(tmp_path: Path, content: str) -> None:
    (tmp_path / "swarm" / "7").mkdir(parents=True)
    (tmp_path / "swarm" / "7" / "token.json").write_text(content)
    assert load_token(tmp_path, "7", SWARM) is None


def test_the_caching_source_saves_each_token_it_obtains(tmp_path: Path, authority: SwarmAuthority) -> None:
    public = peer_key(tmp_path, "7")
    tokens = iter([grant(authority, public), grant(authority, public, now=time.time() + 60)])
    source = CachingTokenSource(lambda key: next(tokens), tmp_path, "7")
    for _ in range(2):
        handed = source(public)
        assert load_token(tmp_path, "7", SWARM) == handed


def registration(worker_id: str = "7") -> WorkerRegistered:
    run = RunSpec(
        name="cache",
        module="worker.examples.digits:DigitsModule",
        datamodule="worker.examples.digits:DigitsDataModule",
        target_batch_size=64,
        batch_size=8,
    )
    return WorkerRegistered(
        worker_id=worker_id,
        worker_token="ssw_test",
        run=run,
        swarm_id=SWARM,
        initial_peers=[],
        heartbeat_interval_s=1.0,
    )


def down_orchestrator_config(worker_dir: Path) -> AgentSettings:
    """Agent config pointing at a port nothing listens on, with no retries to wait for."""
    url = f"http://127.0.0.1:{free_port()}"
    return parse_config(["--url", url, "--join-token", "ssj_x", "--worker-dir", str(worker_dir)])


@pytest.mark.timeout(60)
def test_with_the_orchestrator_down_the_cached_token_admits_the_restarted_worker(
    tmp_path: Path, authority: SwarmAuthority
) -> None:
    token = grant(authority, peer_key(tmp_path, "7"))
    save_token(tmp_path, "7", token)
    authorizer = swarm_authorizer(registration(), down_orchestrator_config(tmp_path))
    assert authorizer is not None
    assert authorizer.current_token().expiration_time == token.expiration_time
    assert authorizer.identity_path == identity_path(tmp_path, "7")  # the key the token is bound to
    assert authorizer.peer_id == token.peer_id


@pytest.mark.timeout(60)
def test_with_the_orchestrator_down_and_no_usable_cached_token_there_is_no_swarm_to_join(
    tmp_path: Path, authority: SwarmAuthority
) -> None:
    config = down_orchestrator_config(tmp_path)
    with pytest.raises(Unreachable):
        swarm_authorizer(registration(), config)  # nothing cached
    save_token(tmp_path, "7", grant(authority, peer_key(tmp_path, "7"), now=time.time() - 600))
    with pytest.raises(Unreachable):
        swarm_authorizer(registration(), config)  # expired


def test_a_run_that_opts_out_of_admission_needs_no_token(tmp_path: Path) -> None:
    spec = registration().model_copy(deep=True)
    spec.run.strategy_options["swarm_admission"] = False
    assert swarm_authorizer(spec, down_orchestrator_config(tmp_path)) is None
