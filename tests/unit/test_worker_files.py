"""worker/files.py: atomic JSON files; and the tests' own wait for a file another process writes
(tests/support/waiting.py)."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from tests.support.waiting import wait_for_file
from worker.files import write_json


@pytest.mark.timeout(30)
def test_json_is_written_whole_and_private_files_are_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "token.json"
    write_json(path, {"token": "x"}, private=True)
    assert json.loads(path.read_text()) == {"token": "x"}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


@pytest.mark.timeout(30)
def test_wait_returns_once_another_thread_writes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "peers.txt"
    writer = threading.Timer(0.2, lambda: write_json(path, ["/ip4/127.0.0.1/tcp/1"]))
    writer.start()
    try:
        assert wait_for_file(path, timeout_s=20) == path
    finally:
        writer.cancel()
    assert json.loads(path.read_text()) == ["/ip4/127.0.0.1/tcp/1"]


@pytest.mark.timeout(30)
def test_wait_for_a_file_that_never_comes_times_out_naming_it(tmp_path: Path) -> None:
    with pytest.raises(TimeoutError, match=r"never\.txt did not appear within 0\.2 s"):
        wait_for_file(tmp_path / "never.txt", timeout_s=0.2)
