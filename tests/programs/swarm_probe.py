"""A peer that tries to take part in a run's swarm: ``python -m tests.programs.swarm_probe CONFIG OUT``.

It imports everything first, then waits (up to 10 minutes) for the file CONFIG to appear, so a test can
start it early and write the config once the run's workers train.

For each mode in the JSON config, in order, it starts a hivemind DHT peer on 127.0.0.1 joined to the
orchestrator and one of the run's workers, then tries what a member does: store a progress record
under the run's key (``<swarm>_progress``: a trainer at a huge epoch for intruders, a harmless client
record for the admitted control), read that key, download the model state from a worker's state
averager and ask its gradient averager to join a group. It writes what happened, per mode, to OUT.

Modes: ``none`` (plain hivemind, no token), ``forged`` (signed by a key that is not the orchestrator's),
``expired`` (signed by the orchestrator's key from its data dir, expired), ``other_run`` (a real token
of another run), ``admitted`` (a real token of this run, fetched like an agent does). The mode
``strategy`` instead trains ``DigitsModule`` for a few steps with ``HivemindStrategy(authorizer=...)``
(a real token of this run) and reports the swarm it saw. The mode ``open`` is a plain hivemind peer
of a run that opted out of admission: it publishes a progress record through the orchestrator and
reports whether the orchestrator's view of that run (``GET /runs/{name}``) shows it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import hivemind
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.schema import SchemaValidator
from hivemind.optim.grad_averager import GradientAverager
from hivemind.optim.progress_tracker import LocalTrainingProgress, TrainingProgressSchema
from hivemind.optim.state_averager import TrainingStateAverager
from hivemind.p2p import PeerID
from hivemind.proto import averaging_pb2
from hivemind.proto.auth_pb2 import AccessToken
from hivemind.utils.auth import TokenAuthorizerBase
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import get_dht_time

from tests.support.dht_reads import read_latest
from tests.support.waiting import wait_for_file
from worker.admission.access_tokens import to_access_token
from worker.admission.authorizer import (
    AdmissionDHT,
    SwarmAuthorizer,
    ensure_identity,
    load_identity,
    serve_token,
)
from worker.admission.tokens import sign_token
from worker.agent.client import OrchestratorClient
from worker.agent.token_cache import ClientTokenSource
from worker.protocol.trainer import NO_VALIDATION, QUIET

INTRUDER_EPOCH = 10**6
RECORD_TTL_S = 20.0
STRATEGY_STEPS = 10
# A DHT read can miss a record for a moment (it is stored on the peers nearest its key, and a peer that
# joined seconds ago is one of them), so the hand-started peer trains on until it has seen all three
# peers, within this bound, instead of judging from the reads of its first ten steps.
STRATEGY_MAX_S = 90.0
CONFIG_WAIT_S = 600.0
# A download stream that ends with no part and no error says nothing of the guard: hivemind's client
# reads a closed connection as the end of the stream (seen once in CI for a token-less intruder, whose
# refusal the next call then showed). So the probe asks again, and records how many came back empty; any
# part at all ends the tries (and fails the test).
DOWNLOAD_TRIES = 3


class FixedTokenAuthorizer(TokenAuthorizerBase):
    """Presents one given token whatever it is, and believes every peer (an intruder's authorizer)."""

    def __init__(self, key: RSAPrivateKey, token: AccessToken) -> None:
        super().__init__(local_private_key=key)
        self._token = token

    async def get_token(self) -> AccessToken:
        return self._token

    def current_token(self) -> AccessToken:
        return self._token

    def is_token_valid(self, access_token: AccessToken) -> bool:
        return True

    def does_token_need_refreshing(self, access_token: AccessToken) -> bool:
        return False


def start_peer(mode: str, config: dict[str, Any], workdir: Path) -> hivemind.DHT:
    identity = workdir / f"{mode}.key"
    ensure_identity(identity)
    key, _ = load_identity(identity)
    public_key = key.get_public_key().to_bytes().decode()
    peers = config["initial_peers"]
    common: dict[str, Any] = {"host_maddrs": ["/ip4/127.0.0.1/tcp/0"], "ensure_bootstrap_success": False}
    fresh = {"check_if_identity_free": False}  # a new key: no need to ask the swarm
    if mode == "none":
        return hivemind.DHT(peers, start=True, **common)
    if mode in ("admitted", "other_run"):
        worker = config[mode]
        source = token_source(config, mode)
        return AdmissionDHT(
            peers, authorizer=SwarmAuthorizer.create(worker["swarm_id"], source, identity), **common
        )
    if mode == "expired":
        pem = Path(config["authority_key_path"]).read_bytes()
        signer = serialization.load_pem_private_key(pem, password=None)
        expires_at = time.time() - 300
    else:  # forged
        signer = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        expires_at = time.time() + 300
    assert isinstance(signer, rsa.RSAPrivateKey)
    token = to_access_token(sign_token(signer, config["swarm_id"], "worker-999", public_key, expires_at))
    authorizer = FixedTokenAuthorizer(key, token)
    dht = hivemind.DHT(
        peers, start=True, authorizer=authorizer, identity_path=str(identity), **fresh, **common
    )
    dht.run_coroutine(serve_token)
    return dht


def store_progress(dht: hivemind.DHT, swarm_id: str, admitted: bool) -> bool:
    validator = RSASignatureValidator(RSAPrivateKey())
    dht.add_validators([SchemaValidator(TrainingProgressSchema, prefix=swarm_id), validator])
    record = LocalTrainingProgress(
        peer_id=dht.peer_id.to_bytes(),
        epoch=0 if admitted else INTRUDER_EPOCH,
        samples_accumulated=0,
        samples_per_second=0.0 if admitted else 1e6,
        time=get_dht_time(),
        client_mode=admitted,
    )
    stored = dht.store(
        f"{swarm_id}_progress",
        subkey=validator.local_public_key,
        value=record.dict(),
        expiration_time=get_dht_time() + RECORD_TTL_S,
        exclude_self=True,
    )
    return bool(stored)


def others_seen(dht: hivemind.DHT, swarm_id: str) -> int:
    found = read_latest(dht, f"{swarm_id}_progress")
    if found is None or not isinstance(found.value, dict):
        return 0
    own = dht.peer_id.to_bytes()
    records = [getattr(item, "value", None) for item in found.value.values()]  # None: a peer that left
    return sum(1 for record in records if isinstance(record, dict) and record.get("peer_id") != own)


async def try_averaging(dht: hivemind.DHT, swarm_id: str, worker: PeerID) -> dict[str, str]:
    p2p = await dht.replicate_p2p()
    results: dict[str, str] = {}
    stub = TrainingStateAverager.get_stub(p2p, worker, namespace=f"{swarm_id}_state_averager")
    empty = 0
    for _ in range(DOWNLOAD_TRIES):
        try:
            parts = [part async for part in await stub.rpc_download_state(averaging_pb2.DownloadRequest())]
            results["download_state"] = f"ok: {len(parts)} parts"
        except Exception as exc:  # noqa: BLE001 - the outcome is the probe's result
            results["download_state"] = f"error: {type(exc).__name__}: {exc}"
            break
        if parts:
            break
        empty += 1
        await asyncio.sleep(1.0)
    results["download_state_empty_streams"] = str(empty)
    try:
        stub = GradientAverager.get_stub(p2p, worker, namespace=f"{swarm_id}_grad_averager")
        request = averaging_pb2.JoinRequest(
            schema_hash=b"probe", expiration=get_dht_time() + 5, group_key=b""
        )
        stream = await stub.rpc_join_group(request)
        async with asyncio.timeout(10):
            reply = await stream.__anext__()
        results["join_group"] = f"ok: {averaging_pb2.MessageCode.Name(reply.code)}"
    except Exception as exc:  # noqa: BLE001 - the outcome is the probe's result
        results["join_group"] = f"error: {type(exc).__name__}: {exc}"  # the type: a timeout has no text
    return results


def token_source(config: dict[str, Any], mode: str) -> ClientTokenSource:
    worker = config[mode]
    return ClientTokenSource(lambda: OrchestratorClient(config["url"], worker["token"]), worker["id"])


def train_with_strategy(config: dict[str, Any], steps: int) -> dict[str, Any]:
    """A hand-started peer: Lightning + HivemindStrategy with a token, joined to the run's swarm."""
    from lightning.pytorch import Callback, Trainer

    from worker.examples.digits import DigitsDataModule, DigitsModule
    from worker.strategy import HivemindStrategy

    authorizer = SwarmAuthorizer.create(config["swarm_id"], token_source(config, "strategy"))
    strategy = HivemindStrategy(
        target_batch_size=64,
        run_id=config["swarm_id"],
        batch_size=16,
        initial_peers=config["initial_peers"],
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        matchmaking_time=1.0,
        averaging_timeout=10.0,
        authorizer=authorizer,
    )
    seen: dict[str, Any] = {}

    def note(progress: Any) -> None:
        seen["peers"] = max(seen.get("peers", 0), progress.num_peers)
        seen.setdefault("first_epoch", progress.epoch)
        seen["last_epoch"] = progress.epoch

    class Watch(Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            note(strategy.swarm_progress())
            if (
                trainer.global_step >= steps
                and seen["peers"] >= 3
                and seen["last_epoch"] > seen["first_epoch"]
            ):
                trainer.should_stop = True
            seen["dht_peer_id"] = str(strategy.dht.peer_id)

    trainer = Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_time={"seconds": STRATEGY_MAX_S},
        callbacks=[Watch()],
        **QUIET,
        **NO_VALIDATION,
    )
    trainer.fit(DigitsModule(), datamodule=DigitsDataModule(batch_size=16))
    seen["token_peer_id"] = authorizer.peer_id
    return seen


def open_run_peer(config: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    """A token-less peer of an opted-out run: its record must reach the orchestrator's view."""
    import httpx

    swarm_id, name = config["open_swarm_id"], config["open_run"]
    dht = hivemind.DHT(config["orchestrator_peers"], start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        validator = RSASignatureValidator(RSAPrivateKey())
        dht.add_validators([SchemaValidator(TrainingProgressSchema, prefix=swarm_id), validator])
        record = LocalTrainingProgress(
            peer_id=dht.peer_id.to_bytes(),
            epoch=5,
            samples_accumulated=0,
            samples_per_second=0.0,
            time=get_dht_time(),
            client_mode=False,
        )
        key = f"{swarm_id}_progress"
        dht.store(
            key, subkey=validator.local_public_key, value=record.dict(), expiration_time=get_dht_time() + 60
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            swarm = httpx.get(f"{config['url']}/api/v1/runs/{name}", timeout=10).json()["swarm"]
            if swarm and swarm["epoch"] == 5:
                return {"orchestrator_saw": True}
            time.sleep(0.5)
        return {"orchestrator_saw": False}
    finally:
        dht.shutdown()


def probe(mode: str, config: dict[str, Any], workdir: Path) -> dict[str, Any]:
    if mode == "strategy":
        return train_with_strategy(config, steps=STRATEGY_STEPS)
    if mode == "open":
        return open_run_peer(config)
    dht = start_peer(mode, config, workdir)
    try:
        swarm_id = config["swarm_id"]
        result: dict[str, Any] = {"stored": store_progress(dht, swarm_id, admitted=mode == "admitted")}
        result["others_seen"] = others_seen(dht, swarm_id)
        worker = PeerID.from_base58(config["worker_peer_id"])
        result.update(asyncio.run(try_averaging(dht, swarm_id, worker)))
        return result
    finally:
        dht.shutdown()


def main() -> None:
    import worker.examples.digits  # noqa: F401  (Lightning and the model imported before waiting)
    from worker.strategy import HivemindStrategy  # noqa: F401

    config_path = Path(sys.argv[1])
    config = json.loads(wait_for_file(config_path, CONFIG_WAIT_S, poll_s=0.2).read_text())
    out = Path(sys.argv[2])
    workdir = out.parent
    results = {}
    for mode in config["modes"]:
        started = time.monotonic()
        results[mode] = probe(mode, config, workdir)
        results[mode]["seconds"] = round(time.monotonic() - started, 1)
        print(mode, results[mode], flush=True)
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
