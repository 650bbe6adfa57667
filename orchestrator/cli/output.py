"""What the CLI prints: aligned tables for people, JSON for scripts, a compact text chart, and the
formatting of numbers, times and sizes shared by several commands. Pure functions of the API's JSON; no
I/O here except :func:`echo_json` and :func:`echo_table`. Derived numbers (ETA, cost) come computed
from the server (``eta_s``, ``cost_usd``: ``orchestrator/domain/estimates.py``).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import click

from orchestrator.domain.states import FINISHED_RUN_STATES
from orchestrator.sizes import fmt_bytes as fmt_bytes  # where the CLI's modules found it first

TERMINAL_RUN_STATES = frozenset(state.value for state in FINISHED_RUN_STATES)  # as the API's JSON has them
_BLOCKS = " ▁▂▃▄▅▆▇█"


def echo_json(data: Any) -> None:
    """Print ``data`` as indented JSON (what ``--json`` gives scripts)."""
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned, text left-aligned."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    numeric = [
        any(_is_number(row[i]) for row in rows) and all(_is_number(row[i]) or row[i] is None for row in rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line([h.upper() for h in headers]), *(line(row) for row in cells)])


def echo_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], empty: str = "(none)") -> None:
    click.echo(format_table(headers, rows) if rows else empty)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return fmt_number(value)
    return str(value)


# -- numbers, times, sizes -------------------------------------------------------------------------


def fmt_number(value: float | None, digits: int = 4) -> str:
    """A float in ``digits`` significant digits ('-' for None)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}g}"


def fmt_metrics(metrics: Mapping[str, float] | None, width: int = 48, skip: Sequence[str] = ()) -> str:
    """``val_acc=0.91 val_loss=0.3124``, cut to ``width`` characters ('-' for none); names in ``skip``
    (shown elsewhere) are left out."""
    text = " ".join(
        f"{name}={fmt_number(value)}" for name, value in (metrics or {}).items() if name not in skip
    )
    if not text:
        return "-"
    return text if len(text) <= width else text[: width - 3] + "..."


def validation_metric(names: Iterable[str]) -> str | None:
    """The metric a validation chart shows: ``val_loss`` when reported, else the first ``val*`` name."""
    ordered = sorted(names)
    if "val_loss" in ordered:
        return "val_loss"
    return next((name for name in ordered if name.startswith("val")), None)


def fmt_duration(seconds: float | None) -> str:
    """``93`` -> ``1m33s``; ``None`` or negative -> ``-``."""
    if seconds is None or seconds < 0 or not math.isfinite(seconds):
        return "-"
    seconds = round(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def parse_time(text: str | None) -> datetime | None:
    """An ISO-8601 timestamp from the API (naive ones are taken as UTC)."""
    if not text:
        return None
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def age_s(text: str | None, now: datetime) -> float | None:
    moment = parse_time(text)
    return None if moment is None else max(0.0, (now - moment).total_seconds())


def fmt_age(text: str | None, now: datetime) -> str:
    seconds = age_s(text, now)
    return "-" if seconds is None else fmt_duration(seconds) + " ago"


def fmt_usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


# -- text chart ------------------------------------------------------------------------------------


def _columns(values: Sequence[float], width: int) -> list[float]:
    """Mean of the values falling into each of ``width`` columns (fewer columns if fewer values)."""
    if len(values) <= width:
        return list(values)
    out = []
    for col in range(width):
        lo = col * len(values) // width
        hi = max(lo + 1, (col + 1) * len(values) // width)
        chunk = values[lo:hi]
        out.append(sum(chunk) / len(chunk))
    return out


def text_chart(values: Sequence[float], width: int = 60, height: int = 6, unicode: bool | None = None) -> str:
    """A bar chart of ``values`` (oldest left) in ``height`` text rows, with max/min labels.

    Uses eighth-block characters when the terminal speaks UTF-8, else ``#``. Empty input -> ``(no data)``.
    """
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return "(no data)"
    if unicode is None:
        unicode = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "") == "utf8"
    cols = _columns(finite, width)
    low, high = min(cols), max(cols)
    span = (high - low) or 1.0
    levels = [1 + round((v - low) / span * (height * 8 - 1)) for v in cols]  # 1..height*8
    labels = [fmt_number(high), fmt_number(low)]
    pad = max(len(label) for label in labels)
    rows = []
    for row in range(height, 0, -1):
        floor = (row - 1) * 8
        chars = []
        for level in levels:
            fill = min(8, max(0, level - floor))
            chars.append(_BLOCKS[fill] if unicode else ("#" if fill else " "))
        label = labels[0] if row == height else labels[1] if row == 1 else ""
        rows.append(f"{label.rjust(pad)} |{''.join(chars).rstrip()}")
    return "\n".join(rows)
