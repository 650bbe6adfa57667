"""The heartbeat batch writer: once per flush interval, what the hub buffered goes to the database.

:meth:`HeartbeatWriter.flush` runs every ``heartbeat_flush_interval_s`` (1 s) and writes, in one
transaction: the buffered heartbeats (one executemany UPDATE), lost or launching workers that spoke again
(back to running), each run's highest swarm epoch read from the DHT, new checkpointers where the cached
one went silent or fell behind, the warning of a run whose workers train apart (until its swarm formed:
``domain/swarm_forming.py``), and at most one aggregated progress sample per run every
``progress_sample_interval_s`` (thinned past ``progress_max_points``; once committed, also handed to
the forwarder, if any: TensorBoard). Then it reloads the hub's cache. A failed write keeps the batch for
the next flush; a crash loses at most one flush interval of heartbeats, which the next heartbeat repairs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from orchestrator.clock import Clock
from orchestrator.config import Settings
from orchestrator.db.models import Run, Worker
from orchestrator.db.session import Database
from orchestrator.domain import averaging, progress_samples, runs, swarm_forming
from orchestrator.domain.checkpointer import Contender, elect_checkpointer, eligible
from orchestrator.domain.states import ACTIVE_RUN_STATES, REVIVABLE_WORKER_STATES
from orchestrator.heartbeats.hub import HeartbeatHub
from orchestrator.progress import Forwarder, RunPoint, SwarmProgressCache
from worker.protocol.runs import RunState
from worker.protocol.workers import AveragingCounts, Heartbeat, WorkerState

_REVIVE_CHUNK = 500  # ids per IN (...) list: well under every database's parameter limit


@dataclass
class FlushStats:
    heartbeats: int = 0
    revived: list[int] = field(default_factory=list)
    samples: int = 0


class HeartbeatWriter:
    """Writes what ``hub`` buffered, and what follows from it, to the database (see the module docstring)."""

    def __init__(
        self,
        hub: HeartbeatHub,
        db: Database,
        settings: Settings,
        clock: Clock,
        swarm: SwarmProgressCache,
        forwarder: Forwarder | None = None,
    ) -> None:
        self._hub, self._db, self._settings, self._clock = hub, db, settings, clock
        self._swarm = swarm
        self._forwarder = forwarder
        self._flush_lock = threading.Lock()
        self._last_sample_at: dict[int, datetime] = {}
        self._formed: set[int] = set()  # runs seen averaging: the averaging window judges them
        self._apart_since: dict[int, datetime] = {}  # runs whose live workers train apart: since when
        self._started_at = clock()

    def flush(self) -> FlushStats:
        """Write buffered heartbeats, revive, elect, sample, reload; one transaction. Raises DB errors."""
        with self._flush_lock:
            batch = self._hub.take_pending()
            stats = FlushStats(heartbeats=len(batch))
            now = self._clock()
            try:
                with self._db.begin() as session:
                    _write_heartbeats(session, batch)
                    stats.revived = self._revive(session, batch, now)
                    self._record_swarm_epochs(session)
                    self._elect(session, now)
                    self._judge_forming(session, now)
                    points = self._sample(session, now)
            except BaseException:
                self._hub.restore_pending(batch)  # unless newer heartbeats arrived meanwhile
                raise
            stats.samples = len(points)
            if self._forwarder is not None and points:  # only what was stored
                self._forwarder.write(points)
            self._hub.refresh()
            _, active = self._hub.snapshot()
            self._last_sample_at = {k: v for k, v in self._last_sample_at.items() if k in active}
            self._formed &= set(active)
            self._apart_since = {k: v for k, v in self._apart_since.items() if k in active}
            return stats

    def _revive(
        self, session: Session, batch: dict[int, tuple[Heartbeat, datetime]], now: datetime
    ) -> list[int]:
        stale = [w for w in batch if (e := self._hub.cached(w)) and e.state != WorkerState.running]
        revived = []
        for start in range(0, len(stale), _REVIVE_CHUNK):  # one query per chunk, not one per worker
            chunk = stale[start : start + _REVIVE_CHUNK]
            query = (
                select(Worker)
                .where(Worker.id.in_(chunk), Worker.state.in_(REVIVABLE_WORKER_STATES))
                .order_by(Worker.id)
            )
            for worker in session.scalars(query):
                runs.set_worker_state(session, worker, WorkerState.running, "heartbeat received", now)
                revived.append(worker.id)
        return revived

    def _record_swarm_epochs(self, session: Session) -> None:
        """Write each run's swarm epoch read from the DHT where it passed the recorded one: the stop
        condition is judged by it, also after a restart (the progress cache lives in memory only)."""
        _, cached_runs = self._hub.snapshot()
        higher = {
            r.run_id: e for r in cached_runs.values() if (e := self._hub.known_epoch(r)) > r.swarm_epoch
        }
        for run_id, epoch in higher.items():
            run = session.get(Run, run_id)
            if run is not None and epoch > run.swarm_epoch:
                run.swarm_epoch = epoch

    def _elect(self, session: Session, now: datetime) -> None:
        """Re-elect only where the cached checkpointer is missing or no longer :func:`eligible` (ended,
        retiring, silent or lagging), and where a run without one has an eligible worker.

        Silence is not held against the current checkpointer during the first heartbeat timeout after
        start-up: workers could not reach a stopped orchestrator.
        """
        timeout_s = self._settings.reconciler.heartbeat_timeout_s
        fresh_after = now - timedelta(seconds=timeout_s)
        in_grace = now - self._started_at < timedelta(seconds=timeout_s)
        cached_workers, cached_runs = self._hub.snapshot()
        by_run: dict[int, list[Contender]] = {}
        for w in cached_workers.values():
            by_run.setdefault(w.run_id, []).append(
                Contender(w.worker_id, w.state, w.retiring, w.last_seen, w.epoch, w.manual)
            )
        need = []
        for entry in cached_runs.values():
            current = entry.checkpointer_id
            members = eligible(
                by_run.get(entry.run_id, []),
                self._hub.known_epoch(entry),
                entry.checkpoint_every_epochs,
                fresh_after,
                excused=current if in_grace else None,
                hand_joined=entry.hand_joined_checkpoint,
            )
            if current not in {c.worker_id for c in members} and (current is not None or members):
                need.append(entry.run_id)
        for run_id in need:
            run = session.get(Run, run_id)
            if run is not None and run.state in ACTIVE_RUN_STATES:
                elect_checkpointer(session, run, now, timeout_s)

    def _judge_forming(self, session: Session, now: datetime) -> None:
        """Warn about a running run whose live workers have trained apart for ``averaging_apart_s``, until
        its swarm forms (:mod:`orchestrator.domain.swarm_forming`); a run seen formed is left to the
        averaging window."""
        _, cached_runs = self._hub.snapshot()
        watched = [
            r.run_id
            for r in cached_runs.values()
            if r.state == RunState.running and r.run_id not in self._formed
        ]
        if not watched:
            return
        fresh_after = now - timedelta(seconds=self._settings.reconciler.heartbeat_timeout_s)
        query = select(Worker.run_id, Worker.averaging, Worker.last_heartbeat_at).where(
            Worker.run_id.in_(watched), Worker.state == WorkerState.running
        )
        live: dict[int, list[AveragingCounts]] = {}
        for run_id, raw, heartbeat_at in session.execute(query):
            reported = swarm_forming.counts_of(raw)
            if reported is not None and heartbeat_at is not None and heartbeat_at >= fresh_after:
                live.setdefault(run_id, []).append(reported)
        settings = self._settings
        hold = timedelta(seconds=settings.averaging_apart_s)
        for run_id in watched:
            counts = live.get(run_id, [])
            if swarm_forming.formed(counts):
                self._apart_since.pop(run_id, None)
                self._formed.add(run_id)
                if (run := session.get(Run, run_id)) is not None:
                    swarm_forming.mark_formed(session, run, now)
            elif not swarm_forming.apart(counts, settings.averaging_apart_epochs):
                self._apart_since.pop(run_id, None)
            elif (
                now - self._apart_since.setdefault(run_id, now) >= hold
                and (run := session.get(Run, run_id)) is not None
            ):
                swarm_forming.raise_apart(session, run, counts, now, settings.averaging_window_s)

    def _sample(self, session: Session, now: datetime) -> list[RunPoint]:
        """Store a progress sample of each run that is due; returns them as points to forward."""
        interval = timedelta(seconds=self._settings.progress_sample_interval_s)
        _, cached_runs = self._hub.snapshot()
        due = {
            r.run_id: r
            for r in cached_runs.values()
            if r.state != RunState.pending
            and now - self._last_sample_at.get(r.run_id, datetime.min.replace(tzinfo=now.tzinfo)) >= interval
        }
        if not due:
            return []
        fresh_after = now - timedelta(seconds=self._settings.reconciler.heartbeat_timeout_s)
        swarms = {run_id: entry.swarm_id for run_id, entry in due.items()}
        samples = progress_samples.write(
            session, swarms, self._swarm, now, fresh_after, self._settings.progress_max_points
        )
        for sample in samples:
            run = session.get(Run, sample.run_id)
            if run is not None:
                averaging.judge(
                    session,
                    run,
                    now,
                    sample.live_workers,
                    self._settings.averaging_window_s,
                    self._settings.averaging_warning_fraction,
                )
        self._last_sample_at.update(dict.fromkeys(due, now))
        return [progress_samples.as_point(due[sample.run_id].name, sample) for sample in samples]


_HEARTBEAT_UPDATE = (
    update(Worker.__table__)  # type: ignore[arg-type]
    .where(Worker.__table__.c.id == bindparam("wid"))
    .values(
        last_heartbeat_at=bindparam("at", type_=Worker.__table__.c.last_heartbeat_at.type),
        local_step=bindparam("local_step"),
        swarm_epoch=bindparam("swarm_epoch"),
        samples=bindparam("samples"),
        launch_token_hash=None,  # the worker used its worker token: its launch token is void from now on
        loss=bindparam("loss"),
        samples_per_s=bindparam("samples_per_s"),
        num_peers=bindparam("num_peers"),
        phase=bindparam("phase"),
        peer_maddrs=bindparam("peer_maddrs", type_=Worker.__table__.c.peer_maddrs.type),
        metrics=bindparam("metrics", type_=Worker.__table__.c.metrics.type),
        averaging=bindparam("averaging", type_=Worker.__table__.c.averaging.type),
    )
)


def _write_heartbeats(session: Session, batch: dict[int, tuple[Heartbeat, datetime]]) -> None:
    if not batch:
        return
    params = [
        {
            "wid": worker_id,
            "at": at,
            "local_step": hb.local_step,
            "swarm_epoch": hb.swarm_epoch,
            "samples": hb.samples,
            "loss": hb.loss,
            "samples_per_s": hb.samples_per_s,
            "num_peers": hb.num_peers,
            "phase": hb.phase,
            "peer_maddrs": hb.visible_maddrs,
            "metrics": hb.metrics,
            "averaging": hb.averaging.model_dump() if hb.averaging is not None else None,
        }
        for worker_id, (hb, at) in batch.items()
    ]
    session.connection().execute(_HEARTBEAT_UPDATE, params)
