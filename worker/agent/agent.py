"""``spotswarm-worker``: join a run, train in its swarm, heartbeat, checkpoint when asked, leave cleanly.

Lifecycle: register with the run's join token (retrying while the orchestrator is unreachable; falling
back to the registration cached in the worker directory) -> build the user's LightningModule and
DataModule -> start the DHT, decide whether to resume from the run's checkpoint -> train with
``HivemindStrategy`` while a heartbeat thread reports progress -> on a stop (orchestrator, SIGTERM,
spot notice, stop condition reached) finish the batch, save a final checkpoint if this worker is the
checkpointer, send a last heartbeat, deregister with the reason and exit. A watchdog makes sure the
worker is gone ``stop_grace_s`` after a stop request (or before a spot deadline) even if a step hangs.
An orchestrator that answers no heartbeat for ``orchestrator_lost_timeout_s`` is taken for gone: the
agent leaves the swarm without uploading or deregistering (it cannot) and exits with code 4.

Exit codes (see :mod:`worker.agent.config`): 0 left cleanly, 1 crashed / orchestrator unreachable at
registration (retryable), 2 bad command line, 3 permanent configuration error (bad token, module does
not import), 4 the orchestrator was gone for ``orchestrator_lost_timeout_s``.
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from worker import context
from worker.agent.boot import (
    Boot,
    OrchestratorUnavailable,
    PermanentError,
    RunCodeUnavailable,
    RunNotAccepting,
    build_user_objects,
    prepare_run_code,
    register,
)
from worker.agent.client import ApiError, Conflict, OrchestratorClient
from worker.agent.config import AgentSettings, parse_config
from worker.agent.cpus import pin_to_cpus
from worker.agent.state import AgentState, EarlyLeave
from worker.protocol.exit_codes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_ORCHESTRATOR_LOST
from worker.protocol.redaction import redact
from worker.protocol.runs import RunSpec
from worker.protocol.workers import DeregisterReason
from worker.runtime import lifeline, logsetup

logger = logging.getLogger("worker.agent")

SPOT_NOTICE_MARGIN_S = 15.0  # leave this long before the announced interruption time
# After a notice the worker trains on (its replacement starts meanwhile) and begins to leave this long
# before it must be gone: finish the batch, leave the averaging round, a final checkpoint, deregister.
SPOT_LEAVE_BUDGET_S = 30.0
SPOT_DEFAULT_WINDOW_S = 120.0  # EC2's usual notice when the notice's time cannot be read
EXIT_GUARD_S = 10.0  # interpreter shutdown (atexit joins of hivemind's processes) gets this long


def configure_logging(level: str, fmt: str | None = None, training: bool = False) -> None:
    """The shared set-up (worker/runtime/logsetup.py): run and worker in every line, text or JSON lines.

    hivemind's and Lightning's loggers are routed only once training starts (``training``): importing
    them takes seconds, and the agent's failure paths (bad token, module that does not import) stay fast.
    """
    logsetup.configure_logging(level, fmt, hivemind=training, lightning=training)


def seconds_until(iso_time: str, now: datetime | None = None) -> float | None:
    """Seconds from ``now`` until an ISO-8601 UTC time like ``2024-05-01T12:00:00Z``; None if unreadable."""
    try:
        when = datetime.fromisoformat(iso_time.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - (now or datetime.now(UTC))).total_seconds()


class Agent:
    """One worker's life from registration to exit; :meth:`run` returns the process exit code."""

    def __init__(self, config: AgentSettings) -> None:
        self.config = config
        self.state = AgentState(checkpoint_every_epochs=5)
        self.client = OrchestratorClient(config.url)
        self._leave_lock = threading.Lock()
        self._left = False
        self._finished = threading.Event()
        self._exit_code = EXIT_OK
        self._orchestrator_lost = False
        self.worker_id: str | None = None
        self._heartbeater: Any = None
        self._checkpointer: Any = None
        self._spot_watcher: Any = None
        self._dht: Any = None
        self._run: RunSpec | None = None  # the run this worker joined (its stop condition, batch)
        self._secrets: tuple[str, ...] = ()  # the run's secret_env values, masked in what is sent

    def run(self) -> int:
        self._install_signal_handlers()
        threading.Thread(target=self._watchdog, name="spotswarm-watchdog", daemon=True).start()
        try:
            boot = register(
                self.client, self.config, sleep=self._pause, stopping=lambda: self.state.stop is not None
            )
        except RunNotAccepting as exc:
            logger.warning("not joining: %s", exc)
            return self._done(EXIT_OK)
        except PermanentError as exc:
            logger.error("cannot join the run: %s", exc)
            return self._done(EXIT_CONFIG)
        except OrchestratorUnavailable as exc:
            logger.error("%s", exc)
            return self._done(EXIT_OK if self.state.stop else EXIT_FAILED)
        self._joined(boot)
        if self.state.stop is not None:
            return self._finish(EXIT_OK)
        # Heartbeats start at once: importing the user's code and building the swarm can take long on a
        # busy machine, and a silent worker would be declared lost while it is only starting.
        self._start_threads(boot)
        try:
            prepare_run_code(self.config, boot.registration)
            module, datamodule = build_user_objects(boot.registration.run)
        except PermanentError as exc:
            logger.error("%s", exc)
            self.state.request_stop(DeregisterReason.error, str(exc))
            return self._finish(EXIT_CONFIG)
        except RunCodeUnavailable as exc:
            logger.error("%s", exc)
            self.state.request_stop(DeregisterReason.error, str(exc))
            return self._finish(EXIT_FAILED)
        return self._finish(self._train(boot, module, datamodule))

    def _pause(self, seconds: float) -> None:
        """Sleep between registration attempts, cut short by a stop request."""
        self.state.stop_requested.wait(seconds)

    # -- joining ---------------------------------------------------------------------------------

    def _joined(self, boot: Boot) -> None:
        registration = boot.registration
        self.worker_id = registration.worker_id
        self.client.token = registration.worker_token
        logsetup.set_log_context(run=registration.run.name, worker=registration.worker_id)
        # From here on the run's secrets are in this process: no line it logs or sends may hold them.
        self._secrets = tuple(registration.secret_env.values())
        logsetup.set_log_secrets(self._secrets)
        context.publish(registration.worker_id, registration.worker_index, registration.num_workers)
        latest = registration.resume_checkpoint.epoch if registration.resume_checkpoint else None
        self.state.configure(registration.run.checkpoint_every_epochs, latest)
        self._run = registration.run
        logger.info(
            "registered%s: swarm %s, %d initial peer(s), heartbeat every %.1f s",
            " (from cache: orchestrator unreachable)" if boot.from_cache else "",
            registration.swarm_id,
            len(boot.initial_peers),
            registration.heartbeat_interval_s,
        )

    def _start_threads(self, boot: Boot) -> None:
        from worker.agent.checkpoints import Checkpointer
        from worker.agent.heartbeat import Heartbeater

        registration = boot.registration
        upload_client = OrchestratorClient(self.config.url, registration.worker_token, timeout_s=300.0)
        beat_client = OrchestratorClient(self.config.url, registration.worker_token, timeout_s=5.0, retries=1)
        self._checkpointer = Checkpointer(
            upload_client, registration.worker_id, self.state, self.config.worker_dir / "checkpoints"
        )
        self._heartbeater = Heartbeater(
            beat_client,
            self.state,
            registration.worker_id,
            registration.run.name,
            registration.heartbeat_interval_s,
            self.config.worker_dir,
            peers_refresh_s=self.config.peers_refresh_s,
            lost_timeout_s=self.config.orchestrator_lost_timeout_s,
            on_lost=self._on_orchestrator_lost,
        )
        self._heartbeater.start()
        self._start_spot_watcher()

    def _start_spot_watcher(self) -> None:
        from worker.agent.spot import SpotWatcher

        # Only where a launcher says there is an instance metadata service (the ec2 launcher sets
        # SPOTSWARM_METADATA_URL): a local worker must never probe the link-local metadata address.
        url = (self.config.metadata_url or "").strip()
        if url.lower() in {"off", "none", ""}:
            return
        self._spot_watcher = SpotWatcher(self._on_spot_notice, metadata_url=url)
        self._spot_watcher.start()

    # -- training --------------------------------------------------------------------------------

    def _train(self, boot: Boot, module: Any, datamodule: Any) -> int:
        """Train until a stop; returns the exit code and leaves the deregistration reason in the state."""
        from worker.agent import training
        from worker.agent.callback import AgentCallback
        from worker.strategy.checks import HivemindStrategyError

        registration = boot.registration
        configure_logging(self.config.log_level, self.config.log_format, training=True)
        options = training.split_strategy_options(registration.run.strategy_options, self.config)
        try:
            identity = options.dht.get("identity_path")
            authorizer = training.swarm_authorizer(registration, self.config, identity)
            self._dht = training.start_swarm_dht_retrying(
                boot.initial_peers, options.dht, authorizer, self._fresh_peers
            )
            training.keep_swarm_joined(self._dht, self.config.worker_dir, registration.run.name)
            ckpt_path = training.choose_resume_checkpoint(
                self._dht, registration, self.client, self.config.worker_dir, module
            )
            if self.state.stop is not None:
                return EXIT_OK  # stopped while starting: no point in setting up training
            callback = AgentCallback(
                self.state,
                self._checkpointer,
                registration.run.stop,
                registration.run.target_batch_size,
                report_metrics=tuple(registration.run.report_metrics),
                worker_id=registration.worker_id,
            )
            trainer = training.build_trainer(registration, self._dht, options.strategy, callback, self.config)
            training.fit(trainer, module, datamodule, ckpt_path)
        except (TypeError, HivemindStrategyError) as exc:
            if self.state.stop is not None:
                return self._stopped_despite(exc)
            message = f"unusable run spec: {type(exc).__name__}: {_first_line(exc)}"
            logger.exception("%s", message)
            self.state.request_stop(DeregisterReason.error, message)
            return EXIT_CONFIG
        except BaseException as exc:  # training may fail anyhow; reported, then exit 1
            if self.state.stop is not None:
                return self._stopped_despite(exc)
            if _refused_as_ended(exc):  # the run ended (or dropped this worker) while it started
                message = f"the orchestrator no longer wants this worker: {_first_line(exc)}"
                logger.warning("%s", message)
                self.state.request_stop(DeregisterReason.stopped, message)
                return EXIT_OK
            message = f"training failed: {type(exc).__name__}: {_first_line(exc)}"
            logger.exception("%s", message)
            self.state.request_stop(DeregisterReason.error, message)
            return EXIT_FAILED
        if self.state.stop is None:
            self.state.request_stop(DeregisterReason.completed, "training ended")
        return EXIT_OK

    def _fresh_peers(self) -> list[str]:
        """The run's current initial peers from the orchestrator ([] if it does not answer)."""
        if self._run is None:
            return []
        try:
            return self.client.run_peers(self._run.name).initial_peers
        except ApiError as exc:
            logger.info("could not refresh the initial peers: %s", exc)
            return []

    def _stopped_despite(self, exc: BaseException) -> int:
        """Training raised after a stop request (Lightning's SIGTERM exit, a peer shut down): still clean."""
        if not isinstance(exc, SystemExit):
            logger.warning("training ended with %s after the stop request", type(exc).__name__)
        return EXIT_OK

    # -- leaving ---------------------------------------------------------------------------------

    def _finish(self, exit_code: int) -> int:
        """Upload the last checkpoint, send a final heartbeat, deregister, stop the DHT; return the code.

        Without an orchestrator (:meth:`_on_orchestrator_lost`) only the local part is done.
        """
        lost = self._orchestrator_lost
        self._exit_code = exit_code = EXIT_ORCHESTRATOR_LOST if lost else exit_code
        stop = self.state.stop
        remaining_s = max(0.0, self._leave_deadline() - time.monotonic()) if stop else 30.0
        if self._checkpointer is not None:
            if not lost and not self._checkpointer.flush(timeout_s=max(0.0, remaining_s - 3.0)):
                logger.warning(
                    "the last checkpoint upload did not finish within the stop grace; what was not "
                    "uploaded stays in %s",
                    self.config.worker_dir / "checkpoints",
                )
            self._checkpointer.close()
        if self._heartbeater is not None:
            self._heartbeater.halt(final_phase=None if lost else "stopping", timeout_s=2.0)
        if stop is not None and not lost:
            self._leave(stop.reason, stop.message)
        if self._spot_watcher is not None:
            self._spot_watcher.stop(timeout_s=1.0)
        if self._dht is not None:
            self._dht.shutdown()
        return self._done(exit_code)

    def _leave(self, reason: DeregisterReason, message: str | None) -> None:
        """Deregister once (from whichever thread gets here first); an unreachable orchestrator is logged."""
        with self._leave_lock:
            if self._left or self.worker_id is None:
                return
            self._left = True
            if reason == DeregisterReason.stopped and self._condition_reached():
                reason = DeregisterReason.completed
            if message is not None:  # the first line of a user's exception may quote a credential
                message = redact(message, self._secrets)
            # exit code 3 is the agent's verdict that no worker could use the run's spec
            unusable = reason == DeregisterReason.error and self._exit_code == EXIT_CONFIG
            try:
                self.client.deregister(
                    self.worker_id,
                    reason,
                    message,
                    unusable_spec=unusable,
                    metrics=dict(self.state.progress.metrics),
                )
            except ApiError as exc:
                logger.warning("could not deregister (%s): %s", reason.value, exc)
                return
            logger.info("deregistered: %s%s", reason.value, f" ({message})" if message else "")

    def _condition_reached(self) -> bool:
        if self._run is None:
            return False
        progress = self.state.progress
        epoch = max(progress.swarm_epoch, progress.local_epoch)
        return self._run.stop.reached(epoch, self._run.target_batch_size)

    def _done(self, exit_code: int) -> int:
        self._finished.set()
        logger.info("exiting with code %d", exit_code)
        return exit_code

    # -- signals, spot notices and the watchdog --------------------------------------------------

    def _install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        os.register_at_fork(after_in_child=_let_stop_signals_pass)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.state.stop is not None:
            raise KeyboardInterrupt
        self.state.request_stop(DeregisterReason.stopped, f"received {signal.Signals(signum).name}")

    def _on_spot_notice(self, notice: Any) -> None:
        """Say ``leaving`` in heartbeats at once (the orchestrator launches the replacement now), train
        on, and start to leave :data:`SPOT_LEAVE_BUDGET_S` before the process must be gone; a notice too
        short for that is a stop now."""
        until_s = seconds_until(notice.time)
        window_s = SPOT_DEFAULT_WINDOW_S if until_s is None else until_s
        within_s = max(5.0, window_s - SPOT_NOTICE_MARGIN_S)
        train_on_s = max(0.0, within_s - SPOT_LEAVE_BUDGET_S)
        message = f"spot interruption notice: {notice.action} at {notice.time or 'unknown time'}"
        logger.warning("%s; training on for %.0f s, gone within %.0f s", message, train_on_s, within_s)
        if train_on_s <= 0:  # too short to train on: leave now, and be replaced when gone
            self.state.request_stop(DeregisterReason.interrupted, message, within_s=within_s)
            return
        gone_at = time.monotonic() + within_s

        def leave_now() -> None:
            self.state.request_stop(
                DeregisterReason.interrupted, message, within_s=max(0.0, gone_at - time.monotonic())
            )

        # sooner when no round of this worker's remains by then (worker/agent/callback.py)
        self.state.mark_leaving(EarlyLeave(at=time.time() + train_on_s, now=leave_now))
        leave = threading.Timer(train_on_s, leave_now)
        leave.name, leave.daemon = "spot-leave", True
        leave.start()

    def _on_orchestrator_lost(self, silent_s: float) -> None:
        """No heartbeat answered for ``orchestrator_lost_timeout_s``: leave, nobody collects this work."""
        message = (
            f"the orchestrator answered no heartbeat for {silent_s:.0f} s "
            f"(--orchestrator-lost-timeout-s {self.config.orchestrator_lost_timeout_s:g}): leaving the swarm"
        )
        logger.error("%s", message)
        self._orchestrator_lost = True
        self._exit_code = EXIT_ORCHESTRATOR_LOST  # also what the watchdog exits with
        self.state.request_stop(DeregisterReason.stopped, message)

    def _leave_deadline(self) -> float:
        """When the process must be gone: a spot notice's own deadline, else the stop grace."""
        stop = self.state.stop
        if stop is None:
            return float("inf")
        if stop.reason == DeregisterReason.interrupted:
            return stop.deadline
        return min(stop.deadline, self.state.stop_requested_at + self.config.stop_grace_s)

    def _watchdog(self) -> None:
        """After a stop request, make sure the process is gone by the deadline, whatever hangs."""
        self.state.stop_requested.wait()
        while not self._finished.wait(timeout=0.5):
            if time.monotonic() < self._leave_deadline():
                continue
            stop = self.state.stop
            logger.error("still running %.0f s after the stop request: leaving now", self.config.stop_grace_s)
            if stop is not None and not self._orchestrator_lost:
                self._leave(stop.reason, stop.message)
            logging.shutdown()
            os._exit(self._exit_code)


def _let_stop_signals_pass() -> None:
    """In every process this one forks (hivemind's DHT and averagers, DataLoader workers), SIGTERM and
    SIGINT do nothing: sent to the worker's whole process group (systemd's default stop, ``kill --
    -PGID``, a terminal's Ctrl-C), they are the agent's to act on, and it stops its children in order as
    it leaves. They used to end hivemind's processes at once, and a training step that then waited on
    one of them never returned: the agent left at its watchdog, without its final checkpoint. A handler
    rather than ``SIG_IGN``, which would pass to the programs they start: ``p2pd`` must still stop at
    hivemind's SIGTERM (and runs in a session of its own, out of reach of the group's:
    ``worker/_hivemind_compat.py p2pd_in_own_session``)."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _pass)


def _pass(signum: int, frame: FrameType | None) -> None:
    """The stop signals in a forked child: for its parent (:func:`_let_stop_signals_pass`)."""


def stop_leftover_children() -> None:
    """SIGKILL what an orderly leave did not stop of this process's ``multiprocessing`` children: they
    let SIGTERM pass (:func:`_let_stop_signals_pass`), so the exit handler of ``multiprocessing``, which
    terminates and then joins them, would wait on them for good."""
    for child in multiprocessing.active_children():
        child.kill()


def _exit_guard(exit_code: int, timeout_s: float) -> None:
    """Leave with ``exit_code`` even if interpreter shutdown hangs (e.g. joining a stuck child)."""

    def force() -> None:
        time.sleep(timeout_s)
        os._exit(exit_code)

    threading.Thread(target=force, name="spotswarm-exit-guard", daemon=True).start()


def _refused_as_ended(exc: BaseException) -> bool:
    """Whether ``exc`` comes from the orchestrator refusing a call with a 409 (``Conflict``): the run
    has ended or this worker has, as when a run fails while its replacement is still fetching its swarm
    token. A stop, not a failure of training: its error would count against the run."""
    seen: BaseException | None = exc
    for _ in range(8):  # the chain of causes, bounded
        if seen is None:
            return False
        if isinstance(seen, Conflict):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:500]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``spotswarm-worker``; returns the exit code."""
    config = parse_config(argv)
    configure_logging(config.log_level, config.log_format)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <pid>`: dump every stack
    if config.cpus:
        pin_to_cpus(config.cpus)  # before the agent starts a thread: each one inherits the cores
    config.worker_dir.mkdir(parents=True, exist_ok=True)
    # hivemind forks its DHT and averagers: none may outlive an agent killed with SIGKILL
    lifeline.forked_children_exit_with_parent()
    exit_code = Agent(config).run()
    stop_leftover_children()
    _exit_guard(exit_code, EXIT_GUARD_S)
    return exit_code
