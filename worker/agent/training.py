"""The agent's training set-up: the DHT, the resume decision, ``HivemindStrategy`` and the ``Trainer``.

The agent starts the DHT itself (before ``trainer.fit``) so that it can look at the swarm first: the
choice of loading the run's checkpoint has to be made before ``fit(ckpt_path=...)`` is called. The
strategy gets that DHT (``HivemindStrategy(dht=...)``) and leaves its shutdown to the agent.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.agent.checkpoints import (
    live_record_max_age_s,
    read_live_peer_epochs,
    should_resume,
)
from worker.agent.client import ApiError, OrchestratorClient, Unreachable
from worker.agent.config import AgentSettings
from worker.agent.resume import resume_path
from worker.protocol.runs import SWARM_ADMISSION_OPTION, swarm_admission_requested
from worker.protocol.trainer import QUIET, build_plugins
from worker.protocol.workers import WorkerRegistered

logger = logging.getLogger(__name__)

# The strategy's own DHT keywords. They, and every other keyword hivemind's DHT takes
# (worker/strategy/keywords.py), configure the DHT, which the agent starts: they go to start_dht instead.
DHT_OPTION_NAMES = ("host_maddrs", "announce_maddrs", "identity_path", "client_mode")


@dataclass(frozen=True)
class SplitOptions:
    dht: dict[str, Any]
    strategy: dict[str, Any]


def split_strategy_options(options: Mapping[str, Any], config: AgentSettings) -> SplitOptions:
    """Separate the DHT options from the strategy's; the agent's own flags win over the run spec."""
    from worker.strategy.keywords import dht_keywords

    dht_names = {*DHT_OPTION_NAMES, *dht_keywords()}
    dht = {k: v for k, v in options.items() if k in dht_names}
    not_strategy = {*dht_names, "initial_peers", SWARM_ADMISSION_OPTION}  # the agent handles these
    strategy = {k: v for k, v in options.items() if k not in not_strategy}
    if config.host_maddrs:
        dht["host_maddrs"] = config.host_maddrs
    if config.announce_maddrs:
        dht["announce_maddrs"] = config.announce_maddrs
    return SplitOptions(dht, strategy)


def swarm_authorizer(
    registration: WorkerRegistered, config: AgentSettings, identity: str | None = None
) -> Any:
    """This worker's swarm authorizer, or None when its swarm admits any peer.

    None when the run spec opts out (``swarm_admission: false``) or the orchestrator does not admit by
    token. The peer's identity is ``identity`` (the run spec's ``identity_path``) or a key kept in the
    worker directory for this worker id, and every token obtained is cached there
    (:mod:`worker.agent.token_cache`): when the orchestrator cannot be reached, an unexpired cached token
    lets a restarted worker rejoin its swarm.
    Raises ``ApiError`` (orchestrator unreachable, nothing cached), ``SwarmTokenUnavailable`` (no token
    for this worker) or ``SwarmTokenError`` (an unusable answer): without a token there is no swarm.
    """
    from worker.admission.authorizer import SwarmAuthorizer
    from worker.agent.token_cache import CachingTokenSource, ClientTokenSource, identity_path, load_token

    if not swarm_admission_requested(registration.run.strategy_options):
        logger.info("swarm admission: off for this run (any peer may join its swarm)")
        return None

    def make_client() -> OrchestratorClient:
        return OrchestratorClient(config.url, registration.worker_token, timeout_s=10.0, retries=2)

    key_path = Path(identity) if identity else identity_path(config.worker_dir, registration.worker_id)
    source = CachingTokenSource(
        ClientTokenSource(make_client, registration.worker_id), config.worker_dir, registration.worker_id
    )
    try:
        # it has just answered the registration, or stayed away for the whole boot: one retry will do
        with OrchestratorClient(config.url, timeout_s=10.0, retries=1) as client:
            enabled = client.swarm_auth_info().enabled
    except Unreachable:
        cached = load_token(config.worker_dir, registration.worker_id, registration.swarm_id)
        if cached is None or not key_path.exists():
            raise
        logger.warning("orchestrator unreachable: joining the swarm with the cached swarm token")
        return SwarmAuthorizer(registration.swarm_id, source, cached, key_path)
    if not enabled:
        logger.info("swarm admission: off on this orchestrator")
        return None
    return SwarmAuthorizer.create(registration.swarm_id, source, identity_path=key_path)


def start_swarm_dht(initial_peers: list[str], dht_options: Mapping[str, Any], authorizer: Any = None) -> Any:
    """Start this worker's DHT peer joined to ``initial_peers`` (with swarm admission if ``authorizer``).

    The signature validator is added at once so the swarm's signed progress records can be read before
    training; it uses the process-wide key, the same one hivemind's ProgressTracker uses later.
    """
    from hivemind.dht.crypto import RSASignatureValidator

    from worker.strategy.dht import start_dht

    named = {k: v for k, v in dht_options.items() if k in DHT_OPTION_NAMES}
    extra = {k: v for k, v in dht_options.items() if k not in DHT_OPTION_NAMES}
    dht = start_dht(initial_peers=initial_peers, authorizer=authorizer, extra=extra, **named)
    dht.add_validators([RSASignatureValidator()])
    return dht


REJOIN_INTERVAL_S = 10.0


def keep_swarm_joined(
    dht: Any, worker_dir: Path, run_name: str, interval_s: float = REJOIN_INTERVAL_S
) -> None:
    """Have the DHT ping, every ``interval_s``, the peers of the run's saved peer list (``peers.json``,
    refreshed by the heartbeat thread) that it lost or never met: hivemind bootstraps only once
    (:mod:`worker.swarm_rejoin`)."""
    from worker.agent.boot import load_peers
    from worker.agent.rejoin import keep_joined

    peers = functools.partial(load_peers, worker_dir, run_name)
    dht.run_coroutine(functools.partial(keep_joined, peers, interval_s))


def choose_resume_checkpoint(
    dht: Any, registration: WorkerRegistered, client: OrchestratorClient, worker_dir: Path, module: Any
) -> str | None:
    """The run's newest checkpoint that loads into ``module`` (:mod:`worker.agent.resume`), downloaded,
    unless live peers can hand over a state as new; else None.

    Peers are live only if the orchestrator lists running workers of the run *and* the DHT holds fresh
    progress records of them at the checkpoint's epoch or later: after a total loss the orchestrator
    has marked the old workers lost while their last records may still look recent. Older checkpoints
    are tried only where they are newer than what live peers hold. A failed download is logged and
    training starts without it (the swarm, if any, still shares its state).
    """
    checkpoint = registration.resume_checkpoint
    if checkpoint is None:
        return None
    live_epochs = _live_peer_epochs(dht, registration, client)
    if not should_resume(checkpoint, live_epochs):
        logger.info(
            "live peers at epoch %d >= checkpoint epoch %d: taking the state from peers",
            max(live_epochs),
            checkpoint.epoch,
        )
        return None
    older = [c for c in registration.older_checkpoints if should_resume(c, live_epochs)]
    return resume_path(client, registration, worker_dir, module, [checkpoint, *older])


def _live_peer_epochs(dht: Any, registration: WorkerRegistered, client: OrchestratorClient) -> list[int]:
    try:
        running_workers = client.run_peers(registration.run.name).worker_peers
    except ApiError as exc:
        logger.info("could not ask the orchestrator for running workers (%s); asking the DHT only", exc)
        running_workers = None
    if running_workers == []:
        return []
    from worker.strategy.tracker import METADATA_EXPIRATION_S  # hivemind is loaded by now: the DHT runs

    tracker_opts = registration.run.strategy_options.get("tracker_opts") or {}
    max_age_s = live_record_max_age_s(tracker_opts.get("metadata_expiration", METADATA_EXPIRATION_S))
    try:
        return read_live_peer_epochs(dht, registration.swarm_id, max_age_s)
    except (TimeoutError, OSError) as exc:
        logger.warning("could not read the swarm's progress (%s); assuming no live peer", exc)
        return []


def build_trainer(
    registration: WorkerRegistered,
    dht: Any,
    strategy_options: Mapping[str, Any],
    callback: Any,
    config: AgentSettings,
) -> Any:
    """The ``Trainer`` of this worker: HivemindStrategy on the agent's DHT, trains until told to stop.

    The run's ``trainer`` section applies over the agent's quiet defaults (and validation every minute
    of training when it sets no cadence: ``TrainerSection.validation_cadence``); its callbacks follow the
    agent's, and its loggers come first (``trainer.log_dir`` is theirs), then the agent's reporting
    logger. Raises ``TypeError`` (``TrainerPluginError`` included) or ``HivemindStrategyError`` for an
    unusable run spec.
    """
    from lightning.pytorch import Trainer

    from worker.strategy import HivemindStrategy
    from worker.strategy.options import strategy_option_problem

    spec = registration.run
    problem = strategy_option_problem(strategy_options)
    if problem:
        raise TypeError(f"strategy_options: {problem}")
    callbacks = [callback, *build_plugins(spec.trainer.callbacks, "callback")]
    loggers = [*build_plugins(spec.trainer.loggers, "logger"), callback.reporting_logger]
    strategy = HivemindStrategy(
        target_batch_size=spec.target_batch_size,
        run_id=registration.swarm_id,
        batch_size=spec.batch_size,
        dht=dht,
        **dict(strategy_options),
    )
    options: dict[str, Any] = {
        **QUIET,
        "num_sanity_val_steps": 0,
        **spec.trainer.validation_cadence(),
        **spec.trainer.trainer_kwargs(),
        "callbacks": callbacks,
        "logger": loggers,
    }
    return Trainer(
        strategy=strategy,
        accelerator=config.accelerator,
        devices=1,
        max_epochs=-1,
        max_steps=-1,
        default_root_dir=str(config.worker_dir),
        **options,
    )


DHT_START_ATTEMPTS = 3
#: what hivemind (no initial peer answered a ping) and p2pd (none took the connection) say of a bootstrap
BOOTSTRAP_FAILURES = ("bootstrap failed", "failed to connect to bootstrap peers")
DHT_RETRY_PAUSE_S = 3.0


def fit(trainer: Any, module: Any, datamodule: Any, ckpt_path: str | None) -> None:
    """``trainer.fit``, resuming from ``ckpt_path`` when given. The checkpoint came over the network
    (uploaded by some worker of the run), so it is unpickled with ``weights_only=True`` whatever torch's
    default: tensors and plain values load (hivemind's optimizer state included), code does not run."""
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)


def start_swarm_dht_retrying(
    initial_peers: list[str],
    dht_options: Mapping[str, Any],
    authorizer: Any,
    refresh_peers: Callable[[], list[str]],
    sleep: Callable[[float], None] = time.sleep,
) -> Any:
    """:func:`start_swarm_dht`, tried again (with freshly fetched peers) when no initial peer answered.

    A busy or restarting orchestrator DHT can miss the bootstrap pings (hivemind: "bootstrap failed"),
    and one that is gone refuses the connection (``p2pd``: "failed to connect to bootstrap peers"), as
    when the leader of two orchestrators dies while a worker it launched starts: the fresh peers are
    then the new leader's. A retry here is far cheaper than a new worker. Other failures, and the last
    bootstrap failure, are raised.
    """
    from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError

    for attempt in range(1, DHT_START_ATTEMPTS + 1):
        try:
            return start_swarm_dht(initial_peers, dht_options, authorizer)
        except (RuntimeError, P2PDaemonError) as exc:
            if attempt == DHT_START_ATTEMPTS or not any(s in str(exc) for s in BOOTSTRAP_FAILURES):
                raise
            logger.warning("joining the swarm failed (%s); trying again in %.0f s", exc, DHT_RETRY_PAUSE_S)
        sleep(DHT_RETRY_PAUSE_S)
        initial_peers = refresh_peers() or initial_peers
    raise AssertionError("unreachable: the loop returns or raises")
