"""orchestrator/files.py: files written whole (state files, the admin token, the authority key)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from orchestrator.config import Settings, ensure_admin_token
from orchestrator.files import create_atomic, write_atomic


@pytest.mark.timeout(30)
def test_write_replaces_the_file_whole_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_atomic(path, '{"a": 1}')
    write_atomic(path, b'{"a": 2}')
    assert path.read_text() == '{"a": 2}'
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.timeout(30)
def test_private_files_are_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "open", "x")
        write_atomic(tmp_path / "secret", "x", private=True)
        assert create_atomic(tmp_path / "key", "x", private=True)
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"open": 0o644, "secret": 0o600, "key": 0o600}


@pytest.mark.timeout(30)
def test_create_never_overwrites_and_exactly_one_of_many_creators_wins(tmp_path: Path) -> None:
    path = tmp_path / "admin_token"
    assert create_atomic(path, "first") is True
    assert create_atomic(path, "second") is False
    assert path.read_text() == "first"

    contested = tmp_path / "contested"
    start = threading.Barrier(8)
    results: list[bool] = []

    def create(index: int) -> None:
        start.wait()
        results.append(create_atomic(contested, f"writer {index}"))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(results) == [False] * 7 + [True]
    assert contested.read_text().startswith("writer ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["admin_token", "contested"]


@pytest.mark.timeout(30)
def test_the_admin_token_is_generated_once_owner_only_then_read_back(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    token, generated = ensure_admin_token(settings)
    assert generated and token == settings.admin_token_path().read_text().strip()
    assert stat.S_IMODE(settings.admin_token_path().stat().st_mode) == 0o600
    assert ensure_admin_token(settings) == (token, False)
