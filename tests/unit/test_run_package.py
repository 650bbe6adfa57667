"""A run's code package: what `runs create --workdir` packs (ignore rules, determinism, size cap, links)
and what a worker accepts and extracts (orchestrator/cli/packaging.py, worker/runtime/package.py)."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from orchestrator.cli.packaging import PackagingError, collect, pack
from tests.support.archives import member, path_max_escape, tar_with
from worker.runtime.package import (
    UnsafePackage,
    ensure_package,
    extract,
    inspect_archive,
    sha256_of,
)

LIMIT = 1 << 20


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def project(root: Path) -> Path:
    return write(
        root,
        {
            "mypkg/__init__.py": "",
            "mypkg/model.py": "X = 1\n",
            "mypkg/__pycache__/model.cpython-311.pyc": "bytecode",
            "data/train.bin": "0" * 100,
            "data/keep.txt": "kept?",
            "weights.bin": "1" * 10,
            "keep.bin": "2",
            "notes.md": "private notes",
            "sub/.gitignore": "local-secret.txt\n",
            "sub/local-secret.txt": "x",
            "sub/code.py": "",
            ".gitignore": "data/\n*.bin\n!keep.bin\n",
            ".spotswarmignore": "notes.md\n",
            ".git/config": "[core]",
            ".venv/bin/python": "",
            "requirements.txt": "einops\n",
        },
    )


def test_ignore_rules_follow_git_and_spotswarmignore(tmp_path: Path) -> None:
    names = [entry.name for entry in collect(project(tmp_path)).entries]
    assert names == [
        ".gitignore",
        ".spotswarmignore",
        "keep.bin",
        "mypkg/__init__.py",
        "mypkg/model.py",
        "requirements.txt",
        "sub/.gitignore",
        "sub/code.py",
    ]


def test_the_same_tree_gives_the_same_bytes_and_a_change_another(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    first = pack(root, mkdir(tmp_path / "a"), LIMIT)
    for path in root.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000), follow_symlinks=False)
    (root / "mypkg" / "model.py").chmod(0o600)  # permissions other than the x bit do not count
    second = pack(root, mkdir(tmp_path / "b"), LIMIT)
    assert first.sha256 == second.sha256 == sha256_of(second.archive)
    assert (first.files, first.unpacked_bytes) == (8, second.unpacked_bytes)
    (root / "mypkg" / "model.py").write_text("X = 2\n")
    assert pack(root, mkdir(tmp_path / "c"), LIMIT).sha256 != first.sha256


def test_a_tree_over_the_cap_is_refused_naming_its_biggest_files(tmp_path: Path) -> None:
    root = write(tmp_path / "p", {"model.py": "", "dataset.csv": "x" * 3000, "small.txt": "y" * 10})
    with pytest.raises(PackagingError) as caught:
        pack(root, mkdir(tmp_path / "out"), 2048)
    message = str(caught.value)
    assert "dataset.csv" in message and message.index("dataset.csv") < message.index("small.txt")
    assert ".spotswarmignore" in message and "--workdir-max-mib" in message
    assert not (tmp_path / "out" / "package.tar.gz").exists()


def test_links_inside_the_tree_travel_and_links_leaving_it_are_refused(tmp_path: Path) -> None:
    root = write(tmp_path / "p", {"mypkg/model.py": "X = 1\n"})
    (root / "alias.py").symlink_to(root / "mypkg" / "model.py")  # absolute, but inside: made relative
    package = pack(root, mkdir(tmp_path / "out"), LIMIT)
    dest = tmp_path / "extracted"
    extract(package.archive, dest, LIMIT)
    assert os.readlink(dest / "alias.py") == "mypkg/model.py"
    assert (dest / "alias.py").read_text() == "X = 1\n"

    (tmp_path / "outside.txt").write_text("secret")
    (root / "escape").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(PackagingError, match=r"escape links to .*outside the workdir"):
        pack(root, mkdir(tmp_path / "out2"), LIMIT)


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (member("../evil.py", b"x"), "only relative paths"),
        (member("/etc/cron.d/evil", b"x"), "only relative paths"),
        (member("a/../../evil.py", b"x"), "only relative paths"),
        (member("passwd", type=tarfile.SYMTYPE, linkname="/etc/passwd"), "leaves the package"),
        (member("up", type=tarfile.SYMTYPE, linkname="../../x"), "leaves the package"),
        (member("dev", type=tarfile.CHRTYPE), "only files"),
        (member("hard", type=tarfile.LNKTYPE, linkname="x"), "only files"),
    ],
)
def test_an_archive_that_could_escape_its_directory_is_refused(
    tmp_path: Path, entry: tuple[tarfile.TarInfo, bytes], reason: str
) -> None:
    archive = tar_with(tmp_path, member("ok.py", b"1"), entry)
    with pytest.raises(UnsafePackage, match=reason):
        inspect_archive(archive, LIMIT)
    with pytest.raises(UnsafePackage):
        extract(archive, tmp_path / "dest", LIMIT)
    assert not (tmp_path / "evil.py").exists() and not (tmp_path.parent / "evil.py").exists()


def test_an_archive_that_unpacks_past_the_limit_or_is_not_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafePackage, match="more than 100 bytes"):
        inspect_archive(tar_with(tmp_path, member("big", b"x" * 101)), 100)
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tar at all")
    with pytest.raises(UnsafePackage, match="not a gzip-compressed tar"):
        inspect_archive(junk, LIMIT)


def test_the_cache_keeps_only_packages_whose_bytes_match_their_digest(tmp_path: Path) -> None:
    package = pack(write(tmp_path / "p", {"m.py": "X = 1\n"}), mkdir(tmp_path / "out"), LIMIT)
    cache = tmp_path / "cache"
    fetched: list[Path] = []

    def fetch(dest: Path) -> None:
        fetched.append(dest)
        dest.write_bytes(package.archive.read_bytes())

    with pytest.raises(UnsafePackage, match="the run names"):
        ensure_package(cache, "0" * 64, fetch, LIMIT)
    assert not (cache / "packages" / ("0" * 64)).exists()
    assert not (cache / "packages" / f"{'0' * 64}.ready").exists()

    path, cached = ensure_package(cache, package.sha256, fetch, LIMIT)
    again, cached_again = ensure_package(cache, package.sha256, fetch, LIMIT)
    assert (cached, cached_again, path) == (False, True, again)
    assert (path / "m.py").read_text() == "X = 1\n" and len(fetched) == 2
    assert not any(p.name.endswith(".part") for p in (cache / "packages").iterdir())


def mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def test_links_nested_past_path_max_cannot_write_outside_the_extraction_directory(tmp_path: Path) -> None:
    archive = path_max_escape(tmp_path)
    with pytest.raises(UnsafePackage, match="below the link"):
        inspect_archive(archive, LIMIT)
    with pytest.raises(UnsafePackage):
        extract(archive, tmp_path / "dest", LIMIT)
    assert not (tmp_path / "PWNED-outside-dest.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.tar.gz"]


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        (
            [
                member("l2", type=tarfile.SYMTYPE, linkname="sub"),
                member("sub/l3", type=tarfile.SYMTYPE, linkname="../l2/.."),
            ],
            "goes through the link 'l2'",
        ),
        ([member("up", type=tarfile.SYMTYPE, linkname="sub"), member("up", b"x")], "appears twice"),
        (
            [member("later/x.py", b"x"), member("later", type=tarfile.SYMTYPE, linkname="sub")],
            "below the link",
        ),
    ],
)
def test_entries_whose_place_a_link_decides_are_refused(
    tmp_path: Path, entries: list[tuple[tarfile.TarInfo, bytes]], reason: str
) -> None:
    archive = tar_with(tmp_path, member("sub/ok.py", b"1"), *entries)
    with pytest.raises(UnsafePackage, match=reason):
        extract(archive, tmp_path / "dest", LIMIT)
    assert not (tmp_path / "dest").exists()


def test_links_up_and_across_the_tree_extract_as_links_with_the_packers_modes(tmp_path: Path) -> None:
    root = write(tmp_path / "p", {"mypkg/model.py": "X = 1\n", "tools/run.sh": "echo\n"})
    (root / "tools" / "run.sh").chmod(0o700)
    (root / "tools" / "model.py").symlink_to(Path("..") / "mypkg" / "model.py")
    (root / "pkg").symlink_to("mypkg")
    dest = tmp_path / "extracted"
    extract(pack(root, mkdir(tmp_path / "out"), LIMIT).archive, dest, LIMIT)
    assert (dest / "tools" / "model.py").read_text() == (dest / "pkg" / "model.py").read_text() == "X = 1\n"
    assert os.readlink(dest / "tools" / "model.py") == "../mypkg/model.py"
    assert (
        (dest / "tools" / "run.sh").stat().st_mode & 0o777,
        (dest / "mypkg" / "model.py").stat().st_mode & 0o777,
    ) == (
        0o755,
        0o644,
    )


def test_data_dirs_and_secret_looking_files_stay_out_unless_asked_for(tmp_path: Path) -> None:
    root = write(
        tmp_path / "p",
        {
            "mypkg/model.py": "",
            "mypkg/tokens.py": "",  # code
            "tok/tokenizer.json": "{}",
            "tok/special_tokens_map.json": "{}",
            ".env.example": "API_KEY=",
            "data/admin_token": "ssa_x",
            "data/checkpoints/packages/a.tar.gz": "x",
            "certs/Server.PEM": "k",
            "hf_token": "hf_x",
            ".env": "API_KEY=x",
            "spotswarm.db-wal": "",
        },
    )
    contents = collect(root)
    assert [e.name for e in contents.entries] == [
        ".env.example",
        "mypkg/model.py",
        "mypkg/tokens.py",
        "tok/special_tokens_map.json",
        "tok/tokenizer.json",
    ]
    assert [(item.name, item.reason) for item in contents.left_out] == [
        (".env", "looks like a secret (matches .env)"),
        ("certs/Server.PEM", "looks like a secret (matches *.pem)"),
        ("data/", "an orchestrator's data dir (it holds admin_token)"),
        ("hf_token", "looks like a secret (its name says token)"),
        ("spotswarm.db-wal", "looks like a secret (matches spotswarm.db-*)"),
    ]
    everything = collect(root, include_secrets=True)
    assert len(everything.entries) == 11 and everything.left_out == []
