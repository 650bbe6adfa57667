"""The lanes of `make test` (``tests/support/lanes.py``), in real pytest-xdist runs of a small suite: the
first two of three processes take the swarm modules, each module whole in one process, at the default
priority; the third takes the other tests from the start at the lowest priority, never a swarm test, and
ends once only swarm modules are left; ``TEST_SWARM_LANES`` sets how many lanes take swarm modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.lanes import OTHER_LANE_NICENESS, SWARM_LANES_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]
RECORD = """
import json, os
from pathlib import Path

import pytest

{mark}

@pytest.mark.parametrize("case", range({tests}))
def test_case(case, request):
    line = {{"test": request.node.nodeid, "worker": os.environ["PYTEST_XDIST_WORKER"], "nice": os.nice(0)}}
    with (Path(os.environ["LANES_RECORD"])).open("a") as out:
        out.write(json.dumps(line) + "\\n")
"""


def _suite(root: Path, swarm_modules: int, other_tests: int) -> None:
    for index in range(swarm_modules):
        mark = "pytestmark = pytest.mark.swarm"
        (root / f"test_swarm_{index}.py").write_text(RECORD.format(mark=mark, tests=3))
    (root / "test_other.py").write_text(RECORD.format(mark="", tests=other_tests))
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    swarm: a swarm test\n")


def _pytest(root: Path, swarm_lanes: str | None = None) -> subprocess.CompletedProcess[str]:
    args = ["-n", "3", "--dist", "loadgroup", "--no-loadscope-reorder", "-p", "tests.support.lanes", "-q"]
    env = {**os.environ, "LANES_RECORD": str(root / "record.jsonl"), "PYTHONPATH": str(REPO_ROOT)}
    env.pop(SWARM_LANES_ENV, None)
    if swarm_lanes is not None:
        env[SWARM_LANES_ENV] = swarm_lanes
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args, str(root)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _run(root: Path, swarm_lanes: str | None = None) -> list[dict[str, object]]:
    done = _pytest(root, swarm_lanes)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in (root / "record.jsonl").read_text().splitlines()]


def _module(line: dict[str, object]) -> str:
    return str(line["test"]).split("::")[0]


@pytest.mark.timeout(180)
def test_two_swarm_lanes_take_whole_swarm_modules_and_the_third_the_rest_at_the_lowest_priority(
    tmp_path: Path,
) -> None:
    _suite(tmp_path, swarm_modules=4, other_tests=8)
    lines = _run(tmp_path)
    start = os.nice(0)  # this test's own priority: the suite's processes inherit it
    swarm = [line for line in lines if "test_swarm_" in _module(line)]
    other = [line for line in lines if _module(line) == "test_other.py"]
    assert len(swarm) == 12 and len(other) == 8, lines
    assert {line["worker"] for line in swarm} == {"gw0", "gw1"}, swarm
    for module in {_module(line) for line in swarm}:
        assert len({line["worker"] for line in swarm if _module(line) == module}) == 1, (module, swarm)
    assert all(line["nice"] == start for line in swarm), swarm
    assert any(line["worker"] == "gw2" for line in other), other
    assert all(line["nice"] == max(start, OTHER_LANE_NICENESS) for line in other), other


@pytest.mark.timeout(180)
def test_the_third_process_ends_without_a_swarm_test_when_only_swarm_modules_are_left(tmp_path: Path) -> None:
    _suite(tmp_path, swarm_modules=5, other_tests=1)
    lines = _run(tmp_path)
    assert [line["worker"] for line in lines if _module(line) == "test_other.py"] == ["gw2"], lines
    assert "gw2" not in {line["worker"] for line in lines if "test_swarm_" in _module(line)}, lines


@pytest.mark.timeout(180)
def test_one_swarm_lane_when_asked_and_a_clear_error_for_a_count_that_is_not_one(tmp_path: Path) -> None:
    _suite(tmp_path, swarm_modules=2, other_tests=4)
    lines = _run(tmp_path, swarm_lanes="1")
    assert {line["worker"] for line in lines if "test_swarm_" in _module(line)} == {"gw0"}, lines
    refused = _pytest(tmp_path, swarm_lanes="two")
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR, refused.stdout + refused.stderr
    assert f"{SWARM_LANES_ENV} must be a whole number of processes, not 'two'" in refused.stderr, (
        refused.stderr
    )
