"""What ``spotswarm demo`` (``make demo``) prints works when a person follows it.

The test reads the banner as a newcomer would: it opens every URL printed there in a headless Chromium
(each answers 200 and renders: the status page lists the demo run, the run page shows it, the API docs
list the operations), and runs the printed CLI line as printed through a shell, putting in the admin
token only where the banner's token line says to read it from.

Not in the swarm lane: the demo's worker only has to exist, not to train or average with anyone, and every
bound here is a start-up's or a page's, which holds at the other lane's low priority.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest
from playwright.sync_api import expect

from orchestrator.cli.demo import DEMO_RUN
from tests.e2e.test_demo_exits import DEMO_BOOT_S, start_demo
from tests.support.browser import open_browser
from tests.support.processes import VENV_BIN, ProcessRegistry
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.browser]
BANNER_END = "Press Ctrl-C to stop."


def banner_lines(log: str) -> dict[str, str]:
    """``{"status page": "http://...", ...}``: the banner's ``  label : value`` lines."""
    banner = log[log.index("spotswarm demo is running") : log.index(BANNER_END)]
    found = (re.match(r"\s+([a-zA-Z ]+?)\s+: (.*)$", line) for line in banner.splitlines())
    return {match.group(1): match.group(2) for match in found if match}


@pytest.mark.timeout(300)
def test_every_url_and_command_the_banner_prints_works(
    processes: ProcessRegistry, loop_data_dir: Path
) -> None:
    demo, _ = start_demo(processes, loop_data_dir, uuid.uuid4().hex)
    wait_until(
        lambda: BANNER_END in demo.log() or not demo.alive(),
        DEMO_BOOT_S,
        message="the demo prints its banner",
    )
    assert demo.alive(), demo.log()[-3000:]
    printed = banner_lines(demo.log())
    urls = {label: value for label, value in printed.items() if value.startswith("http")}
    assert set(urls) == {"status page", "run page", "API docs"}, printed

    with open_browser() as browser:
        page = browser.page
        for label, url in urls.items():
            response = page.goto(url)
            assert response is not None and response.status == 200, f"{label}: {url}"
            assert "text/html" in response.headers["content-type"], f"{label} {url} is not a page"
        page.goto(urls["status page"])
        expect(page.locator(f'tr[data-run="{DEMO_RUN}"]')).to_have_count(1)
        page.goto(urls["run page"])
        expect(page.locator("#run-name")).to_have_text(DEMO_RUN)
        expect(page.locator("#run-state")).to_have_text(re.compile("pending|running"))
        page.goto(urls["API docs"])
        expect(page.locator("#swagger-ui")).to_contain_text("Create a run (admin)", timeout=30_000)
        assert not browser.problems, browser.problems

    # Output to a file, the token line names the file to read it from (`cat PATH`): as a person would.
    token_file = re.search(r"cat (\S+)\)$", printed["admin token"])
    assert token_file, printed["admin token"]
    token = Path(token_file.group(1)).read_text().strip()
    command = printed["CLI"].replace("<admin token>", token)
    shell_env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    for name in ("SPOTSWARM_URL", "SPOTSWARM_TOKEN"):
        shell_env.pop(name, None)
    done = subprocess.run(
        ["bash", "-c", command], env=shell_env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"{printed['CLI']}: {done.stdout}{done.stderr}"
    assert done.stdout.startswith(f"run {DEMO_RUN}\n"), done.stdout
