"""A run's history: every state change, registration, election and checkpoint is an event.

Events are rows (the API lists them per run, the page shows them) and, with the same fields, log lines.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Event, Run
from worker.logsetup import log_fields

logger = logging.getLogger(__name__)


def record_event(
    session: Session, run_id: int, kind: str, message: str, now: datetime, worker_id: int | None = None
) -> Event:
    """Append an event to the run's history (kinds: ``run.*``, ``worker.*``, ``checkpoint.*``).

    Each event is also a log line with the same fields (run name, worker id, kind, message).
    """
    event = Event(run_id=run_id, at=now, kind=kind, message=message[:4000], worker_id=worker_id)
    session.add(event)
    run = session.get(Run, run_id)  # loaded already by every caller: no query
    fields = log_fields(run=run.name if run is not None else str(run_id), worker=worker_id, event=kind)
    logger.info("%s", event.message, extra=fields)
    return event


def last_message(session: Session, run_id: int, kind: str) -> str | None:
    """The message of the run's latest event of ``kind``, or None (one indexed read, newest first)."""
    query = (
        select(Event.message)
        .where(Event.run_id == run_id, Event.kind == kind)
        .order_by(Event.id.desc())
        .limit(1)
    )
    return session.scalar(query)
