"""Forwarding of each run's progress to TensorBoard, from the orchestrator (one place, not every worker).

With ``tensorboard_dir`` set (``SPOTSWARM_TENSORBOARD_DIR``), every progress sample the heartbeat flusher
stores is also written as TensorBoard scalars into ``<tensorboard_dir>/<run name>/``: the run's reported
metrics under their own names (``train_loss``, ``val_loss``, ``lr-Optimizer``...) and its swarm figures
under ``spotswarm/`` (loss, samples per second, samples, live workers), at the swarm epoch as step.
``tensorboard --logdir <tensorboard_dir>`` shows every run; the files survive workers, which spot
instances lose with their disks.

The events are written by tensorboardX (the ``spotswarm[tensorboard]`` extra): it needs only numpy and
protobuf, which a server has already, while ``torch.utils.tensorboard`` needs the whole ``tensorboard``
package. Writes are queued to tensorboardX's own thread: forwarding never holds up the flusher.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from orchestrator.progress import RunPoint

logger = logging.getLogger(__name__)

MAX_OPEN_WRITERS = 64  # event files kept open at once; the least recently written run's is closed first


class TensorBoardForwarder:
    """Writes run points as TensorBoard scalars, one event directory per run (see the module docstring)."""

    def __init__(self, directory: Path, max_open: int = MAX_OPEN_WRITERS) -> None:
        self.directory = directory
        self._max_open = max_open
        self._writers: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def write(self, points: list[RunPoint]) -> None:
        """Queue ``points`` for writing; an unwritable directory is logged, never raised to the flusher."""
        with self._lock:
            for point in points:
                try:
                    self._write(point)
                except OSError as exc:
                    logger.warning("run %s: cannot write TensorBoard events: %s", point.run, exc)

    def _write(self, point: RunPoint) -> None:
        writer = self._writer(point.run)
        walltime = point.at.timestamp()
        for name, value in point.figures.items():
            writer.add_scalar(f"spotswarm/{name}", value, point.epoch, walltime=walltime)
        for name, value in point.metrics.items():
            writer.add_scalar(name, value, point.epoch, walltime=walltime)

    def _writer(self, run: str) -> Any:
        writer = self._writers.pop(run, None)
        if writer is None:
            from tensorboardX import SummaryWriter

            writer = SummaryWriter(logdir=str(self.directory / run), flush_secs=10)
            while len(self._writers) >= self._max_open:
                self._writers.popitem(last=False)[1].close()
        self._writers[run] = writer
        return writer

    def close(self) -> None:
        """Write out and close every event file."""
        with self._lock:
            for writer in self._writers.values():
                writer.close()
            self._writers.clear()
