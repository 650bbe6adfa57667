"""The metrics a worker reports: what its module logs, picked by the run's ``report_metrics``.

Two sources, both kept by Lightning or by this module in memory: ``trainer.callback_metrics`` (what
``self.log`` gave at the latest step, and the latest validation's results: ``val_loss`` is there once a
validation has run, until the next one) and :class:`ReportingLogger`, a logger that writes nothing and
keeps the latest value of everything sent to the Trainer's loggers (what callbacks such as
``LearningRateMonitor`` log). The heartbeat carries the selection; the orchestrator stores, aggregates and
forwards it, so nothing on the worker's disk (lost with a spot instance) is needed.
"""

from __future__ import annotations

import math
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers import Logger
from typing_extensions import override

from worker.protocol.metrics import LOSS_METRIC_NAMES, MAX_REPORTED_METRICS, select_metrics

MAX_KEPT_NAMES = 4 * MAX_REPORTED_METRICS  # names a ReportingLogger remembers (a module may log many)


def finite_float(value: Any) -> float | None:
    """``value`` (a number or a one-element tensor) as a finite float; None otherwise."""
    if hasattr(value, "numel"):
        if value.numel() != 1:
            return None
        value = value.item()
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class ReportingLogger(Logger):
    """A Lightning logger that writes nothing: it remembers the latest value of each metric logged."""

    def __init__(self) -> None:
        super().__init__()
        self.latest: dict[str, float] = {}

    @property
    @override
    def name(self) -> str:
        return "spotswarm"

    @property
    @override
    def version(self) -> int:
        return 0

    @override
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        pass

    @override
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        for name, value in metrics.items():
            number = finite_float(value)
            if number is not None and (name in self.latest or len(self.latest) < MAX_KEPT_NAMES):
                self.latest[name] = number


def read_loss(metrics: Mapping[str, Any]) -> float | None:
    """The training loss in ``metrics`` (first known name); None if absent or not finite."""
    for name in LOSS_METRIC_NAMES:
        if name in metrics:
            return finite_float(metrics[name])
    return None


def reported_metrics(
    callback_metrics: Mapping[str, Any], logged: Mapping[str, float], patterns: tuple[str, ...]
) -> dict[str, float]:
    """What the next heartbeat reports: the finite values of both sources (``callback_metrics`` wins,
    being the newer) whose names match ``patterns``, at most :data:`MAX_REPORTED_METRICS`."""
    values = dict(logged)
    for name, value in callback_metrics.items():
        number = finite_float(value)
        if number is not None:
            values[name] = number
    return select_metrics(values, patterns)
