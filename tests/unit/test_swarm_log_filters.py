"""The log filters that keep hivemind's known-benign shutdown races out of the logs, and nothing else."""

from __future__ import annotations

import logging
from concurrent.futures import InvalidStateError

import pytest

from worker._hivemind_compat import quiet_cancelled_rounds


def never_retrieved(exc: BaseException) -> logging.LogRecord:
    """The record asyncio logs for a task whose exception nobody retrieved."""
    return logging.LogRecord(
        "asyncio",
        logging.ERROR,
        __file__,
        1,
        "Task exception was never retrieved",
        None,
        (type(exc), exc, None),
    )


def test_a_round_finishing_after_its_step_was_cancelled_is_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    quiet_cancelled_rounds()
    quiet_cancelled_rounds()  # idempotent
    asyncio_logger = logging.getLogger("asyncio")
    assert len([f for f in asyncio_logger.filters if type(f).__name__ == "_CancelledRoundFilter"]) == 1
    with caplog.at_level(logging.DEBUG):
        asyncio_logger.handle(
            never_retrieved(InvalidStateError("Can't set_result to a future that is CANCELLED (1)"))
        )
        asyncio_logger.handle(
            never_retrieved(InvalidStateError("Can't set_result to a future that is FINISHED"))
        )
        asyncio_logger.handle(never_retrieved(RuntimeError("a real failure")))
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [str(r.exc_info[1]) for r in errors if r.exc_info] == [
        "Can't set_result to a future that is FINISHED",
        "a real failure",
    ]
    assert any("after its step was cancelled" in r.getMessage() for r in caplog.records)
