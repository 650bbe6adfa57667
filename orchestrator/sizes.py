"""Sizes as people read them, one way everywhere (the CLI, events, messages): ``12 B``, ``32.4 KiB``,
``1.5 GiB``. The status page's ``fmtBytes`` (``web/static/common.js``) writes them the same way, so a
checkpoint reads alike on the page, in ``runs show`` and in its ``checkpoint.stored`` event."""

from __future__ import annotations

UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def fmt_bytes(size: int | None) -> str:
    """``size`` in the largest binary unit that keeps it at 1 or more, one decimal; ``-`` for None."""
    if size is None:
        return "-"
    value = float(size)
    for unit in UNITS:
        if value < 1024 or unit == UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
