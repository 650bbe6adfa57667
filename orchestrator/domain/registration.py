"""A worker joins its run: the use case behind ``POST /api/v1/workers/register``.

It is the one use case that is ``async`` and not a method of :class:`~orchestrator.domain.usecases.UseCases`:
registrations arrive in bursts (a spot market handing capacity back), so each is a unit of a shared
transaction (:class:`~orchestrator.db.batch.TransactionBatcher`) rather than a transaction of its own,
and it waits for that transaction without holding a thread. In two steps: every check and the new worker
row (written with the rest of the batch in one INSERT), then, once ids are known, the worker's events and
the reply. What the reply repeats for every worker of a run (its peers, its checkpoints, its spec) is read
once per transaction.

After the commit it puts the worker into the heartbeat cache at once (its first heartbeat is then answered
from memory, not by a reload) and, for a run whose peers join the swarm without tokens, makes sure the
orchestrator's DHT peer serves that swarm before the worker is told where the peer is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from anyio import to_thread
from sqlalchemy.orm import Session

from orchestrator.clock import Clock
from orchestrator.db.batch import TransactionBatcher
from orchestrator.db.models import Checkpoint, Worker
from orchestrator.db.session import Database
from orchestrator.domain import checkpoints, runs, views, workers
from orchestrator.domain.roster import per_transaction, roster
from orchestrator.ratelimit import RateLimiter
from worker.protocol.runs import spec_for_workers, swarm_admission_requested
from worker.protocol.workers import WorkerRegister, WorkerRegistered

E = TypeVar("E")


class WorkerCache(Protocol[E]):
    """Where a worker just written is cached for its heartbeats (``HeartbeatHub``)."""

    def entries_of(self, worker: Worker) -> E:
        """What to cache of ``worker``, built inside the session that writes it."""

    def note(self, entries: E) -> None:
        """Cache ``entries`` once their transaction committed."""


class OpenSwarms(Protocol):
    """The DHT peer's list of swarms whose peers join without tokens (``SwarmAdmission``)."""

    def serve_opted_out(self, db: Database, swarm_id: str) -> None:
        """Blocks until the DHT peer serves the token-less peers of ``swarm_id``."""


@dataclass(frozen=True)
class Registered:
    """A registration's reply, and its run spec already in the JSON form workers read (built once per
    transaction, not once per worker: the reply's largest part)."""

    reply: WorkerRegistered
    run_json: dict[str, Any]


_Joined = tuple[workers.PendingRegistration, list[str], Sequence[Checkpoint]]


@dataclass(frozen=True)
class Registering:
    """Registers workers over the parts it shares with the app (one batcher per app)."""

    db: Database
    batcher: TransactionBatcher
    clock: Clock
    cache: WorkerCache[Any]
    heartbeat_interval_s: float
    join_limiter: RateLimiter | None = None  # registrations per join token (None: unlimited)
    admission: OpenSwarms | None = None  # None: the DHT peer admits every peer

    async def register(self, token: str, body: WorkerRegister, own_peers: list[str]) -> Registered:
        """A launch token binds its own launch row (and gets a fresh worker token), a worker token its
        own row again, a join token a new manual worker. The reply's initial peers are ``own_peers``
        (the orchestrator's DHT peer) first, then the run's workers'. Raises what ``workers.bind_worker``
        raises (unknown token, run stopping or full, request id taken, join rate exceeded)."""

        def join(session: Session) -> _Joined:
            # may run twice (its batch again, in savepoints): it only reads and writes the session (and
            # the join token's limiter, charged again then)
            pending = workers.bind_worker(session, token, body, self.clock(), self.join_limiter)
            run_id = pending.registration.run.id
            # read once per transaction (the first join's own row is written first, by the read's autoflush)
            peers = per_transaction(session, ("peers", run_id), lambda: views.worker_peers(session, run_id))
            stored = per_transaction(  # newest first
                session, ("checkpoints", run_id), lambda: checkpoints.list_checkpoints(session, run_id)
            )
            return pending, peers, stored

        def answer(session: Session, joined: _Joined) -> tuple[Registered, Any]:
            # once the batch's new workers are written (this one's id is known)
            pending, peers, stored = joined
            reg = workers.record_registration(session, pending)
            run_id = reg.run.id
            spec = per_transaction(session, ("run-spec", run_id), lambda: runs.run_spec(reg.run))
            spec_json = per_transaction(session, ("run-spec-json", run_id), lambda: spec_for_workers(spec))
            reply = WorkerRegistered(
                worker_id=str(reg.worker.id),
                worker_token=reg.token,
                run=spec,
                swarm_id=reg.run.swarm_id,
                initial_peers=own_peers + [m for m in peers if m not in own_peers],
                heartbeat_interval_s=self.heartbeat_interval_s,
                resume_checkpoint=checkpoints.to_ref(reg.run, stored[0]) if stored else None,
                older_checkpoints=[checkpoints.to_ref(reg.run, c) for c in stored[1:]],
                secret_env=runs.secret_values(reg.run, reg.worker),
                worker_index=reg.worker.worker_index or 0,
                num_workers=workers.shard_count(roster(session, run_id).running, reg.run.desired_workers),
            )
            return Registered(reply, spec_json), self.cache.entries_of(reg.worker)

        registered, entries = await self.batcher.submit(join, answer)  # with those arriving meanwhile
        self.cache.note(entries)
        if self.admission is not None and not swarm_admission_requested(
            registered.reply.run.strategy_options
        ):
            # before the worker knocks on the DHT peer: one it refuses at first contact cannot join through it
            await to_thread.run_sync(self.admission.serve_opted_out, self.db, registered.reply.swarm_id)
        return registered
