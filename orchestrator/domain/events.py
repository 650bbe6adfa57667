"""A run's history: every state change, registration, election and checkpoint is an event.

Events are rows (the API lists them per run, the page shows them) and, with the same fields, log lines.
No event, log line or reason holds one of the run's ``secret_env`` values (:func:`without_secrets`): what a
worker sends (a failure message, a log tail) may quote one, and public readers see events and reasons.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Event, Run
from worker.protocol.redaction import redact
from worker.runtime.logsetup import log_fields

logger = logging.getLogger(__name__)


def without_secrets(run: Run | None, text: str) -> str:
    """``text`` with each of ``run``'s secret values masked: applied to whatever a worker sent and to
    every reason and event, before it is stored or logged (the worker masks them too; a
    hand-written one may not)."""
    if run is None or not run.secret_env:
        return text
    return redact(text, (str(value) for value in run.secret_env.values() if value is not None))


def record_event(
    session: Session, run_id: int, kind: str, message: str, now: datetime, worker_id: int | None = None
) -> Event:
    """Append an event to the run's history (kinds: ``run.*``, ``worker.*``, ``checkpoint.*``).

    Each event is also a log line with the same fields (run name, worker id, kind, message).
    """
    run = session.get(Run, run_id)  # loaded already by every caller: no query
    message = without_secrets(run, message)
    event = Event(run_id=run_id, at=now, kind=kind, message=message[:4000], worker_id=worker_id)
    session.add(event)
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
