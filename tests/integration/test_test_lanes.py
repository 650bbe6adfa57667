"""The lanes of `make test` (``tests/support/lanes.py``), in a real pytest-xdist run of a small suite: the
first two of three processes take the swarm modules, each module whole in one process, at the default
priority; the third takes the other tests from the start at the lowest priority, never a swarm test, and
ends once only swarm modules are left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.lanes import OTHER_LANE_NICENESS

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


def _run(root: Path) -> list[dict[str, object]]:
    record = root / "record.jsonl"
    args = ["-n", "3", "--dist", "loadgroup", "--no-loadscope-reorder", "-p", "tests.support.lanes", "-q"]
    env = {**os.environ, "LANES_RECORD": str(record), "PYTHONPATH": str(REPO_ROOT)}
    env.pop("TEST_SWARM_LANES", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args, str(root)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in record.read_text().splitlines()]


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
