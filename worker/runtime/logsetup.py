"""One logging set-up for the orchestrator and the worker: readable lines by default, JSON lines on request.

``configure_logging(level, fmt)`` installs one stderr handler on the root logger. ``fmt`` is ``text``
(the default) or ``json``; when not given, ``SPOTSWARM_LOG_FORMAT`` decides. Every line carries the
same fields, so logs of both sides can be searched alike:

- text: ``2026-01-02 03:04:05,678 INFO [run=digits worker=3] orchestrator.domain.runs: worker.state: a -> b``
  (the event kind, when there is one, in front of the message)
- json: ``{"timestamp": "2026-01-02T03:04:05.678Z", "level": "info", "logger": "...", "run": "digits",
  "worker": "3", "event": "worker.state", "message": "..."}`` (plus ``exception`` with a traceback)

``run``, ``worker`` and ``event`` come from the record (``logger.info(..., extra=log_fields(run=...))``)
or, for a process that serves one run (a worker), from :func:`set_log_context`. Fields not known are
``null`` in JSON and left out of text lines. A process that knows a run's secret values (a worker,
once registered) names them with :func:`set_log_secrets`: every line, traceback included, has them
masked (:mod:`worker.protocol.redaction`), since user code's exceptions quote credentials. Text lines escape
control characters in messages and fields (a newline becomes ``\n``), so logged values cannot start
lines of their own; the traceback after a message keeps its lines.

hivemind installs its own handler on the ``hivemind`` logger; it is removed so that hivemind's lines go
through ours in the same format, and hivemind is kept at ``SPOTSWARM_HIVEMIND_LOG_LEVEL`` (default
``WARNING``: its per-round INFO lines would drown everything else). Lightning's loggers likewise.
:class:`KnownNoiseFilter` keeps out the libraries' lines that a user cannot act on (each named there),
and nothing else.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import IO, Any

from worker.protocol.redaction import redact
from worker.protocol.validators import CONTROL_CHARACTER_RE

FORMAT_ENV = "SPOTSWARM_LOG_FORMAT"
HIVEMIND_LEVEL_ENV = "SPOTSWARM_HIVEMIND_LOG_LEVEL"
FORMATS = ("text", "json")
# Loggers that say too much at INFO for a service log, and the level they are kept at.
QUIET_LOGGERS = {"httpx": logging.WARNING, "httpcore": logging.WARNING, "urllib3": logging.WARNING}


class _Context:
    run: str | None = None
    worker: str | None = None
    secrets: tuple[str, ...] = ()


_CONTEXT = _Context()


def set_log_context(run: str | None = None, worker: str | None = None) -> None:
    """Name the run and worker this process serves: added to every record that names none itself."""
    _CONTEXT.run, _CONTEXT.worker = run, worker


def set_log_secrets(values: Iterable[str | None]) -> None:
    """Mask these values (a run's ``secret_env``) in every line this process logs from now on."""
    _CONTEXT.secrets = tuple(v for v in values if v)


def without_secrets(text: str) -> str:
    """``text`` with the values named by :func:`set_log_secrets` masked."""
    return redact(text, _CONTEXT.secrets) if _CONTEXT.secrets else text


def log_fields(run: str | None = None, worker: object = None, event: str | None = None) -> dict[str, Any]:
    """The ``extra=`` of a log call naming its run, worker and event kind."""
    return {"run": run, "worker": None if worker is None else str(worker), "event": event}


class ContextFilter(logging.Filter):
    """Gives every record ``run``, ``worker`` and ``event`` (from the record, else the process context)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "run", None) is None:
            record.run = _CONTEXT.run
        if getattr(record, "worker", None) is None:
            record.worker = _CONTEXT.worker
        if not hasattr(record, "event"):
            record.event = None
        return True


def install_filter(logger_name: str, log_filter: logging.Filter) -> None:
    """Add ``log_filter`` to the named logger once (calling again is a no-op). Processes forked later
    inherit it, so install filters for hivemind's child processes before they start."""
    target = logging.getLogger(logger_name)
    if log_filter not in target.filters:
        target.addFilter(log_filter)


def level_name(record: logging.LogRecord) -> str:
    """``WARNING`` even where hivemind renamed the level to ``WARN``."""
    return _LEVEL_NAMES.get(record.levelno, record.levelname)


_LEVEL_NAMES = {
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARNING",
    logging.ERROR: "ERROR",
    logging.CRITICAL: "CRITICAL",
}


def escape_control_characters(text: str) -> str:
    """``text`` with each control character written as its escape (``\n``, ``\x1b``, ``\u2028``)."""
    return CONTROL_CHARACTER_RE.sub(lambda found: found.group().encode("unicode_escape").decode(), text)


class TextFormatter(logging.Formatter):
    """``time LEVEL [run=.. worker=..] logger: message`` (the brackets only when a run or worker is known),
    one line per record apart from a traceback: control characters in the message and fields are escaped."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(level)s %(ctx)s%(name)s: %(kind)s%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        parts = [f"{key}={value}" for key in ("run", "worker") if (value := getattr(record, key, None))]
        record.ctx = escape_control_characters(f"[{' '.join(parts)}] ") if parts else ""
        record.level = level_name(record)
        event = getattr(record, "event", None)
        record.kind = escape_control_characters(f"{event}: ") if event else ""
        return without_secrets(super().format(record))  # the traceback too

    def formatMessage(self, record: logging.LogRecord) -> str:  # logging's name
        record.message = escape_control_characters(without_secrets(record.message))
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line with the fields listed in the module docstring."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, tz=UTC)
        line: dict[str, Any] = {
            "timestamp": stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z",
            "level": level_name(record).lower(),
            "logger": record.name,
            "run": getattr(record, "run", None),
            "worker": getattr(record, "worker", None),
            "event": getattr(record, "event", None),
            "message": without_secrets(record.getMessage()),
        }
        if record.exc_info:
            line["exception"] = without_secrets(self.formatException(record.exc_info))
        elif record.stack_info:
            line["exception"] = without_secrets(self.formatStack(record.stack_info))
        return json.dumps(line, default=str, ensure_ascii=False)


#: what Lightning's console tip about its cloud logger starts with (printed at every trainer's start)
LIGHTNING_TIP_START = "💡 Tip: For seamless cloud logging"
#: hivemind's averaging round that found no groupmate, logged with a traceback (a peer left, or the swarm
#: is one worker for now): the worker trains on alone, as the run's averaging counts show
NO_GROUP_ERROR = ("AllreduceException", "could not find a group")
#: torch's deprecation warning of a check Lightning itself makes (``lightning/pytorch/utilities/_pytree.py``)
LEAFSPEC_WARNING = "`isinstance(treespec, LeafSpec)` is deprecated"


class KnownNoiseFilter(logging.Filter):
    """Drops the library messages a spotswarm user cannot act on and keeps one line where a traceback
    says less than its first line: Lightning's cloud-logger tip, torch's deprecation warning about
    Lightning's code (warnings reach the log as ``py.warnings`` records), hivemind's "could not find a
    group" traceback (kept as one warning). Anything else passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("lightning") and str(record.msg).startswith(LIGHTNING_TIP_START):
            return False
        if record.name == "py.warnings" and LEAFSPEC_WARNING in record.getMessage():
            return False
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and type(exc).__name__ == NO_GROUP_ERROR[0] and NO_GROUP_ERROR[1] in str(exc):
            record.msg, record.args = "averaging round without a group: %s; training goes on alone", (exc,)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


def resolve_format(fmt: str | None) -> str:
    """``fmt`` or ``$SPOTSWARM_LOG_FORMAT`` or ``text``; raises ValueError for an unknown format."""
    chosen = (fmt or os.environ.get(FORMAT_ENV) or "text").strip().lower()
    if chosen not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {chosen!r}")
    return chosen


def configure_logging(
    level: str | int = "INFO",
    fmt: str | None = None,
    stream: IO[str] | None = None,
    *,
    hivemind: bool = True,
    lightning: bool = True,
) -> str:
    """Install the one root handler (replacing earlier ones) and return the format used.

    hivemind and Lightning add handlers of their own when imported; ``hivemind``/``lightning`` import
    them now and route their records through ours instead (seconds of imports: pass False where the
    process never uses them). Raises ValueError for an unknown format or level.
    """
    chosen = resolve_format(fmt)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(ContextFilter())
    handler.addFilter(KnownNoiseFilter())
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter())
    logging.basicConfig(
        level=level.upper() if isinstance(level, str) else level, handlers=[handler], force=True
    )
    for name, quiet_level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(quiet_level)
    if hivemind:
        _route_hivemind(os.environ.get(HIVEMIND_LEVEL_ENV, "WARNING").upper())
    if lightning:
        _route_lightning()
    logging.captureWarnings(True)
    return chosen


def _route_hivemind(level: str) -> None:
    """Send hivemind's records through the root handler, at ``level`` (a no-op without hivemind)."""
    try:
        from hivemind.utils import logging as hivemind_logging
    except ImportError:
        logging.getLogger("hivemind").setLevel(level)
        return
    hivemind_logging.use_hivemind_log_handler("nowhere")
    logging.getLogger("hivemind").setLevel(level)


def _route_lightning() -> None:
    """Drop the console handler ``import lightning`` puts on its logger (its lines reach ours anyway)."""
    try:
        import lightning  # noqa: F401 - imported for its side effect on logging, undone below
    except ImportError:
        return
    # Each package gives its own logger a console handler of its own when imported before ours is set.
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        chatty = logging.getLogger(name)
        for handler in list(chatty.handlers):
            chatty.removeHandler(handler)
        chatty.propagate = True
