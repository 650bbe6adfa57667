"""Lanes for a run in several processes (``make test``: pytest-xdist, ``--dist loadgroup``, three
processes by default).

The tests marked ``swarm`` (real hivemind peers training, on timelines of rounds, heartbeats and
matchmaking) hold their time bounds only with most of the machine's CPU behind them; the other tests
mostly wait on timers or use one core in bursts. So the first ``TEST_SWARM_LANES`` processes (by default
all but one) are swarm lanes: each takes the next swarm module while any is left, one module at a time
(a module's tests in order, so that its module-scoped fixtures start once), and only then the other
tests. The last process takes the other tests from the start, beside them, at the lowest priority. Two
swarm lanes fit two cores because the tests' digits workers train at a steady pace, not flat out
(``tests/support/paced_digits.py``).

A process lowers its priority to the lowest (``nice`` 19, inherited by the orchestrators and workers its
tests start) before its first test outside the swarm lanes: where both want the cores, the swarm lanes
get nearly all of them (the kernel weighs nice 19 at 15 against 1,024 for nice 0; nice 5, tried first,
left them about three quarters, and swarm tests then failed on timing), and the other tests fill what the
swarm lanes leave idle. A niceness once raised stays, so a swarm lane takes its first other test only
once no swarm module is left to hand out. A one-process run (``TEST_WORKERS=1``) is unchanged.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling

#: the prefix of the xdist group of every ``swarm`` test; a module's swarm tests form one group
SWARM_LANE = "swarm-lane"
#: how many of the processes are swarm lanes (default: all but one, at least one)
SWARM_LANES_ENV = "TEST_SWARM_LANES"
#: the niceness of a process once it runs a test outside the swarm lanes (0 is the default priority)
OTHER_LANE_NICENESS = 19
#: xdist (3.8) groups by a suffix it writes into each test's node id, which pytest 9.2 no longer lets it do
_GROUPING_BROKEN = (
    "pytest-xdist did not group the swarm tests (its node-id suffix is missing: pytest-xdist issue 1386, "
    "pytest >= 9.2); keep pytest below 9.2 or run the tests in one process (TEST_WORKERS=1)"
)


def _in_lanes(config: pytest.Config) -> bool:
    """Whether this process is a pytest-xdist worker of a ``--dist loadgroup`` run."""
    return bool(getattr(config.option, "loadgroup", False)) and "PYTEST_XDIST_WORKER" in os.environ


def _in_swarm_lane(item: pytest.Item) -> bool:
    return item.get_closest_marker("swarm") is not None


def _swarm_group(item: pytest.Item) -> str:
    return f"{SWARM_LANE}:{item.module.__name__ if item.module else item.path.name}"


def _is_swarm_scope(scope: str) -> bool:
    return scope.startswith(SWARM_LANE + ":")


def swarm_lanes(workers: int) -> int:
    """How many of ``workers`` processes take swarm modules."""
    value = os.environ.get(SWARM_LANES_ENV, "").strip()
    if value and not value.isdigit():
        raise pytest.UsageError(f"{SWARM_LANES_ENV} must be a whole number of processes, not {value!r}")
    wanted = int(value or 0) or workers - 1
    return max(1, min(wanted, workers))


class SwarmLanesScheduling(LoadGroupScheduling):
    """xdist's group scheduling, with the units handed out by lane: a swarm lane takes the first swarm
    module left (else the first other test), the other process the first other test (never a swarm
    module, which would run at its lowered priority)."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._swarm_lanes = swarm_lanes(self.numnodes)

    def _is_swarm_lane(self, node: Any) -> bool:
        return int(str(node.gateway.id).removeprefix("gw")) < self._swarm_lanes

    def _next_scope(self, node: Any) -> str | None:
        """The unit ``node`` takes next, or None when nothing left is for it."""
        if self._is_swarm_lane(node):
            swarm = next((scope for scope in self.workqueue if _is_swarm_scope(scope)), None)
            if swarm is not None:
                return swarm
        return next((scope for scope in self.workqueue if not _is_swarm_scope(scope)), None)

    def _assign_work_unit(self, node: Any) -> None:
        scope = self._next_scope(node)
        if scope is None:
            return
        self.workqueue.move_to_end(scope, last=False)  # the base class hands out the queue's first unit
        super()._assign_work_unit(node)

    def _reschedule(self, node: Any) -> None:
        if not node.shutting_down and self.workqueue and self._next_scope(node) is None:
            node.shutdown()  # what is left is for the swarm lanes: this one runs what it holds and ends
            return
        super()._reschedule(node)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadGroupScheduling | None:
    """The lanes' scheduler for a ``--dist loadgroup`` run; xdist's own for any other."""
    if config.getoption("dist", "no") != "loadgroup":
        return None
    return SwarmLanesScheduling(config, log)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns the groups into node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put each module's swarm tests in a group of their own, first (the lanes' scheduler takes the
    queue's units in this order); every other test is a unit of its own, or of the group its module
    names (``tests/integration/test_tls_proxy.py``)."""
    if not _in_lanes(config):
        return
    for item in items:
        if _in_swarm_lane(item):
            item.add_marker(pytest.mark.xdist_group(_swarm_group(item)))
    items.sort(key=lambda item: not _in_swarm_lane(item))  # stable: the order within each lane stays


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Outside the swarm lanes, run at a lower priority (once raised, a process's niceness stays); in
    them, fail rather than run beside other swarm modules if xdist did not take the group."""
    if not _in_lanes(item.config):
        return
    if not _in_swarm_lane(item):
        os.nice(max(0, OTHER_LANE_NICENESS - os.nice(0)))
    elif not item.nodeid.endswith("@" + _swarm_group(item)):
        pytest.fail(_GROUPING_BROKEN, pytrace=False)
