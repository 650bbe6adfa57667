"""A simulated spot market for the end-to-end tests: a trace the test writes (and may append to while the
orchestrator follows it) and the environment that points the local launcher at it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def spot_market(tmp_path: Path, trace_lines: str, **settings: Any) -> tuple[Path, dict[str, str]]:
    """Write ``trace_lines`` (Parcae's JSON lines) and a market following them (``follow``: lines the
    test appends apply as they come) with ``settings`` (``slots``, ``compress``, ``notice_s``, ...);
    return the trace and the orchestrator environment that uses the market, import check off."""
    trace = tmp_path / "market.jsonl"
    trace.write_text(trace_lines)
    market = tmp_path / "market.json"
    market.write_text(json.dumps({"trace": trace.name, "follow": True, **settings}))
    return trace, {"SPOTSWARM_LOCAL_SPOT_MARKET": str(market), "SPOTSWARM_CHECK_IMPORTS": "false"}
