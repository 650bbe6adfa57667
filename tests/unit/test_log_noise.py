"""The worker's log set-up keeps out the library lines a user cannot act on, and nothing else."""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Iterator

import pytest
from hivemind.averaging.allreduce import AllreduceException
from hivemind.utils import logging as hivemind_logging

from worker.runtime.logsetup import configure_logging


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    """The process's logging through :func:`configure_logging` into a string, restored afterwards."""
    root, hivemind = logging.getLogger(), logging.getLogger("hivemind")
    handlers, level, hivemind_level = list(root.handlers), root.level, hivemind.level
    mode = hivemind_logging._current_mode
    stream = io.StringIO()
    with warnings.catch_warnings():
        configure_logging("INFO", "text", stream, hivemind=True, lightning=False)
        try:
            yield stream
        finally:
            logging.captureWarnings(False)
            root.handlers[:], root.level = handlers, level
            hivemind_logging.use_hivemind_log_handler(mode)
            hivemind.setLevel(hivemind_level)


def test_a_round_without_a_group_is_one_warning_line_not_a_traceback(log_stream: io.StringIO) -> None:
    averager = logging.getLogger("hivemind.averaging.averager")
    try:
        raise AllreduceException("Averaging step failed: could not find a group")
    except AllreduceException as exc:
        averager.exception(exc)
    [line] = log_stream.getvalue().splitlines()
    assert " WARNING " in line and "could not find a group" in line and "training goes on alone" in line


def test_other_errors_keep_their_traceback(log_stream: io.StringIO) -> None:
    averager = logging.getLogger("hivemind.averaging.averager")
    try:
        raise AllreduceException("Averaging step failed: a groupmate sent garbage")
    except AllreduceException as exc:
        averager.exception(exc)
    text = log_stream.getvalue()
    assert " ERROR " in text and "Traceback" in text and "sent garbage" in text


def test_lightnings_tip_and_torchs_leafspec_warning_are_dropped(log_stream: io.StringIO) -> None:
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    rank_zero.info("💡 Tip: For seamless cloud logging and experiment tracking, try installing litlogger")
    rank_zero.info("GPU available: False, used: False")
    warnings.warn(
        "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec)` instead.",
        FutureWarning,
        stacklevel=1,
    )
    warnings.warn("another deprecation", FutureWarning, stacklevel=1)
    text = log_stream.getvalue()
    assert "Tip" not in text and "LeafSpec" not in text
    assert "GPU available" in text and "another deprecation" in text
