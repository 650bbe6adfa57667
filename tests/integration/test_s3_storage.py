"""S3Store against a real moto server process: round trips, multipart uploads, checksum verification."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.storage.base import (
    PACKAGES_PREFIX,
    CheckpointCorrupt,
    CheckpointNotFound,
    CheckpointStore,
    checkpoint_key,
    package_key,
)
from orchestrator.storage.local import LocalCheckpointStore
from orchestrator.storage.s3 import S3Store, S3StoreConfig
from tests.support.aws import FakeAws

BUCKET = "spotswarm-checkpoints"
MIB = 1 << 20


def _store(aws: FakeAws, **overrides: int) -> S3Store:
    client = aws.client("s3")
    client.create_bucket(Bucket=BUCKET)
    config = S3StoreConfig(bucket=BUCKET, prefix="team-a/ckpt", **overrides)  # type: ignore[arg-type]
    return S3Store(config, client=client)


def _file(tmp_path: Path, size: int) -> tuple[Path, str]:
    path = tmp_path / f"blob-{size}.ckpt"
    data = os.urandom(size)
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


@pytest.mark.timeout(60)
def test_checkpoint_round_trips_under_prefix_with_checksum_metadata(aws: FakeAws, tmp_path: Path) -> None:
    store = _store(aws)
    assert isinstance(store, CheckpointStore)
    key = checkpoint_key("swarm-1", 12)
    path, sha = _file(tmp_path, 300_000)

    store.put_file(key, path, sha)

    head = aws.client("s3").head_object(Bucket=BUCKET, Key=f"team-a/ckpt/{key}")
    assert head["Metadata"]["sha256"] == sha
    assert store.size(key) == 300_000
    assert store.sha256(key) == sha
    assert b"".join(store.open_stream(key, chunk_bytes=64 * 1024)) == path.read_bytes()
    assert store.list_keys("runs/swarm-1/") == [key]


@pytest.mark.timeout(90)
def test_large_checkpoint_goes_up_in_parts_and_downloads_verified(aws: FakeAws, tmp_path: Path) -> None:
    store = _store(aws, multipart_threshold_bytes=5 * MIB, multipart_chunk_bytes=5 * MIB)
    key = checkpoint_key("swarm-1", 3)
    path, sha = _file(tmp_path, 11 * MIB)

    store.put_file(key, path, sha)

    etag = aws.client("s3").head_object(Bucket=BUCKET, Key=store.object_key(key))["ETag"]
    assert etag.strip('"').endswith("-3"), f"expected a 3-part multipart upload, ETag {etag}"
    dest = tmp_path / "restored" / "model.ckpt"
    assert store.download_file(key, dest) == sha
    assert dest.read_bytes() == path.read_bytes()


@pytest.mark.timeout(60)
def test_tampered_object_raises_corrupt_on_stream_and_download(aws: FakeAws, tmp_path: Path) -> None:
    store = _store(aws)
    key = checkpoint_key("swarm-2", 1)
    path, sha = _file(tmp_path, 100_000)
    store.put_file(key, path, sha)
    # Something outside spotswarm rewrites the bytes but keeps the old checksum metadata.
    aws.client("s3").put_object(
        Bucket=BUCKET, Key=store.object_key(key), Body=b"x" * 100_000, Metadata={"sha256": sha}
    )

    with pytest.raises(CheckpointCorrupt, match="does not match"):
        b"".join(store.open_stream(key))
    dest = tmp_path / "restored.ckpt"
    with pytest.raises(CheckpointCorrupt):
        store.download_file(key, dest)
    assert not dest.exists(), "a corrupt download must not leave a file behind"
    assert list(tmp_path.glob(".restored.ckpt.*")) == []


@pytest.mark.timeout(60)
def test_object_without_checksum_is_refused(aws: FakeAws) -> None:
    store = _store(aws)
    aws.client("s3").put_object(
        Bucket=BUCKET, Key=store.object_key("runs/x/epoch-00000001.ckpt"), Body=b"abc"
    )
    with pytest.raises(CheckpointCorrupt, match="no sha256"):
        store.open_stream("runs/x/epoch-00000001.ckpt")


@pytest.mark.timeout(60)
def test_missing_key_raises_not_found_and_delete_is_idempotent(aws: FakeAws, tmp_path: Path) -> None:
    store = _store(aws)
    key = checkpoint_key("swarm-3", 7)
    with pytest.raises(CheckpointNotFound):
        store.size(key)
    with pytest.raises(CheckpointNotFound):
        store.open_stream(key)
    store.delete(key)  # absent: no error

    path, sha = _file(tmp_path, 1000)
    store.put_file(key, path, sha)
    store.delete(key)
    with pytest.raises(CheckpointNotFound):
        store.size(key)
    assert store.list_keys() == []


def test_keys_that_escape_the_prefix_are_refused() -> None:
    store = S3Store(S3StoreConfig(bucket=BUCKET, prefix="p"), client=object())
    for bad in ("", "/abs", "runs/../../etc"):
        with pytest.raises(ValueError):
            store.object_key(bad)
    assert store.object_key("runs/a/epoch-00000001.ckpt") == "p/runs/a/epoch-00000001.ckpt"


@pytest.mark.timeout(60)
def test_stored_since_lists_packages_with_their_times_on_s3_and_on_disk(aws: FakeAws, tmp_path: Path) -> None:
    path, sha = _file(tmp_path, 1000)
    before = datetime.now(UTC) - timedelta(seconds=5)  # moto's times have whole seconds
    for store in (_store(aws), LocalCheckpointStore(tmp_path / "local")):
        store.put_file(package_key(sha), path, sha)
        store.put_file(checkpoint_key("swarm-1", 1), path, sha)
        stored = store.stored_since(PACKAGES_PREFIX)
        assert list(stored) == [package_key(sha)], store.name
        assert before <= stored[package_key(sha)] <= datetime.now(UTC) + timedelta(seconds=5)
