"""The metrics a run's workers report (``report_metrics``): names or shell-style glob patterns, bounded.

Everything is bounded, because metric names become label values of the orchestrator's ``/metrics``
series and keys of stored JSON: a run names at most :data:`MAX_REPORT_PATTERNS` patterns and a worker
reports at most :data:`MAX_REPORTED_METRICS` values. Pydantic only.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Annotated

from pydantic import AfterValidator

MAX_REPORT_PATTERNS = 16  # entries of report_metrics
MAX_REPORTED_METRICS = 32  # values in one heartbeat, and kept per worker and per run
MAX_METRIC_NAME_CHARS = 100
#: What workers report when a run does not say: the training loss under its usual names, and every
#: metric whose name starts with ``val_`` (what ``self.log("val_...")`` in ``validation_step`` gives).
DEFAULT_REPORT_METRICS = ("train_loss", "loss", "train/loss", "val_*")
#: Names of the training loss, in the order a worker looks for it (the heartbeat's ``loss``).
LOSS_METRIC_NAMES = ("train_loss", "loss", "train/loss")

# Printable text without control characters or spaces at either end: a metric name (or pattern) is a
# label value in /metrics and a column in the CLI.
_NAME_RE = re.compile(r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$")


def is_metric_name(name: str) -> bool:
    """Whether ``name`` may be a metric name (or pattern): see :data:`MetricName`."""
    return len(name) <= MAX_METRIC_NAME_CHARS and _NAME_RE.match(name) is not None


def _metric_name(name: str) -> str:
    if not is_metric_name(name):
        raise ValueError(
            f"a metric name is 1 to {MAX_METRIC_NAME_CHARS} printable characters, "
            "without spaces at either end"
        )
    return name


MetricName = Annotated[str, AfterValidator(_metric_name)]


def check_report_patterns(patterns: list[str]) -> list[str]:
    """``patterns`` unchanged, or ValueError for a duplicate (each becomes one bounded set of names)."""
    if len(set(patterns)) != len(patterns):
        raise ValueError("report_metrics lists a pattern twice")
    return patterns


@lru_cache(maxsize=4096)
def metric_matches(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``name`` is one of ``patterns`` or matches one (``*``, ``?``, ``[...]``; case-sensitive)."""
    return any(name == pattern or fnmatchcase(name, pattern) for pattern in patterns)


def select_metrics(values: dict[str, float], patterns: tuple[str, ...]) -> dict[str, float]:
    """The entries of ``values`` whose names match ``patterns``: at most :data:`MAX_REPORTED_METRICS`,
    first by name, only valid names. The caller makes sure the values are finite."""
    names = sorted(name for name in values if is_metric_name(name) and metric_matches(name, patterns))
    return {name: values[name] for name in names[:MAX_REPORTED_METRICS]}
