"""The heartbeat hot path: answer from memory; the batch writer (``writer.py``) writes to the database.

A heartbeat is authenticated and answered from an in-memory table (:class:`HeartbeatHub`) without
touching the database: the worker's token digest, state and run (state, checkpointer, checkpoint
policy) are cached. The heartbeat itself is put in a "latest per worker" buffer, which the batch writer
takes once per flush interval (``heartbeat_flush_interval_s``, 1 s), and then the cache is reloaded
(:meth:`HeartbeatHub.refresh`). A heartbeat's metrics are kept only where their names match the run's
``report_metrics``.

A registration writes its worker to the database and then puts it in the cache at once
(:meth:`HeartbeatHub.note`), so the worker's first heartbeat, sent with its new token, is known. A reload
that read the database before that commit must not undo it when it installs what it read: entries noted
after a reload began its read are kept (:class:`CacheRead` carries when the read began).

The addresses a heartbeat reports become new workers' initial peers, so only dialable addresses of the
worker's own peer are kept (``worker/protocol/peer_addresses.py``): its peer id is the one its swarm token was
issued for; in a run without swarm admission (no token), any one peer's.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.clock import Clock
from orchestrator.config import Settings
from orchestrator.db.models import Checkpoint, Run, Worker
from orchestrator.db.session import Database
from orchestrator.domain import runs
from orchestrator.domain.states import ACCEPTING_RUN_STATES, ACTIVE_RUN_STATES, UNENDED_WORKER_STATES
from orchestrator.domain.workers import shard_count
from orchestrator.errors import Forbidden, Unauthorized
from orchestrator.progress import SwarmProgressCache
from orchestrator.tokens import token_matches
from worker.protocol.metrics import select_metrics
from worker.protocol.peer_addresses import announced_addresses
from worker.protocol.runs import RunState, swarm_admission_requested
from worker.protocol.workers import Heartbeat, HeartbeatReply, WorkerAction, WorkerState

logger = logging.getLogger(__name__)


@dataclass
class WorkerEntry:
    worker_id: int
    run_id: int
    token_hash: str | None
    state: WorkerState
    retiring: bool
    last_seen: datetime | None
    epoch: int = 0  # the swarm epoch it last reported
    peer_id: str | None = None  # the libp2p peer id its swarm token was issued for
    manual: bool = False  # joined by hand (the checkpointer rule tells it from launched workers)


@dataclass
class RunEntry:
    run_id: int
    swarm_id: str
    state: RunState
    target_batch_size: int
    checkpointer_id: int | None
    checkpoint_every_epochs: int
    latest_checkpoint_epoch: int | None
    swarm_epoch: int = 0  # the highest the DHT showed, as recorded in the database
    admission: bool = True  # its peers hold swarm tokens (so each worker's peer id is known)
    report_metrics: tuple[str, ...] = ()  # names and patterns of the metrics its workers may report
    name: str = ""
    hand_joined_checkpoint: bool = False  # its hand-joined workers may checkpoint it
    desired_workers: int = 0  # with the running count, what the run's code shards by (num_workers)


@dataclass
class CacheRead:
    """What :meth:`HeartbeatHub.read` took from the database, and the hub's note count when it began."""

    workers: dict[int, WorkerEntry]
    runs: dict[int, RunEntry]
    began_at_note: int
    number: int  # reads are numbered as they begin: a read installs only over older ones


class HeartbeatHub:
    """In-memory view of live workers and active runs, and the buffer of their latest heartbeats."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        clock: Clock,
        swarm: SwarmProgressCache | None = None,
    ) -> None:
        self._db, self._settings, self._clock = db, settings, clock
        self._swarm = swarm or SwarmProgressCache()
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[Heartbeat, datetime]] = {}
        self._workers: dict[int, WorkerEntry] = {}
        self._runs: dict[int, RunEntry] = {}
        self._running: Counter[int] = Counter()  # run id -> its running workers (heartbeat replies say it)
        # worker id -> (the addresses and peer id last filtered, what was kept): parsing costs ~0.3 ms an
        # address, and a worker reports the same ones heartbeat after heartbeat
        self._announced: dict[int, tuple[tuple[tuple[str, ...], str | None], list[str]]] = {}
        # what was written in this process since a reload may have read: worker / run id -> note number
        self._notes = 0
        self._worker_noted: dict[int, int] = {}
        self._run_noted: dict[int, int] = {}
        # reloads run in several threads (the batch writer's, each use case's "changed"): the number of
        # the last read begun, and of the read the cache holds
        self._reads_begun = 0
        self._installed_read = 0

    # -- the hot path (memory only) ----------------------------------------------------------------

    def cached(self, worker_id: int) -> WorkerEntry | None:
        with self._lock:
            return self._workers.get(worker_id)

    def authenticate(self, entry: WorkerEntry, token: str | None) -> None:
        """Raise :class:`Unauthorized` without a token, :class:`Forbidden` when it is not this worker's."""
        if token is None:
            raise Unauthorized("missing bearer token")
        if not token_matches(token, entry.token_hash):
            raise Forbidden(f"the token does not belong to worker {entry.worker_id}")

    def accept(self, entry: WorkerEntry, heartbeat: Heartbeat) -> HeartbeatReply:
        """Buffer ``heartbeat`` (with only the addresses new workers may be given and the metrics its run
        reports) and answer it from the cache."""
        now = self._clock()
        with self._lock:
            run = self._runs.get(entry.run_id)
        heartbeat.visible_maddrs = self._announced_addresses(entry, run, heartbeat.visible_maddrs)
        if heartbeat.metrics:  # only what the run asked for: names become label values of /metrics
            heartbeat.metrics = select_metrics(heartbeat.metrics, run.report_metrics if run else ())
        with self._lock:
            run = self._runs.get(entry.run_id)
            ended = entry.state not in UNENDED_WORKER_STATES
            if not ended:
                self._pending[entry.worker_id] = (heartbeat, now)
                entry.last_seen = now
                entry.epoch = heartbeat.swarm_epoch
            stop = ended or entry.retiring or run is None or run.state not in ACCEPTING_RUN_STATES
            return HeartbeatReply(
                action=WorkerAction.stop if stop else WorkerAction.proceed,
                # kept with a stop: the checkpointer of a stopping run saves and uploads a final checkpoint
                checkpointer=run is not None and not ended and run.checkpointer_id == entry.worker_id,
                checkpoint_every_epochs=run.checkpoint_every_epochs if run else 5,
                latest_checkpoint_epoch=run.latest_checkpoint_epoch if run else None,
                num_workers=shard_count(
                    self._running.get(entry.run_id, 0), run.desired_workers if run else 0
                ),
            )

    def _announced_addresses(self, entry: WorkerEntry, run: RunEntry | None, maddrs: list[str]) -> list[str]:
        if not maddrs or run is None or (run.admission and entry.peer_id is None):
            return []
        key = (tuple(maddrs), entry.peer_id if run.admission else None)
        cached = self._announced.get(entry.worker_id)
        if cached is not None and cached[0] == key:
            return list(cached[1])
        kept = announced_addresses(maddrs, key[1])
        self._announced[entry.worker_id] = (key, kept)
        return list(kept)

    def bind_peer(self, worker_id: int, peer_id: str) -> None:
        """The worker's swarm token was issued for ``peer_id`` (recorded in the database too)."""
        with self._lock:
            entry = self._workers.get(worker_id)
            if entry is not None:
                entry.peer_id = peer_id
                self._notes += 1
                self._worker_noted[worker_id] = self._notes

    def run_entry(self, run_id: int) -> RunEntry | None:
        with self._lock:
            return self._runs.get(run_id)

    def swarm_epoch(self, run_id: int) -> int:
        """The highest swarm epoch of the run the DHT showed (recorded, or read since); 0 if unknown."""
        with self._lock:
            run = self._runs.get(run_id)
        return self.known_epoch(run) if run is not None else 0

    def known_epoch(self, run: RunEntry) -> int:
        """The run's highest swarm epoch: recorded in the database, or read from the DHT since."""
        progress = self._swarm.get(run.swarm_id)
        return max(run.swarm_epoch, progress.epoch if progress is not None else 0)

    def active_swarms(self) -> dict[str, int]:
        """Swarm id -> target batch size of every pending, running or stopping run."""
        with self._lock:
            return {r.swarm_id: r.target_batch_size for r in self._runs.values()}

    # -- cache maintenance (blocking: call off the event loop) -------------------------------------

    def load(self, worker_id: int) -> WorkerEntry | None:
        """Read a worker missing from the cache (ended, or new since the last reload) from the database."""
        with self._db.read() as session:
            worker = session.get(Worker, worker_id)
            if worker is None:
                return None
            entry = _worker_entry(worker)
            run_entry = _run_entries(session, [worker.run], self._settings.swarm_admission).get(worker.run_id)
        with self._lock:
            self._workers[worker_id] = entry
            if run_entry is not None and run_entry.state in ACTIVE_RUN_STATES:
                self._runs.setdefault(run_entry.run_id, run_entry)
        return entry

    def entries_of(self, worker: Worker) -> tuple[WorkerEntry, RunEntry]:
        """The cache entries of a worker (and its run) being written: build them inside the session,
        hand them to :meth:`note` once it has committed."""
        run = worker.run
        run_entry = RunEntry(
            run.id,
            run.swarm_id,
            run.state,
            run.target_batch_size,
            run.checkpointer_worker_id,
            run.checkpoint_every_epochs,
            self._latest_epoch(run.id),
            run.swarm_epoch,
            self._settings.swarm_admission and swarm_admission_requested(run.strategy_options),
            tuple(run.report_metrics),
            run.name,
            run.hand_joined_checkpoint,
            run.desired_workers,
        )
        return _worker_entry(worker), run_entry

    def note(self, entries: tuple[WorkerEntry, RunEntry]) -> None:
        """Put a worker (and its run) just written in this process into the cache at once."""
        entry, run_entry = entries
        with self._lock:
            self._workers[entry.worker_id] = entry
            self._runs[run_entry.run_id] = run_entry
            self._notes += 1
            self._worker_noted[entry.worker_id] = self._run_noted[run_entry.run_id] = self._notes

    def _latest_epoch(self, run_id: int) -> int | None:
        with self._lock:
            old = self._runs.get(run_id)
        return old.latest_checkpoint_epoch if old else None

    def refresh(self) -> None:
        """Reload runs and workers from the database (their states may have been changed elsewhere)."""
        self.install(self.read())

    def read(self) -> CacheRead:
        """Read the active runs and their unended workers (the first half of :meth:`refresh`)."""
        with self._lock:
            began_at_note = self._notes
            self._reads_begun += 1
            number = self._reads_begun
        with self._db.read() as session:
            active = runs.list_active_runs(session)
            run_entries = _run_entries(session, active, self._settings.swarm_admission)
            # Only the cached columns, as plain rows: loading whole ORM objects (JSON columns and all) of
            # every live worker once a second was the orchestrator's largest CPU cost under load.
            query = select(*_ENTRY_COLUMNS).where(
                Worker.run_id.in_(list(run_entries)), Worker.state.in_(UNENDED_WORKER_STATES)
            )
            rows = session.connection().execute(query)  # Core rows: no ORM bookkeeping per worker
            worker_entries = {
                row[0]: WorkerEntry(*row[:4], row[4] is not None, row[5], row[6] or 0, row[7], bool(row[8]))
                for row in rows
            }
        return CacheRead(worker_entries, run_entries, began_at_note, number)

    def install(self, read: CacheRead) -> None:
        """Replace the cache with ``read``, keeping the entries noted since it began (they are newer) and
        the latest heartbeat times seen here (the database has them a flush later). A read that began
        before the one the cache holds is dropped: installed after it, it would undo what a commit in
        between changed (a heartbeat reply then named the checkpoint before the one just uploaded)."""
        worker_entries, run_entries = dict(read.workers), dict(read.runs)
        with self._lock:
            if read.number < self._installed_read:
                return
            self._installed_read = read.number
            for worker_id, noted in self._worker_noted.items():
                if noted > read.began_at_note and worker_id in self._workers:
                    worker_entries[worker_id] = self._workers[worker_id]
            for run_id, noted in self._run_noted.items():
                if noted > read.began_at_note and run_id in self._runs:
                    run_entries[run_id] = self._runs[run_id]
            self._worker_noted = {k: n for k, n in self._worker_noted.items() if n > read.began_at_note}
            self._run_noted = {k: n for k, n in self._run_noted.items() if n > read.began_at_note}
            for worker_id, entry in worker_entries.items():
                old = self._workers.get(worker_id)
                if (
                    old is not None
                    and old is not entry
                    and old.last_seen
                    and (entry.last_seen is None or old.last_seen > entry.last_seen)
                ):
                    entry.last_seen, entry.epoch = old.last_seen, max(old.epoch, entry.epoch)
            self._workers, self._runs = worker_entries, run_entries
            self._running = Counter(
                e.run_id for e in worker_entries.values() if e.state == WorkerState.running
            )
            self._announced = {k: v for k, v in self._announced.items() if k in worker_entries}

    # -- the batch writer's side (heartbeats/writer.py) ---------------------------------------

    def take_pending(self) -> dict[int, tuple[Heartbeat, datetime]]:
        """The buffered heartbeats (the latest per worker, with when it came), leaving the buffer empty."""
        with self._lock:
            batch, self._pending = self._pending, {}
        return batch

    def restore_pending(self, batch: dict[int, tuple[Heartbeat, datetime]]) -> None:
        """Put back a batch that failed to write, unless newer heartbeats of its workers arrived meanwhile."""
        with self._lock:
            self._pending = {**batch, **self._pending}

    def snapshot(self) -> tuple[dict[int, WorkerEntry], dict[int, RunEntry]]:
        """The cached workers and runs, by id (the dicts are copies; the entries are the cache's own)."""
        with self._lock:
            return dict(self._workers), dict(self._runs)


_ENTRY_COLUMNS = (
    Worker.id,
    Worker.run_id,
    Worker.token_hash,
    Worker.state,
    Worker.retire_requested_at,
    Worker.last_heartbeat_at,
    Worker.swarm_epoch,
    Worker.peer_id,
    Worker.manual,
)


def _worker_entry(worker: Worker) -> WorkerEntry:
    return WorkerEntry(
        worker.id,
        worker.run_id,
        worker.token_hash,
        worker.state,
        worker.retire_requested_at is not None,
        worker.last_heartbeat_at,
        worker.swarm_epoch or 0,
        worker.peer_id,
        worker.manual,
    )


def _run_entries(session: Session, run_rows: Iterable[Run], admission_on: bool) -> dict[int, RunEntry]:
    rows = list(run_rows)
    ids = [r.id for r in rows]
    query = select(Checkpoint.run_id, func.max(Checkpoint.epoch)).where(Checkpoint.run_id.in_(ids))
    latest = {run_id: int(epoch) for run_id, epoch in session.execute(query.group_by(Checkpoint.run_id))}
    return {
        r.id: RunEntry(
            r.id,
            r.swarm_id,
            r.state,
            r.target_batch_size,
            r.checkpointer_worker_id,
            r.checkpoint_every_epochs,
            latest.get(r.id),
            r.swarm_epoch,
            admission_on and swarm_admission_requested(r.strategy_options),
            tuple(r.report_metrics),
            r.name,
            r.hand_joined_checkpoint,
            r.desired_workers,
        )
        for r in rows
    }
