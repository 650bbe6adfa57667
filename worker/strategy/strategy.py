"""``HivemindStrategy``: train a LightningModule together with a swarm of unreliable peers (Lightning 2.x).

A drop-in replacement for ``lightning_hivemind.strategy.HivemindStrategy`` (same keywords, same defaults),
written for Lightning 2.6. Each peer runs one process on one device; peers find each other through a
hivemind DHT and average gradients once every ``target_batch_size`` samples (a *swarm epoch*).

Lifecycle: ``setup`` (fit only) starts the DHT and wraps the module's optimizer in a
``hivemind.Optimizer``; ``on_train_start`` joins a running swarm by downloading its state;
``optimizer_step`` feeds each batch to hivemind and logs swarm metrics; ``teardown`` says goodbye
to peers and stops what it started. Helpers live in the other modules of this package (see its docstring).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import hivemind
import torch
from hivemind.utils.crypto import RSAPrivateKey
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor
from typing_extensions import override

from worker.protocol.sync import DEFAULT_SYNC, sync_problem
from worker.protocol.workers import AveragingCounts
from worker.strategy import checks
from worker.strategy.checks import HivemindStrategyError, SwarmNotStartedError
from worker.strategy.dht import PeerAuthorizer, initial_peers_line, parse_initial_peers, start_dht
from worker.strategy.diloco.model_state import global_model_state
from worker.strategy.diloco.optimizer import DiLoCoOptimizer, DiLoCoOutcomes
from worker.strategy.diloco.settings import DiLoCoSettings, diloco_settings
from worker.strategy.keywords import averager_options, route_keywords
from worker.strategy.metrics import (
    MetricsThrottle,
    SwarmProgress,
    SwarmRateReader,
    log_swarm_metrics,
    progress_from_tracker,
)
from worker.strategy.optimizer import (
    Optimizer,
    SwarmLightningOptimizer,
    ZeroGradSwitch,
    build_hivemind_optimizer,
    follow_swarm_epochs,
    hivemind_state_dict,
    load_hivemind_state_dict,
)
from worker.strategy.outcomes import OutcomeRecorder, count_outcomes
from worker.strategy.precision import HivemindMixedPrecision
from worker.strategy.schedulers import SwarmEpochScheduler
from worker.strategy.shutdown import shutdown_optimizer, stop_orphaned_optimizer

__all__ = ["HivemindStrategy", "HivemindStrategyError", "SwarmNotStartedError", "SwarmProgress"]

log = logging.getLogger(__name__)

#: How often (in swarm epochs) peers average their whole training state, where hivemind does it after
#: every gradient round. Peers that apply the same averaged gradients stay equal without it: the state
#: round only mends peers that drifted (a round they missed). Every 10th epoch gave about half the time
#: per epoch on short epochs and far fewer rounds that find no group (bench/swarm_batch.py). It is the
#: strategy's default, not only the agent's: a peer that averages its state in an epoch where the others
#: do not waits out ``averaging_timeout`` alone, so a worker started by hand into a run must agree.
AVERAGE_STATE_EVERY = 10


class HivemindStrategy(Strategy):
    """Collaborative training over hivemind: one peer per process, one device per peer.

    Args:
        target_batch_size: samples the whole swarm accumulates before each optimizer step (swarm epoch).
        run_id: the swarm's name; peers with the same ``run_id`` train together.
        batch_size: samples per local step; ``None`` reads it from the train dataloader.
        delay_state_averaging: average parameters in the background (one step stale, faster).
        delay_optimizer_step: run the optimizer in the background (needs ``offload_optimizer``);
            ``None`` follows ``delay_grad_averaging``.
        delay_grad_averaging: average gradients in the background (needs ``delay_optimizer_step``).
        offload_optimizer: keep the optimizer on the host, saving device memory; ``None`` lets hivemind
            decide (on whenever a delay flag is on).
        reuse_grad_buffers: accumulate in ``param.grad`` to save memory; disables ``optimizer_zero_grad``.
        scheduler_fn: ``callable(optimizer) -> LRScheduler`` that hivemind steps per swarm epoch; needed
            for a schedule when a delay/offload flag makes hivemind create the optimizer itself.
        matchmaking_time: seconds to wait for peers before averaging.
        averaging_timeout: seconds before an averaging round gives up (training goes on with local grads).
        verbose: log hivemind's progress at INFO.
        averager_opts: keyword arguments for hivemind's averagers. ``request_timeout`` defaults to half of
            ``matchmaking_time`` (at most hivemind's 3 s): hivemind asks for it below the matchmaking time,
            where a follower waiting on an unresponsive leader can otherwise outlast the round.
            ``next_chunk_timeout`` (an optimizer keyword) is how long a round waits on a late groupmate:
            hivemind's ``matchmaking_time`` unless given (docs/guides/strategy.md says when to raise it).
        host_maddrs: multiaddrs to listen on (default: every IPv4 interface, a free TCP port).
        initial_peers: multiaddrs (list or comma-separated) of any swarm member; default: the
            ``INITIAL_PEERS`` (or ``PL_INITIAL_PEERS``) environment variable; none starts a new swarm.
        identity_path: file with this peer's private key (created if missing) for a stable peer id.
        client_mode: do not accept incoming connections (behind NAT/firewall).
        dht: an already running ``hivemind.DHT`` to use (this strategy will not shut it down).
        announce_maddrs: multiaddrs to announce to other peers (public address behind NAT).
        tracker_opts: options of hivemind's ``ProgressTracker`` (e.g. ``metadata_expiration``).
        authorizer: a ``worker.admission.authorizer.SwarmAuthorizer`` holding this peer's token from the
            orchestrator: join a swarm with admission (docs/concepts/swarm-admission.md); the DHT then uses
            the authorizer's identity. With ``dht=...``, start that DHT with the authorizer instead.
        average_state_every: average the whole training state (parameters, optimizer statistics) in a
            second round every this many epochs (hivemind's own default is 1; see
            :data:`AVERAGE_STATE_EVERY`). Every peer of a swarm must use the same value.
        sync: how peers train together (docs/guides/strategy.md, "Sync modes"): ``"gradients"`` (average
            gradients every ``target_batch_size`` samples), ``"local"`` (hivemind's local SGD) or
            ``"diloco"`` (the module's optimizer steps every batch; every ``sync_every_s`` seconds, or
            ``sync_every_steps`` steps, peers average pseudo-gradients and take an outer Nesterov step
            with ``outer_lr`` and ``outer_momentum``: worker/strategy/diloco/).
        sync_every_s, sync_every_steps, outer_lr, outer_momentum: the DiLoCo knobs (``None``: defaults in
            worker/protocol/sync.py); refused with another ``sync``.
        **optimizer_kwargs: each goes to the hivemind class that takes it (worker/strategy/keywords.py):
            ``hivemind.Optimizer`` (``grad_compression``, ``state_averaging_compression``,
            ``load_state_timeout``...) or the peer's ``hivemind.DHT`` (``use_relay``, ``use_auto_relay``,
            ``force_reachability``... for peers behind NAT). A keyword neither takes is an error.

    Raises ``HivemindStrategyError`` (a Lightning ``MisconfigurationException``) for settings it cannot run.
    """

    strategy_name = "hivemind"
    #: read for initial peers (``INITIAL_PEERS`` is too: worker/strategy/dht.py), as in lightning-hivemind
    INITIAL_PEERS_ENV = "PL_INITIAL_PEERS"

    def __init__(
        self,
        target_batch_size: int,
        run_id: str = "lightning_run",
        batch_size: int | None = None,
        delay_state_averaging: bool = False,
        delay_optimizer_step: bool | None = None,
        delay_grad_averaging: bool = False,
        offload_optimizer: bool | None = None,
        reuse_grad_buffers: bool = False,
        scheduler_fn: Callable[[torch.optim.Optimizer], Any] | None = None,
        matchmaking_time: float = 5.0,
        averaging_timeout: float = 30.0,
        verbose: bool = False,
        averager_opts: dict[str, Any] | None = None,
        host_maddrs: list[str] | None = None,
        initial_peers: str | Sequence[str] | None = None,
        *,
        identity_path: str | None = None,
        client_mode: bool = False,
        dht: hivemind.DHT | None = None,
        announce_maddrs: list[str] | None = None,
        tracker_opts: dict[str, Any] | None = None,
        authorizer: PeerAuthorizer | None = None,
        average_state_every: int = AVERAGE_STATE_EVERY,
        sync: str = DEFAULT_SYNC,
        sync_every_s: float | None = None,
        sync_every_steps: int | None = None,
        outer_lr: float | None = None,
        outer_momentum: float | None = None,
        **optimizer_kwargs: Any,
    ) -> None:
        super().__init__()
        diloco_options = dict(
            sync_every_s=sync_every_s,
            sync_every_steps=sync_every_steps,
            outer_lr=outer_lr,
            outer_momentum=outer_momentum,
        )
        flags = dict(
            delay_state_averaging=delay_state_averaging,
            delay_optimizer_step=delay_optimizer_step,
            delay_grad_averaging=delay_grad_averaging,
            offload_optimizer=offload_optimizer,
            reuse_grad_buffers=reuse_grad_buffers,
            scheduler_fn=scheduler_fn,
            use_local_updates=optimizer_kwargs.get("use_local_updates"),
        )
        problem = sync_problem(sync, {**diloco_options, **flags})
        if problem:
            raise HivemindStrategyError(problem)
        self.sync = sync
        self._diloco: DiLoCoSettings | None = diloco_settings(diloco_options) if sync == "diloco" else None
        if sync == "local":
            optimizer_kwargs["use_local_updates"] = True
        checks.check_constructor_args(
            target_batch_size, batch_size, delay_state_averaging, delay_optimizer_step, delay_grad_averaging
        )
        checks.check_timeouts(matchmaking_time, averaging_timeout)
        checks.warn_if_scheduler_fn_needed(
            scheduler_fn, delay_state_averaging, delay_optimizer_step, offload_optimizer
        )
        routed = route_keywords(optimizer_kwargs)
        self.target_batch_size = target_batch_size
        self.run_id = run_id
        self.batch_size = batch_size
        self.reuse_grad_buffers = reuse_grad_buffers
        self.scheduler_fn = scheduler_fn
        self.initial_peers = parse_initial_peers(initial_peers)
        self._hivemind_kwargs: dict[str, Any] = dict(
            delay_state_averaging=delay_state_averaging,
            delay_optimizer_step=delay_optimizer_step,
            delay_grad_averaging=delay_grad_averaging,
            offload_optimizer=offload_optimizer,
            reuse_grad_buffers=reuse_grad_buffers,
            matchmaking_time=matchmaking_time,
            averaging_timeout=averaging_timeout,
            verbose=verbose,
            averager_opts=averager_options(averager_opts, matchmaking_time),
            average_state_every=average_state_every,
            **routed.optimizer,
        )
        # hivemind can only offload or delay an optimizer it builds itself
        self._hivemind_creates_optimizer = bool(
            offload_optimizer or delay_optimizer_step or delay_grad_averaging
        )
        self._tracker_opts = dict(tracker_opts or {})
        self._dht_opts: dict[str, Any] = dict(
            host_maddrs=host_maddrs,
            announce_maddrs=announce_maddrs,
            identity_path=identity_path,
            client_mode=client_mode,
            authorizer=authorizer,
            extra=routed.dht,
        )
        self._dht: hivemind.DHT | None = dht
        self._owns_dht = dht is None
        # Set when the run reached its target: teardown leaves this peer's last progress record in the
        # DHT until it expires, so the orchestrator reads the final epoch (worker/strategy/shutdown.py).
        self.keep_progress_record = False
        self._optimizer: Optimizer | DiLoCoOptimizer | None = None
        self._outcomes: OutcomeRecorder | DiLoCoOutcomes | None = None
        self._rate_reader: SwarmRateReader | None = None
        self._last_progress: SwarmProgress | None = None
        self._parallel_devices: list[torch.device] | None = None
        self._declared_batch_size: int | None = None
        self._batch_samples: int | None = None
        self._zero_grad_switch = ZeroGradSwitch()
        self.local_samples = 0
        self._metrics_throttle = MetricsThrottle()
        # one process per peer: every peer is rank 0 of its own one-process world
        self.global_rank = 0
        self.local_rank = 0
        self.node_rank = 0
        self.world_size = 1

    # ----------------------------------------------------------------------------------- public API
    @property
    def dht(self) -> hivemind.DHT:
        """The ``hivemind.DHT`` of this peer (after ``setup``); else raises ``SwarmNotStartedError``."""
        if self._dht is None:
            raise SwarmNotStartedError("the DHT runs from HivemindStrategy.setup (trainer.fit) to teardown")
        return self._dht

    @property
    def optimizer(self) -> Optimizer | DiLoCoOptimizer:
        """The ``hivemind.Optimizer`` (also ``trainer.optimizers[0]``), a ``DiLoCoOptimizer`` with
        ``sync="diloco"``; kept, shut down, after fit."""
        if self._optimizer is None:
            raise SwarmNotStartedError("the hivemind.Optimizer is built in HivemindStrategy.setup (fit)")
        return self._optimizer

    @property
    def num_peers(self) -> int:
        """Peers in the swarm as this peer's progress tracker last saw them, as in lightning-hivemind:
        1 before ``setup``; a lone peer may read 0 until its own progress record is in the DHT."""
        if self._optimizer is None:
            return 1
        return int(self._optimizer.tracker.global_progress.num_peers)

    def leave_averaging(self) -> None:
        """Average no more: for a peer about to leave (a stop, a spot notice), called from any thread.
        A round this peer waits in stops looking for a group at once, instead of waiting up to
        ``averaging_timeout`` for peers that may be leaving too; later steps apply its own gradients
        (``worker/strategy/optimizer.py``). Does nothing before ``setup``."""
        if self._optimizer is not None:
            self._optimizer.leave_rounds()

    def next_round_at(self) -> float | None:
        """The wall-clock time by which this peer's next DiLoCo round by time has its group (its moment
        plus the matchmaking time); None in other modes, with
        ``sync_every_steps``, before ``setup`` and once it leaves rounds. A worker with a spot notice
        leaves as soon as no round of its remains before it must go: the work it would do after its last
        round is never averaged into the swarm's model."""
        return getattr(self._optimizer, "next_round_at", None)

    def averaging_outcomes(self) -> AveragingCounts | None:
        """Outcomes of the swarm epochs this peer stepped through in this fit
        (``worker/strategy/outcomes.py``); None before ``setup``."""
        return self._outcomes.counter.snapshot() if self._outcomes is not None else None

    def swarm_progress(self) -> SwarmProgress:
        """The swarm as this peer sees it now; after fit, as it was last seen. Raises before setup."""
        if self._optimizer is not None and self._rate_reader is not None:
            self._last_progress = progress_from_tracker(
                self._optimizer.tracker, self._rate_reader.samples_per_second()
            )
        if self._last_progress is None:
            raise SwarmNotStartedError("swarm progress is known once trainer.fit has set up HivemindStrategy")
        return self._last_progress

    def visible_maddrs(self) -> list[str]:
        """Multiaddrs (with ``/p2p/<peer id>``) at which other peers can reach this one."""
        return [str(maddr) for maddr in self.dht.get_visible_maddrs()]

    # ------------------------------------------------------------------------ Lightning plumbing
    @property
    @override
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return self._optimizers

    @optimizers.setter
    def optimizers(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self._optimizers = optimizers
        self._lightning_optimizers = [
            SwarmLightningOptimizer._to_lightning_optimizer(opt, self) for opt in optimizers
        ]

    @property
    def parallel_devices(self) -> list[torch.device] | None:
        return self._parallel_devices

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device] | None) -> None:
        self._parallel_devices = devices

    @property
    @override
    def root_device(self) -> torch.device:
        return self._parallel_devices[0] if self._parallel_devices else torch.device("cpu")

    @override
    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    @property
    @override
    def is_global_zero(self) -> bool:
        return True

    @override
    def reduce(self, tensor: Tensor | Any, *args: Any, **kwargs: Any) -> Tensor | Any:
        return tensor

    @override
    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
        return tensor

    @override
    def barrier(self, name: str | None = None) -> None:
        pass

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    @override
    def setup_environment(self) -> None:
        if self._parallel_devices and len(self._parallel_devices) > 1:
            raise HivemindStrategyError(
                f"HivemindStrategy runs one device per peer (process), got {len(self._parallel_devices)}; "
                f"use Trainer(devices=1) and start one peer per device."
            )
        super().setup_environment()

    @override
    def setup(self, trainer: Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.model = self._setup_model(self.model)
        if trainer.state.fn == TrainerFn.FITTING:
            checks.check_trainer(trainer, self.reuse_grad_buffers)
            if self._diloco is None:  # DiLoCo steps the module's own optimizer: Lightning's plugin fits
                self._use_hivemind_precision()
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()

    def _use_hivemind_precision(self) -> None:
        plugin = self.precision_plugin
        if (
            isinstance(plugin, MixedPrecision)
            and plugin.precision == "16-mixed"
            and not isinstance(plugin, HivemindMixedPrecision)
        ):
            self.precision_plugin = HivemindMixedPrecision(
                plugin.device, self.reuse_grad_buffers, plugin.scaler
            )

    @override
    def setup_optimizers(self, trainer: Trainer) -> None:
        super().setup_optimizers(trainer)  # configure_optimizers, validated by Lightning
        torch_optimizer = checks.single_optimizer(self.optimizers, self.lr_scheduler_configs)
        _optimizers_to_device([torch_optimizer], self.root_device)
        self._start_dht()
        if self._diloco is not None:
            self._setup_diloco(torch_optimizer, self._diloco)
            return
        optimizer = self._make_hivemind_optimizer(torch_optimizer)
        self._optimizer = optimizer
        self._outcomes = count_outcomes(optimizer)
        self._rate_reader = SwarmRateReader(self.dht, self.run_id)
        self.lr_scheduler_configs = follow_swarm_epochs(
            self.lr_scheduler_configs, optimizer, self.scheduler_fn, self._hivemind_creates_optimizer
        )
        self.optimizers = [optimizer]
        if self.reuse_grad_buffers:
            assert self.lightning_module is not None
            self._zero_grad_switch.disable(self.lightning_module)

    def _setup_diloco(self, torch_optimizer: torch.optim.Optimizer, settings: DiLoCoSettings) -> None:
        """The module's optimizer as DiLoCo's inner one; its schedulers stay Lightning's, as configured."""
        tracker_opts = dict(self._tracker_opts)
        if self._owns_dht:
            tracker_opts.setdefault("private_key", RSAPrivateKey())
        kwargs = self._hivemind_kwargs
        optimizer = DiLoCoOptimizer(
            torch_optimizer,
            dht=self.dht,
            run_id=self.run_id,
            settings=settings,
            target_batch_size=self.target_batch_size,
            matchmaking_time=kwargs["matchmaking_time"],
            averaging_timeout=kwargs["averaging_timeout"],
            averager_opts=kwargs["averager_opts"],
            tracker_opts=tracker_opts,
            client_mode=self.dht.client_mode,
            compression=kwargs.get("grad_compression"),
        )
        self._optimizer = optimizer
        self._outcomes = optimizer.outcomes
        self._rate_reader = SwarmRateReader(self.dht, self.run_id)
        self.optimizers = [optimizer]

    def _start_dht(self) -> None:
        if self._dht is not None:
            address_opts = ("host_maddrs", "announce_maddrs", "identity_path", "authorizer", "extra")
            if self.initial_peers or any(self._dht_opts[key] for key in address_opts):
                log.warning("HivemindStrategy(dht=...) given: initial_peers and DHT options are ignored")
            return
        self._dht = start_dht(initial_peers=self.initial_peers, **self._dht_opts)
        self._owns_dht = True
        if not self.initial_peers:
            line = initial_peers_line(self._dht.get_visible_maddrs())
            log.info("Started a new swarm (run_id=%s). Other peers can join it with:\n%s", self.run_id, line)

    def _make_hivemind_optimizer(self, torch_optimizer: torch.optim.Optimizer) -> hivemind.Optimizer:
        tracker_opts = dict(self._tracker_opts)
        if self._owns_dht:
            # a key of our own, so peers forked from one parent never share a progress record
            tracker_opts.setdefault("private_key", RSAPrivateKey())
        return build_hivemind_optimizer(
            torch_optimizer,
            hivemind_creates_optimizer=self._hivemind_creates_optimizer,
            dht=self.dht,
            run_id=self.run_id,
            target_batch_size=self.target_batch_size,
            batch_size_per_step=self.batch_size,
            scheduler=self.scheduler_fn,
            client_mode=self.dht.client_mode,  # hivemind reads the mode from the DHT only when this is set
            tracker_opts=tracker_opts,
            **self._hivemind_kwargs,
        )

    # ------------------------------------------------------------------------------- training
    @override
    def on_train_start(self) -> None:
        module = self.lightning_module
        assert module is not None
        checks.check_trainer(module.trainer, self.reuse_grad_buffers)
        if self.batch_size is None:
            self._declared_batch_size = checks.declared_batch_size(module.trainer.train_dataloader)
        optimizer = self.optimizer
        if optimizer.tracker.global_progress.num_peers > 0:
            epoch = optimizer.tracker.global_epoch
            log.info("Joining swarm %s at epoch %d: downloading its state", self.run_id, epoch)
            started = time.monotonic()
            optimizer.load_state_from_peers()
            if optimizer.local_epoch >= epoch:
                took_s = time.monotonic() - started
                log.info(
                    "Joined swarm %s at epoch %d (state downloaded in %.1f s)", self.run_id, epoch, took_s
                )
            else:
                log.warning("No peer handed over its state: training from this peer's own state")
            self._sync_schedulers()
        if self._outcomes is not None:
            self._outcomes.start_counting_downloads()

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.batch_size is None:
            self._batch_samples = checks.leading_dim(batch)

    def _samples_in_step(self) -> int:
        if self.batch_size is not None:
            return self.batch_size
        if self._batch_samples is not None:
            return self._batch_samples
        if self._declared_batch_size is not None:
            return self._declared_batch_size
        raise HivemindStrategyError("batch size unknown: pass HivemindStrategy(..., batch_size=...)")

    @override
    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Callable[[], Any],
        model: LightningModule | torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        if isinstance(optimizer, DiLoCoOptimizer):
            optimizer.batch_samples = self._samples_in_step()
            self.local_samples += optimizer.batch_samples
            output = super().optimizer_step(optimizer, closure, model, **kwargs)
            self._log_swarm_metrics()
            return output
        if not isinstance(optimizer, hivemind.Optimizer):
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        samples = int(kwargs.setdefault("batch_size", self._samples_in_step()))
        tracker = optimizer.tracker
        epoch_before = optimizer.local_epoch
        accumulated_before = tracker.local_progress.samples_accumulated
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        # this step's work stays unless hivemind reset the accumulators (fp16 overflow) in the same epoch
        if optimizer.local_epoch != epoch_before:
            self.local_samples += samples
            self._sync_schedulers()
        elif tracker.local_progress.samples_accumulated > accumulated_before:
            self.local_samples += samples
        self._log_swarm_metrics()
        return output

    def _sync_schedulers(self) -> None:
        for config in self.lr_scheduler_configs:
            if isinstance(config.scheduler, SwarmEpochScheduler):
                config.scheduler.sync()

    def _log_swarm_metrics(self) -> None:
        """Log swarm metrics when the swarm changed, else once a second: cheap reads every step, the
        snapshot and Lightning's logging only when due (on short steps they cost more than the step)."""
        module = self.lightning_module
        if module is None or module._current_fx_name is None:  # not inside a hook that may log
            return
        seen = self.optimizer.tracker.global_progress
        if self._metrics_throttle.due((seen.epoch, seen.num_peers)):
            log_swarm_metrics(module, self.swarm_progress(), self.local_samples)

    # ---------------------------------------------------------------------------- checkpoints
    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The module's state; in DiLoCo mode with the global weights, the run's model (the local ones
        go into the optimizer's state: worker/strategy/diloco/model_state.py)."""
        state = super().lightning_module_state_dict()
        optimizer, module = self._optimizer, self.lightning_module
        if isinstance(optimizer, DiLoCoOptimizer) and module is not None:
            return global_model_state(module, state, optimizer.params, optimizer.global_weights())
        return state

    @override
    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """hivemind's state (optimizer statistics and ``local_epoch``), plus its scheduler if any."""
        inner = getattr(optimizer, "_optimizer", optimizer)  # LightningOptimizer -> optimizer
        if isinstance(inner, hivemind.Optimizer):
            return hivemind_state_dict(inner)
        if isinstance(inner, DiLoCoOptimizer):
            return inner.state_dict()
        return super().optimizer_state(inner)

    @override
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Restore optimizer state and swarm epoch; the peer then reports that epoch to the swarm."""
        for optimizer, saved in zip(self.optimizers, checkpoint["optimizer_states"], strict=False):
            if isinstance(optimizer, hivemind.Optimizer):
                load_hivemind_state_dict(optimizer, saved)
            else:
                optimizer.load_state_dict(saved)

    # ------------------------------------------------------------------------------- teardown
    @override
    def teardown(self) -> None:
        """Say goodbye to peers, stop the averagers, and stop the DHT if this strategy started it."""
        self._zero_grad_switch.restore()
        if self._optimizer is not None and self._rate_reader is not None:
            self.swarm_progress()  # remember the last view of the swarm
            self._rate_reader.close()
            self._rate_reader = None
            if isinstance(self._optimizer, DiLoCoOptimizer):
                self._optimizer.shutdown(keep_progress=self.keep_progress_record)
            elif self._optimizer.is_alive():
                shutdown_optimizer(self._optimizer, keep_progress=self.keep_progress_record)
            else:  # a signal ended its averagers (the agent's let SIGTERM and SIGINT pass; others may not)
                stop_orphaned_optimizer(self._optimizer)
        super().teardown()
        if self._owns_dht and self._dht is not None:
            self._dht.shutdown()
            self._dht = None
