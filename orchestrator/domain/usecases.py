"""The use cases routes call: each owns its transaction and the store, and signals "changed" once.

A route parses the request, calls one method of :class:`UseCases` and shapes the answer. A use case runs
its checks once, opens its own transaction (the rules it calls, ``runs.py``, ``workers.py``,
``checkpoints.py``, take that session and never commit), touches the checkpoint store after the commit,
and then, when the commit changed what the heartbeat cache holds, calls ``changed`` once: the cache
reloads what the commit changed (a worker's state,
its run's, the latest checkpoint the heartbeat replies name). ``create_app`` wires ``changed`` to the
hub's reload (``api/deps.py``: :func:`~orchestrator.api.deps.get_use_cases`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from orchestrator.clock import Clock
from orchestrator.db.models import Run
from orchestrator.db.session import Database
from orchestrator.domain import checkpoints, crash_budget, packages, runs, workers
from orchestrator.domain.states import ACTIVE_RUN_STATES
from orchestrator.domain.sync import with_sync
from orchestrator.errors import Conflict, InvalidRequest, RunExists, ServiceError
from orchestrator.importcheck.checker import ImportChecker
from orchestrator.importcheck.names import check_package_names
from orchestrator.launchers.base import Launcher, LauncherConfigError
from orchestrator.progress import SwarmProgressCache
from orchestrator.storage.base import (
    CheckpointNotFound,
    CheckpointStore,
    checkpoint_key,
    copy_to_file,
    package_key,
)
from worker.protocol.runs import RunSpec, StopCondition
from worker.protocol.trainer import trainer_option_in_strategy_options
from worker.protocol.workers import CheckpointRef, Deregister

logger = logging.getLogger(__name__)

#: Called once after a use case committed: the heartbeat cache reloads (``HeartbeatHub.refresh``).
Changed = Callable[[], None]
#: Reads one run's swarm progress from the DHT now, into the progress cache (``AppContext.read_swarm_now``).
SwarmReadNow = Callable[[int], None]


@dataclass(frozen=True)
class Created:
    """A created run: its name and its join token (shown only this once)."""

    name: str
    join_token: str


@dataclass(frozen=True)
class UseCases:
    """The operations that change runs, workers and checkpoints, over the parts they share."""

    db: Database
    clock: Clock
    store: CheckpointStore
    swarm: SwarmProgressCache
    changed: Changed

    # -- runs ----------------------------------------------------------------------------------------

    def create_run(
        self,
        spec: RunSpec,
        launchers: Mapping[str, Launcher],
        imports: ImportChecker | None,
        claims: packages.PackageClaims,
    ) -> Created:
        """Check the spec (name free, secrets given, launcher options, strategy options, the package it
        names is stored, its code imports), then insert a pending run. Raises the typed error of the
        first check that fails; then the package the spec names is deleted unless a run names it (or
        another create is checking it)."""
        try:
            with claims.claim(spec.workdir):
                created = self._checked_and_created(spec, launchers, imports)
        except ServiceError:
            if spec.workdir is not None:
                packages.forget_if_unnamed(self.db, self.store, claims, spec.workdir)
            raise
        self.changed()
        return created

    def _checked_and_created(
        self, spec: RunSpec, launchers: Mapping[str, Launcher], imports: ImportChecker | None
    ) -> Created:
        # The spec is checked and stored with its sync mode named (with_sync).
        spec = with_sync(spec)
        with self.db.read() as session:  # before the import check, which takes seconds
            if session.scalar(select(Run.id).where(Run.name == spec.name)) is not None:
                raise RunExists(f"a run named {spec.name!r} exists already")
        runs.require_secret_values(spec)
        _check_launcher(launchers, spec)
        # here, not in RunSpec: runs stored before the rule must still read (the import check does the rest)
        misplaced = trainer_option_in_strategy_options(spec.strategy_options)
        if misplaced:
            raise InvalidRequest(f"strategy_options: {misplaced}")
        fetch = self._package_fetcher(spec.workdir) if spec.workdir is not None else None
        if imports is not None:
            imports.check_spec(spec, fetch)
        with self.db.begin() as session:
            run, join_token = runs.create_run(session, spec, self.clock())
            return Created(run.name, join_token)

    def _package_fetcher(self, digest: str) -> Callable[[Path], None]:
        """A function that copies the stored package ``digest`` to a path; InvalidRequest if none is."""
        key = package_key(digest)
        try:
            self.store.size(key)
        except CheckpointNotFound as exc:
            raise InvalidRequest(
                f"workdir: no package {digest} is stored; upload it first (PUT /api/v1/packages/"
                "{sha256}: spotswarm runs create --workdir DIR does both)"
            ) from exc
        check_package_names(self.store, key)  # its own 'worker' or 'orchestrator' could never be imported

        def fetch(dest: Path) -> None:
            copy_to_file(self.store, key, dest)

        return fetch

    def scale_run(self, name: str, desired: int, min_workers: int | None, max_workers: int | None) -> None:
        """422 when desired is outside [min, max]; 409 unless the run is pending or running."""
        with self.db.begin() as session:
            run = runs.get_run(session, name, for_update=True)
            runs.scale_run(session, run, desired, self.clock(), min_workers, max_workers)
        self.changed()

    def stop_run(self, name: str, reason: str) -> None:
        """Workers are told to stop at their next heartbeat (``runs.stop_run``)."""
        with self.db.begin() as session:
            run = runs.get_run(session, name, for_update=True)
            runs.stop_run(session, run, reason, self.clock())
        self.changed()

    def resume_run(self, name: str, stop: StopCondition | None) -> None:
        """Back to pending (``runs.resume_run``); the swarm counts again from the checkpoint's epoch."""
        with self.db.begin() as session:
            run = runs.get_run(session, name, for_update=True)
            runs.resume_run(session, run, self.clock(), stop)
        self.swarm.forget(run.swarm_id)
        self.changed()

    def rotate_join_token(self, name: str) -> str:
        """A new join token for the run (shown once); the old one stops working at once. Nothing the
        heartbeat cache holds changes (workers keep their tokens): no signal."""
        with self.db.begin() as session:
            run = runs.get_run(session, name, for_update=True)
            return runs.rotate_join_token(session, run, self.clock())

    def revoke_manual_workers(self, name: str) -> list[int]:
        """End the run's workers joined by hand; their ids. The heartbeat cache refuses their tokens."""
        with self.db.begin() as session:
            run = runs.get_run(session, name, for_update=True)
            revoked = workers.revoke_manual_workers(session, run, self.clock())
        self.changed()
        return revoked

    def delete_run(self, name: str) -> None:
        """Delete a finished run with its rows, then its checkpoints from the store (a failed delete
        there is logged)."""
        with self.db.begin() as session:
            run = runs.get_run(session, name, for_update=True)
            keys = runs.delete_run(session, run)
        for key in keys:
            self._delete_stored(name, key)
        self.changed()

    # -- workers -------------------------------------------------------------------------------------

    def worker_leaves(
        self,
        worker_id: int,
        body: Deregister,
        crash_policy: crash_budget.CrashPolicy | None,
        settle: Callable[[int], None],
    ) -> None:
        """The worker leaves the run (``workers.deregister_worker``), once ``settle(worker_id)`` wrote what
        it reported (``AppContext.settle_heartbeats``), so that its last heartbeat counts."""
        settle(worker_id)
        with self.db.begin() as session:
            worker = runs.get_worker(session, worker_id)
            workers.deregister_worker(
                session,
                worker,
                body.reason,
                body.message,
                self.clock(),
                crash_policy,
                unusable_spec=body.unusable_spec,
                metrics=body.metrics,
            )
        self.changed()

    # -- checkpoints ---------------------------------------------------------------------------------

    def checkpoint_unloadable(self, run_id: int, worker_id: int, epoch: int, message: str) -> None:
        """Record that a worker could not load the checkpoint of ``epoch`` (an event); nothing else
        changes, so no signal."""
        with self.db.begin() as session:
            checkpoints.record_resume_failure(session, run_id, worker_id, epoch, message, self.clock())

    def admit_checkpoint(self, run_id: int, worker_id: int, epoch: int, read_swarm_now: SwarmReadNow) -> None:
        """Raise unless the worker may upload a checkpoint of ``epoch`` now (``checkpoints.check_upload``);
        the checkpointer's claim of an epoch the periodic reader has not seen has the DHT read again."""
        run = self._run(run_id, worker_id)
        try:
            checkpoints.check_upload(run, worker_id, epoch, self._dht_epoch(run))
        except Conflict:
            if run.checkpointer_worker_id != worker_id:
                raise
            # The checkpointer's own DHT peer may hold an epoch the periodic reader has not seen yet.
            read_swarm_now(run.id)
            checkpoints.check_upload(run, worker_id, epoch, self._dht_epoch(run))

    def upload_checkpoint(
        self, run_id: int, worker_id: int, epoch: int, path: Path, sha256: str, size: int
    ) -> CheckpointRef:
        """Store the received checkpoint file and record it; the same bytes again return the stored one.
        Raises Conflict for a run that takes no checkpoints, or when the epoch is stored with other bytes.
        The checkpoints pruned past ``keep_checkpoints`` are deleted from the store."""
        with self.db.read() as session:
            run = session.get(Run, run_id)
            if run is None:
                raise Conflict(f"worker {worker_id}'s run no longer exists")
            previous = checkpoints.existing_upload(session, run, epoch, sha256)
            if previous is not None:
                return checkpoints.to_ref(run, previous)
            if run.state not in ACTIVE_RUN_STATES:
                raise Conflict(f"run {run.name!r} is {run.state}; it takes no checkpoints")
            key = checkpoint_key(run.swarm_id, epoch, sha256)
        self.store.put_file(key, path, sha256)
        try:
            ref, dropped = self._record(run.name, worker_id, epoch, key, sha256, size)
        except Conflict:
            self.store.delete(key)  # another upload of this epoch, with other bytes, was recorded first
            raise
        for old_key in dropped:  # its own key too when an older epoch arrived late and was pruned at once
            self.store.delete(old_key)
        self.changed()
        return ref

    def _record(
        self, name: str, worker_id: int, epoch: int, key: str, sha256: str, size: int
    ) -> tuple[CheckpointRef, list[str]]:
        """Record the stored object; the ref and the keys of pruned checkpoints. Raises Conflict."""
        with self.db.begin() as session:
            run = runs.get_run(session, name, for_update=True)
            if (previous := checkpoints.existing_upload(session, run, epoch, sha256)) is not None:
                return checkpoints.to_ref(run, previous), []  # a concurrent retry of the same upload won
            stored, dropped = checkpoints.record_checkpoint(
                session,
                run,
                epoch=epoch,
                key=key,
                size_bytes=size,
                sha256=sha256,
                worker_id=worker_id,
                now=self.clock(),
            )
            return checkpoints.to_ref(run, stored), dropped

    def delete_checkpoints(
        self, name: str, *, epoch: int | None = None, uploaded_by: int | None = None
    ) -> list[CheckpointRef]:
        """Delete the run's checkpoint of ``epoch``, or every one ``uploaded_by`` uploaded; the deleted.
        404 when there is none."""
        with self.db.begin() as session:
            run = runs.get_run(session, name, for_update=True)
            deleted = checkpoints.delete_checkpoints(
                session, run, self.clock(), epoch=epoch, uploaded_by=uploaded_by
            )
            items = [checkpoints.to_ref(run, c) for c in deleted]
        for checkpoint in deleted:
            self._delete_stored(name, checkpoint.key)
        self.changed()  # the heartbeat replies' latest checkpoint epoch
        return items

    # -- helpers -------------------------------------------------------------------------------------

    def _run(self, run_id: int, worker_id: int) -> Run:
        with self.db.read() as session:
            run = session.get(Run, run_id)
        if run is None:
            raise Conflict(f"worker {worker_id}'s run no longer exists")
        return run

    def _dht_epoch(self, run: Run) -> int | None:
        progress = self.swarm.get(run.swarm_id)
        return progress.epoch if progress is not None else None

    def _delete_stored(self, name: str, key: str) -> None:
        try:
            self.store.delete(key)
        except (OSError, CheckpointNotFound) as exc:
            logger.warning("run %s: could not delete checkpoint %s: %s", name, key, exc)


def _check_launcher(launchers: Mapping[str, Launcher], spec: RunSpec) -> None:
    """422 for a launcher this orchestrator lacks, or options it would refuse at every launch."""
    if not launchers:
        return
    launcher = launchers.get(spec.launcher)
    if launcher is None:
        raise InvalidRequest(f"launcher: unknown {spec.launcher!r}; available: {sorted(launchers)}")
    try:
        launcher.validate_options(spec.launcher_options, workers=spec.desired_workers)
    except LauncherConfigError as exc:
        raise InvalidRequest(f"launcher_options: {exc}") from exc
