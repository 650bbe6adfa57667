"""Two lanes for a run in two processes (``make test``, ``TEST_WORKERS=2`` by default: pytest-xdist,
``--dist loadgroup``).

About a third of two cores sits idle through a one-process run (``make test TEST_WORKERS=1``): tests
that wait on timers, and in-process API tests that use one core. The tests marked ``swarm`` (real
hivemind peers training) use the rest, and two of them at once run out of their time bounds on 2
cores. So the swarm tests form one group that a single process runs one after the other, first, while
the other process takes the other tests in order (a module's tests one after the other, so that its
module-scoped fixtures start once).

A process lowers its priority to the lowest (``nice`` 19, inherited by the orchestrators and workers its
tests start) before its first test outside the swarm lane: where both lanes want the cores, the swarm
lane gets nearly all of them (the kernel weighs nice 19 at 15 against 1,024 for nice 0; nice 5, tried
first, left it about three quarters, and swarm tests then failed on timing), and the other lane fills
what the swarm lane leaves idle. A niceness once raised stays, which is why the swarm lane must come
first in its process. A one-process run is unchanged.
"""

from __future__ import annotations

import os

import pytest

#: the xdist group of every ``swarm`` test: one process runs them, one at a time
SWARM_LANE = "swarm-lane"
#: the niceness of a process once it runs a test outside the swarm lane (0 is the default priority)
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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns the groups into node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the swarm tests in one group, first (with ``--no-loadscope-reorder`` xdist hands out work in
    this order); every other test is a unit of its own."""
    if not _in_lanes(config):
        return
    for item in items:
        if _in_swarm_lane(item):
            item.add_marker(pytest.mark.xdist_group(SWARM_LANE))
    items.sort(key=lambda item: not _in_swarm_lane(item))  # stable: the order within each lane stays


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Outside the swarm lane, run at a lower priority (once raised, a process's niceness stays); in
    it, fail rather than run beside another swarm test if xdist did not take the group."""
    if not _in_lanes(item.config):
        return
    if not _in_swarm_lane(item):
        os.nice(max(0, OTHER_LANE_NICENESS - os.nice(0)))
    elif not item.nodeid.endswith("@" + SWARM_LANE):
        pytest.fail(_GROUPING_BROKEN, pytrace=False)
