"""Trainer options shared by the worker agent, the examples, the test peers and the benchmarks."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Final

#: A Trainer that writes nothing of its own (no logger, checkpoint files, progress bar or model summary):
#: the process reports its progress itself (heartbeats, JSON lines, printed figures).
QUIET: Final = MappingProxyType[str, Any](
    {
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
)

#: No validation loop and no sanity check: for training-only peers.
NO_VALIDATION: Final = MappingProxyType[str, Any]({"num_sanity_val_steps": 0, "limit_val_batches": 0})
