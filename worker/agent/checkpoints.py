"""Checkpoints seen from a worker: when the checkpointer saves, how it uploads, and when to resume.

Saving happens in the training thread at a safe point (between batches); uploading happens in a
background thread so training goes on meanwhile. At most one upload runs at a time; if a newer
checkpoint is saved while an older one still waits, the older one is dropped. An upload the orchestrator
does not answer (down, restarting) is retried every ``retry_interval_s`` until it succeeds, a newer
checkpoint replaces it, or the agent closes the checkpointer (when its stop grace runs out): then the
file stays in the checkpoint directory and the log names it.

Resume rule: a worker loads the run's latest checkpoint unless a live peer of the swarm is at that
epoch or later; then it joins the swarm and the strategy downloads the state from peers. Either way the
swarm epoch never goes back. "Live" means a progress record in the DHT written within
:func:`live_record_max_age_s`: a training peer rewrites its record at every step and at least every
``metadata_expiration / 2`` seconds, while a dead peer's last record lingers until it expires.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from worker.agent.client import ApiError, NotFound, OrchestratorClient, Unreachable
from worker.agent.state import AgentState
from worker.protocol.paths import ApiPath
from worker.protocol.workers import CheckpointRef

logger = logging.getLogger(__name__)

LIVE_RECORD_SLACK_S = 5.0


def live_record_max_age_s(metadata_expiration_s: float) -> float:
    """Age beyond which a peer's progress record no longer proves that the peer is alive."""
    return metadata_expiration_s / 2 + LIVE_RECORD_SLACK_S


class Checkpointer:
    """Saves and uploads the run's checkpoints while this worker holds the checkpointer role."""

    def __init__(
        self,
        client: OrchestratorClient,
        worker_id: str,
        state: AgentState,
        tmp_dir: Path,
        retry_interval_s: float = 2.0,
    ) -> None:
        self._client = client
        self._retry_interval_s = retry_interval_s
        self._worker_id = worker_id
        self._state = state
        self._tmp_dir = tmp_dir
        self._tmp_dir.mkdir(parents=True, exist_ok=True)
        self._last_saved_epoch: int | None = None
        self._cond = threading.Condition()
        self._pending: tuple[int, Path] | None = None
        self._uploading = False
        self._closed = False
        self.uploaded_epochs: list[int] = []
        self._thread = threading.Thread(target=self._upload_loop, name="spotswarm-upload", daemon=True)
        self._thread.start()

    def due(self, epoch: int) -> bool:
        """True if this worker is the checkpointer and ``epoch`` crossed a multiple of the cadence."""
        if not self._state.checkpointer or epoch <= 0:
            return False
        every = self._state.checkpoint_every_epochs
        known = [e for e in (self._last_saved_epoch, self._state.latest_checkpoint_epoch) if e is not None]
        if not known:
            return epoch >= every
        return epoch // every > max(known) // every

    def needs_final(self, epoch: int) -> bool:
        """True if this worker checkpoints and the state at ``epoch`` is newer than the stored one."""
        if not self._state.checkpointer or epoch <= 0:
            return False
        known = [e for e in (self._last_saved_epoch, self._state.latest_checkpoint_epoch) if e is not None]
        return not known or epoch > max(known)

    def save(self, trainer: Any, epoch: int) -> None:
        """Write a checkpoint of ``trainer`` (call between batches) and queue it for upload."""
        path = self._tmp_dir / f"epoch-{epoch:08d}.ckpt"
        began = time.monotonic()
        # The whole state (optimizer, loops, callbacks): a resuming worker goes on from it. Said, not left to
        # Lightning's default, which logs that it chose it at every save.
        trainer.save_checkpoint(str(path), weights_only=False)
        self._last_saved_epoch = epoch
        logger.info(
            "worker %s: saved checkpoint of epoch %d (%.1f s)",
            self._worker_id,
            epoch,
            time.monotonic() - began,
        )
        with self._cond:
            if self._pending is not None:
                self._pending[1].unlink(missing_ok=True)
            self._pending = (epoch, path)
            self._cond.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until queued uploads are done; False if time ran out."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending is not None or self._uploading:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _upload_loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                (epoch, path), self._pending = self._pending, None
                self._uploading = True
            keep = False
            try:
                keep = self._upload_retrying(epoch, path)
            finally:
                if keep:
                    logger.error(
                        "worker %s: checkpoint of epoch %d was not uploaded; it is kept at %s",
                        self._worker_id,
                        epoch,
                        path,
                    )
                else:
                    path.unlink(missing_ok=True)
                with self._cond:
                    self._uploading = False
                    self._cond.notify_all()

    def _upload_retrying(self, epoch: int, path: Path) -> bool:
        """Upload, retrying while the orchestrator is unreachable; True if the file must be kept."""
        while True:
            try:
                return not self._upload(epoch, path)
            except Unreachable as exc:
                with self._cond:
                    if self._pending is None and not self._closed:
                        logger.warning(
                            "worker %s: orchestrator unreachable (%s); retrying the upload of checkpoint "
                            "%d in %.0f s",
                            self._worker_id,
                            exc,
                            epoch,
                            self._retry_interval_s,
                        )
                        self._cond.wait(self._retry_interval_s)
                    if self._pending is not None:
                        return False  # a newer checkpoint replaces this one
                    if self._closed:
                        return True

    def _upload(self, epoch: int, path: Path) -> bool:
        """One upload (with the client's own retries); False when the orchestrator refused it."""
        began = time.monotonic()
        try:
            self._client.upload_checkpoint(self._worker_id, epoch, path)
        except Unreachable:
            raise
        except ApiError as exc:
            logger.error("worker %s: upload of checkpoint %d failed: %s", self._worker_id, epoch, exc)
            return False
        self._state.checkpoint_uploaded(epoch)
        self.uploaded_epochs.append(epoch)
        logger.info(
            "worker %s: uploaded checkpoint of epoch %d (%d bytes, %.1f s)",
            self._worker_id,
            epoch,
            path.stat().st_size,
            time.monotonic() - began,
        )
        return True


def live_peer_epochs(progress_records: Mapping[Any, Any] | None, now: float, max_age_s: float) -> list[int]:
    """Epochs of the peers whose progress record (hivemind's ``<swarm_id>_progress`` key) is fresh.

    ``progress_records`` maps a peer's subkey to a record with ``value`` (a dict with ``epoch`` and
    ``time``) as ``dht.get(..., latest=True).value`` returns it; malformed records are ignored.
    """
    epochs = []
    for record in (progress_records or {}).values():
        value = getattr(record, "value", record)
        if not isinstance(value, Mapping):
            continue
        epoch, reported_at = value.get("epoch"), value.get("time")
        if (
            isinstance(epoch, int)
            and isinstance(reported_at, (int, float))
            and now - reported_at <= max_age_s
        ):
            epochs.append(epoch)
    return epochs


def should_resume(checkpoint: CheckpointRef | None, live_epochs: list[int]) -> bool:
    """Load ``checkpoint`` only if no live peer already holds that epoch or a later one."""
    return checkpoint is not None and (not live_epochs or max(live_epochs) < checkpoint.epoch)


def read_live_peer_epochs(dht: Any, swarm_id: str, max_age_s: float, timeout_s: float = 10.0) -> list[int]:
    """Ask the DHT which peers of ``swarm_id`` are training now, and at which epoch."""
    from hivemind.utils.timed_storage import get_dht_time

    found = dht.get(f"{swarm_id}_progress", latest=True, return_future=True).result(timeout=timeout_s)
    return live_peer_epochs(getattr(found, "value", None), get_dht_time(), max_age_s)


def fetch_checkpoint(
    client: OrchestratorClient, run_name: str, checkpoint: CheckpointRef, worker_dir: Path
) -> Path:
    """Download ``checkpoint`` into ``worker_dir/resume/`` and verify its SHA-256.

    If it was pruned meanwhile (404: the run keeps only its newest few), the run's latest checkpoint is
    downloaded instead, verified against the checksum header of the answer.
    """
    dest = worker_dir / "resume" / "resume.ckpt"
    try:
        return client.download_checkpoint(checkpoint.download_path, dest, checkpoint.sha256)
    except NotFound:
        logger.info("checkpoint of epoch %d is gone; downloading the run's latest", checkpoint.epoch)
        return client.download_checkpoint(ApiPath.run_latest_checkpoint.format(name=run_name), dest)
