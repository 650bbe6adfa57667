"""Worker operations: launch intents (for the reconciler), registration, leaving, retiring.

State changes go through :func:`orchestrator.domain.runs.set_worker_state`. The reconciler's order for a
launch is: ``intent = create_launch_intent(...)``; commit; ``launcher.launch(LaunchRequest(
intent.worker.request_id, run.name, env={... "SPOTSWARM_TOKEN": intent.token ...}))``. The launch token
lets the worker register without the run's join token (which is never stored in clear). After a
restart, a ``launching`` row whose launch never happened gets a new token from
:func:`reissue_launch_token`.

Who binds which row at registration:

- a **launch token** binds its own row and gets a fresh worker token. It stays usable (each use issues
  a new worker token: the earlier reply may have been lost) until the worker has used its worker token
  once: the heartbeat writer voids it (``heartbeats/writer.py``). It may sit in EC2 user data for the
  instance's life; from then on it grants nothing.
- a **worker token** re-binds its own row and keeps itself (an agent restarted with its cached
  registration, a lost worker come back).
- a **join token** always makes a new, manual row (never someone else's: request ids are public), at
  most up to the run's ``max_workers`` live workers, at the rate the caller's limiter allows.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator import tokens
from orchestrator.db.models import Run, Worker
from orchestrator.domain import crash_budget, events, runs
from orchestrator.domain.roster import lock_run, lock_run_of_join_token, per_transaction, roster
from orchestrator.domain.states import ACCEPTING_RUN_STATES, ENDED_WORKER_STATES, LIVE_WORKER_STATES
from orchestrator.errors import Conflict, Forbidden, RunNotAcceptingWorkers, Unauthorized
from orchestrator.ratelimit import RateLimiter
from worker.protocol.metrics import select_metrics
from worker.protocol.runs import RunState
from worker.protocol.workers import DeregisterReason, WorkerRegister, WorkerState

DEREGISTER_STATES: dict[DeregisterReason, WorkerState] = {
    DeregisterReason.interrupted: WorkerState.interrupted,
    DeregisterReason.stopped: WorkerState.exited,
    DeregisterReason.completed: WorkerState.exited,
    DeregisterReason.error: WorkerState.failed,
}


@dataclass(frozen=True)
class LaunchIntent:
    """A ``launching`` worker row and the launch token to hand to the launcher (shown only here)."""

    worker: Worker
    token: str


@dataclass(frozen=True)
class Registration:
    worker: Worker
    run: Run
    token: str


def _new_worker(run: Run, request_id: str, launcher: str, state: WorkerState, now: datetime) -> Worker:
    return Worker(
        run_id=run.id,
        run=run,
        request_id=request_id,
        launcher=launcher,
        manual=False,
        state=state,
        state_reason="",
        hostname="",
        peer_maddrs=[],
        launch_details={},
        created_at=now,
        local_step=0,
        swarm_epoch=0,
        samples=0,
        samples_per_s=0.0,
        num_peers=0,
        phase="starting",
    )


def new_request_id(run: Run) -> str:
    """A unique, file-name-safe request id: ``<run name>-<12 hex>`` (at most 61 characters)."""
    return f"{run.name[:48]}-{secrets.token_hex(6)}"


def create_launch_intent(
    session: Session, run: Run, now: datetime, launch_details: dict[str, Any] | None = None
) -> LaunchIntent:
    """Write a ``launching`` worker row with a fresh request id BEFORE the launcher is called.

    Raises :class:`RunNotAcceptingWorkers` when the run is not pending or running.
    """
    if run.state not in ACCEPTING_RUN_STATES:
        raise RunNotAcceptingWorkers(f"run {run.name!r} is {run.state}; it takes no new workers")
    token = tokens.new_token(tokens.LAUNCH_PREFIX)
    worker = _new_worker(run, new_request_id(run), run.launcher, WorkerState.launching, now)
    worker.launch_token_hash = tokens.hash_token(token)
    worker.launch_details = dict(launch_details or {})
    session.add(worker)
    session.flush()
    events.record_event(session, run.id, "worker.launching", f"request {worker.request_id}", now, worker.id)
    return LaunchIntent(worker, token)


def reissue_launch_token(worker: Worker) -> str:
    """A new launch token for a ``launching`` worker (the old one stops working).

    Raises :class:`Conflict` when the worker has registered already.
    """
    if worker.state != WorkerState.launching:
        raise Conflict(f"worker {worker.id} is {worker.state}; only launching workers get a new token")
    token = tokens.new_token(tokens.LAUNCH_PREFIX)
    worker.launch_token_hash = tokens.hash_token(token)
    return token


def set_launch_details(worker: Worker, handle: str | None, details: dict[str, Any]) -> None:
    """Record what the launcher reported (instance id, type, zone, price...)."""
    if handle is not None:
        worker.launcher_handle = handle
    worker.launch_details = {**worker.launch_details, **details}


def record_start_failure(session: Session, run: Run, reason: str, now: datetime) -> None:
    """Count a worker that failed before registering (the reconciler backs off on the streak)."""
    run.consecutive_start_failures += 1
    run.last_start_failure_at = now
    events.record_event(session, run.id, "run.start_failure", reason, now)


def _resolve_caller(session: Session, token: str, body: WorkerRegister) -> tuple[Run, Worker | None, str]:
    """Which run (and own worker row, if any) a registration token designates, and the worker token
    to hand back. See the module docstring for what each kind of token may bind."""
    digest = tokens.hash_token(token)
    if token.startswith(tokens.JOIN_PREFIX):
        # the same join token, again and again in a burst: looked up (and its run locked) once per transaction
        lookup = ("join-token", digest)
        run = per_transaction(session, lookup, lambda: lock_run_of_join_token(session, digest))
        if run is None:
            raise Unauthorized("unknown join token")
        if body.request_id and session.scalar(select(Worker.id).where(Worker.request_id == body.request_id)):
            raise Conflict(
                f"request id {body.request_id!r} is taken: a join token always joins as a new worker "
                "(leave request_id out)"
            )
        return run, None, tokens.new_token(tokens.WORKER_PREFIX)
    if token.startswith(tokens.LAUNCH_PREFIX):
        worker = session.scalar(select(Worker).where(Worker.launch_token_hash == digest))
        if worker is None:
            raise Unauthorized("unknown launch token (it is void once its worker has used its worker token)")
        fresh = tokens.new_token(tokens.WORKER_PREFIX)  # the launch token's use is never its worker token
    elif token.startswith(tokens.WORKER_PREFIX):
        worker = session.scalar(select(Worker).where(Worker.token_hash == digest))
        if worker is None:
            raise Unauthorized("unknown worker token")
        fresh = token
    else:
        raise Unauthorized("registration needs the run's join token, a launch token or a worker token")
    if body.request_id and body.request_id != worker.request_id:
        raise Forbidden("the request id does not match the token")
    return worker.run, worker, fresh


def _new_manual_worker(
    session: Session, run: Run, body: WorkerRegister, now: datetime, limiter: RateLimiter | None
) -> Worker:
    """A row for a worker joined with the join token; :class:`TooManyRequests` past the token's rate,
    :class:`Conflict` when the run already has ``max_workers`` live workers."""
    if limiter is not None:
        limiter.take(f"join:{run.id}", "registrations with this join token")
    known = roster(session, run.id)
    live = known.live
    if live >= run.max_workers:
        raise Conflict(
            f"run {run.name!r} has {live} live workers, its max_workers: no room for another one "
            "(the admin can raise it with scale --max)"
        )
    request_id = body.request_id or f"manual-{new_request_id(run)}"[:64]
    worker = _new_worker(run, request_id, "manual", WorkerState.running, now)
    worker.manual = True
    session.add(worker)  # written with the rest of the registration (register_worker)
    known.became(None, WorkerState.running)
    return worker


def register_worker(
    session: Session, token: str, body: WorkerRegister, now: datetime, limiter: RateLimiter | None = None
) -> Registration:
    """Bind a booting worker to its own row (launch or worker token) or create a manual row (join token).

    A worker that registers again (a lost reply, a restarted agent, a lost worker come back) keeps its
    row. The run goes from pending to running. Raises :class:`Unauthorized`, :class:`Forbidden`,
    :class:`RunNotAcceptingWorkers` (run stopping or finished), :class:`Conflict` (worker ended, request
    id taken, run full) or :class:`TooManyRequests` (join token used too fast; ``limiter``).
    """
    pending = bind_worker(session, token, body, now, limiter)
    session.flush()  # one INSERT (or UPDATE) of the worker, whose id its events name
    return record_registration(session, pending)


@dataclass(frozen=True)
class PendingRegistration:
    """A registration whose worker row is in the session, not yet written (a new row has no id yet):
    :func:`record_registration` finishes it once it is."""

    registration: Registration
    joined: bool  # a new manual row (join token)
    hostname: str  # as the worker sent it
    now: datetime  # when it registered: its events' time too


def bind_worker(
    session: Session, token: str, body: WorkerRegister, now: datetime, limiter: RateLimiter | None = None
) -> PendingRegistration:
    """The first half of :func:`register_worker`: every check and the worker row, left to the caller to
    write (several registrations of one transaction are written in one INSERT), then to hand to
    :func:`record_registration`. Raises as :func:`register_worker` does."""
    run, worker, worker_token = _resolve_caller(session, token, body)
    lock_run(session, run.id)  # before any row naming the run is written (see lock_run)
    if run.state not in ACCEPTING_RUN_STATES:
        raise RunNotAcceptingWorkers(f"run {run.name!r} is {run.state}; it takes no new workers")
    joined = worker is None
    if worker is None:
        worker = _new_manual_worker(session, run, body, now, limiter)
    elif worker.state in ENDED_WORKER_STATES:
        raise Conflict(f"worker {worker.id} has ended ({worker.state}); join as a new worker")
    else:
        known, old = roster(session, run.id), worker.state
        runs.set_worker_state(session, worker, WorkerState.running, "registered", now)
        known.became(old, WorkerState.running)
    worker.token_hash = tokens.hash_token(worker_token)
    worker.hostname = events.without_secrets(run, body.hostname)
    if body.launcher_handle:
        worker.launcher_handle = events.without_secrets(run, body.launcher_handle)
    worker.registered_at = worker.registered_at or now
    worker.last_heartbeat_at = now
    assign_worker_index(session, worker)
    return PendingRegistration(Registration(worker, run, worker_token), joined, body.hostname, now)


def record_registration(session: Session, pending: PendingRegistration) -> Registration:
    """The second half of :func:`register_worker`, once the worker row is written: its events, and the
    run from pending to running."""
    reg, now = pending.registration, pending.now
    run, worker = reg.run, reg.worker
    if pending.joined:
        message = f"manual worker from {pending.hostname}"
        events.record_event(session, run.id, "worker.joined", message, now, worker.id)
    # The start-failure streak ends when a worker contributes samples (the reconciler resets it), not
    # here: a worker can register and still fail to import the user's code.
    if run.state == RunState.pending:
        runs.set_run_state(session, run, RunState.running, f"worker {worker.id} registered", now)
    events.record_event(session, run.id, "worker.registered", f"host {worker.hostname!r}", now, worker.id)
    return reg


def deregister_worker(
    session: Session,
    worker: Worker,
    reason: DeregisterReason,
    message: str | None,
    now: datetime,
    crashes: crash_budget.CrashPolicy | None = None,
    unusable_spec: bool = False,
    metrics: Mapping[str, float] | None = None,
) -> None:
    """A worker leaves: interrupted -> interrupted, stopped/completed -> exited, error -> failed.

    A launched worker that fails before contributing a sample counts as a start-up failure (the
    reconciler backs off and, after enough in a row, fails the run); when it says the run's spec is
    unusable (``unusable_spec``: its agent exits with code 3) and no other live worker trains with it,
    the run fails at once with its message, as every other worker would fail alike. One that fails
    after training counts toward the run's crash budget (:mod:`orchestrator.domain.crash_budget`). A
    worker joined by hand counts for none of these: the join token's holder would fail the run at will.
    The ``worker.state`` event carries the message.
    ``metrics`` (those the run reports) are the worker's latest values, newer than its last heartbeat's:
    the run keeps them (:func:`orchestrator.domain.reported.keep_metrics`). Leaving twice is harmless
    when the state is the same; raises :class:`IllegalTransition` otherwise.
    """
    if metrics:
        chosen = select_metrics(dict(metrics), tuple(worker.run.report_metrics))
        worker.metrics = {**(worker.metrics or {}), **chosen}
    new = DEREGISTER_STATES[reason]
    old_state = worker.state
    message = events.without_secrets(worker.run, message) if message else message
    worker.exit_reason = f"{reason.value}: {message}" if message else reason.value
    start_failure = reason == DeregisterReason.error and worker.samples == 0 and not worker.manual
    if start_failure:
        record_start_failure(session, worker.run, f"worker {worker.id}: {message or 'failed'}", now)
    runs.set_worker_state(session, worker, new, f"deregistered ({worker.exit_reason})", now)
    if start_failure and unusable_spec and _spec_unproven(session, worker):
        detail = (message or "no reason given").removeprefix("unusable run spec: ")
        cause = f"worker {worker.id} cannot use the run's spec: {detail}"
        runs.set_run_state(session, worker.run, RunState.failed, cause, now)
    elif reason == DeregisterReason.error and old_state != new:
        crash_budget.judge(session, worker, crashes or crash_budget.CrashPolicy(), now)


def _spec_unproven(session: Session, worker: Worker) -> bool:
    """Whether ``worker``'s run takes workers and none of its other live workers trains: a spec another
    worker trains with is usable, and a replacement that calls it unusable met something of its own (a
    constructor that downloads, a machine without a GPU), which the start-failure budget judges."""
    if worker.run.state not in ACCEPTING_RUN_STATES:
        return False
    query = select(Worker.id).where(
        Worker.run_id == worker.run_id,
        Worker.id != worker.id,
        Worker.state.in_(LIVE_WORKER_STATES),
        Worker.samples > 0,
    )
    return session.scalar(query.limit(1)) is None


def assign_worker_index(session: Session, worker: Worker) -> int:
    """The worker's slot: its own while no other live worker holds it (a lost worker come back may find
    its replacement there), else the lowest slot free among the run's live workers.

    Slots of ended workers are free again, so a replacement takes its predecessor's. Registrations of one
    run are serialized by a lock on its row, so two live workers never hold the same slot; the slots held
    are read once per transaction (:mod:`orchestrator.domain.roster`).
    """
    holder = worker.id if worker.id is not None else -1  # a row not yet written: its slot is new anyway
    worker.worker_index = roster(session, worker.run_id).take_slot(holder, worker.worker_index)
    return worker.worker_index


def shard_count(running: int, desired: int) -> int:
    """The worker count a run's code shards its data by (``num_workers``): the run's desired workers, or
    its running ones when more run. The first worker of a 2-worker run takes half the data from the start
    instead of all of it until its partner registers; a run without launched workers (desired 0) counts
    the ones that joined by hand."""
    return max(running, desired)


def count_running_workers(session: Session, run_id: int) -> int:
    """The run's registered, running workers: the live count user code shards by."""
    query = (
        select(func.count())
        .select_from(Worker)
        .where(Worker.run_id == run_id, Worker.state == WorkerState.running)
    )
    return int(session.scalar(query) or 0)


def request_retire(session: Session, worker: Worker, reason: str, now: datetime) -> None:
    """Ask a live worker to leave at its next heartbeat (scale-down); a no-op if already asked."""
    if worker.retire_requested_at is not None:
        return
    worker.retire_requested_at = now
    if worker.run.checkpointer_worker_id == worker.id:
        worker.run.checkpointer_worker_id = None
    events.record_event(session, worker.run_id, "worker.retire", reason, now, worker.id)


def revoke_manual_workers(session: Session, run: Run, now: datetime) -> list[int]:
    """End every worker of ``run`` joined by hand that has not ended (running or lost), so that their
    worker tokens stop working at once (403 "has ended"); returns their ids. With the join token
    replaced too (:func:`orchestrator.domain.runs.rotate_join_token`), nobody who held it keeps any access
    to the run. A revoked agent that still runs is told to stop by its next heartbeat's reply."""
    revoked = list(runs.unended_manual_workers(session, run.id))
    for worker in revoked:
        runs.set_worker_state(session, worker, WorkerState.exited, "revoked by the admin", now)
    if revoked:
        ids = ", ".join(str(w.id) for w in revoked)
        events.record_event(session, run.id, "run.revoked", f"workers joined by hand revoked: {ids}", now)
    return [w.id for w in revoked]
