"""Checkpoints in an S3 bucket under a prefix, each object carrying its SHA-256 as metadata.

Large files go up as multipart uploads (boto3's transfer manager, thresholds in :class:`S3StoreConfig`).
S3 makes an object visible only when its single PUT or its ``CompleteMultipartUpload`` succeeds, so a
reader sees the old object or the whole new one: the atomicity :class:`CheckpointStore` asks for.

Every read checks the bytes against the ``sha256`` metadata written at upload time and raises
:class:`CheckpointCorrupt` on a mismatch; a streaming reader gets the error after the last chunk, so a
consumer must not trust a stream that ends in an exception.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from orchestrator.storage.base import CheckpointCorrupt, CheckpointNotFound

log = logging.getLogger(__name__)

SHA256_METADATA_KEY = "sha256"  # stored by S3 as the header x-amz-meta-sha256
_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})


@dataclass(frozen=True)
class S3StoreConfig:
    """Where checkpoints live and how they travel.

    ``multipart_threshold_bytes``: files at least this big are uploaded in parts of
    ``multipart_chunk_bytes`` (S3 refuses parts under 5 MiB except the last), ``max_concurrency`` at once.
    """

    bucket: str
    prefix: str = "spotswarm"
    region: str | None = None
    endpoint_url: str | None = None
    multipart_threshold_bytes: int = 64 << 20
    multipart_chunk_bytes: int = 16 << 20
    max_concurrency: int = 4


def make_s3_client(config: S3StoreConfig) -> Any:
    """A boto3 S3 client for ``config`` using the default credential chain (instance profile on EC2)."""
    return boto3.client("s3", region_name=config.region, endpoint_url=config.endpoint_url)


class S3Store:
    """:class:`CheckpointStore` on S3. The client is passed in so tests can point it at a fake cloud."""

    name = "s3"

    def __init__(self, config: S3StoreConfig, client: Any | None = None) -> None:
        self.config = config
        self._client = client if client is not None else make_s3_client(config)
        self._transfer = TransferConfig(
            multipart_threshold=config.multipart_threshold_bytes,
            multipart_chunksize=config.multipart_chunk_bytes,
            max_concurrency=config.max_concurrency,
        )

    def object_key(self, key: str) -> str:
        """The S3 key of a store key: ``<prefix>/<key>``. Raises ValueError for a key that escapes."""
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"invalid checkpoint key {key!r}")
        return self._key_prefix + key

    @property
    def _key_prefix(self) -> str:
        prefix = self.config.prefix.strip("/")
        return f"{prefix}/" if prefix else ""

    def put_file(self, key: str, path: Path, sha256: str) -> None:
        """Upload ``path`` (multipart when large) with its checksum as metadata; visible only when whole."""
        self._client.upload_file(
            str(path),
            self.config.bucket,
            self.object_key(key),
            ExtraArgs={"Metadata": {SHA256_METADATA_KEY: sha256.lower()}},
            Config=self._transfer,
        )
        log.info(
            "stored checkpoint s3://%s/%s (%d bytes)",
            self.config.bucket,
            self.object_key(key),
            path.stat().st_size,
        )

    def open_stream(self, key: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """Yield the object's bytes, then check them against the recorded SHA-256.

        Raises CheckpointNotFound (or CheckpointCorrupt when no checksum was recorded) at once, before
        any byte is yielded; CheckpointCorrupt after the last chunk when the bytes do not match.
        """
        response = self._get(key)
        expected = _expected_sha256(response, key)
        return self._verified_chunks(key, response, expected, chunk_bytes)

    def _verified_chunks(
        self, key: str, response: dict[str, Any], expected: str, chunk_bytes: int
    ) -> Iterator[bytes]:
        expected_size = int(response["ContentLength"])
        digest = hashlib.sha256()
        received = 0
        body = response["Body"]
        try:
            for chunk in body.iter_chunks(chunk_size=chunk_bytes):
                digest.update(chunk)
                received += len(chunk)
                yield chunk
        finally:
            body.close()
        _verify(key, expected, digest.hexdigest(), expected_size, received)

    def download_file(self, key: str, dest: Path, chunk_bytes: int = 1 << 20) -> str:
        """Copy the object to ``dest`` only if its checksum matches; returns the SHA-256.

        Writes to a temporary file beside ``dest`` and renames it, so ``dest`` never holds bad bytes.
        Raises CheckpointNotFound or CheckpointCorrupt (``dest`` untouched).
        """
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
        tmp = Path(tmp_name)
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in self.open_stream(key, chunk_bytes):
                    digest.update(chunk)
                    out.write(chunk)
            tmp.replace(dest)
        finally:
            tmp.unlink(missing_ok=True)
        return digest.hexdigest()

    def sha256(self, key: str) -> str:
        """The checksum recorded at upload; raises CheckpointNotFound, CheckpointCorrupt (none recorded)."""
        return _expected_sha256(self._head(key), key)

    def size(self, key: str) -> int:
        """Size in bytes; raises CheckpointNotFound."""
        return int(self._head(key)["ContentLength"])

    def delete(self, key: str) -> None:
        """Remove the object (a delete marker on a versioned bucket); a no-op when absent."""
        self._client.delete_object(Bucket=self.config.bucket, Key=self.object_key(key))

    def list_keys(self, under: str = "") -> list[str]:
        """Store keys (without the prefix) that start with ``under``, sorted."""
        paginator = self._client.get_paginator("list_objects_v2")
        keys: list[str] = []
        for page in paginator.paginate(Bucket=self.config.bucket, Prefix=self._key_prefix + under):
            keys.extend(item["Key"] for item in page.get("Contents", []))
        return sorted(key[len(self._key_prefix) :] for key in keys)

    def stored_since(self, under: str) -> dict[str, datetime]:
        """Keys (without the prefix) that start with ``under`` and their ``LastModified`` times."""
        paginator = self._client.get_paginator("list_objects_v2")
        found: dict[str, datetime] = {}
        for page in paginator.paginate(Bucket=self.config.bucket, Prefix=self._key_prefix + under):
            for item in page.get("Contents", []):
                found[item["Key"][len(self._key_prefix) :]] = item["LastModified"].astimezone(UTC)
        return found

    def _get(self, key: str) -> dict[str, Any]:
        return self._object_call("get_object", key)

    def _head(self, key: str) -> dict[str, Any]:
        return self._object_call("head_object", key)

    def _object_call(self, operation: str, key: str) -> dict[str, Any]:
        """``get_object`` or ``head_object`` on ``key``; a missing object is :class:`CheckpointNotFound`."""
        try:
            response: dict[str, Any] = getattr(self._client, operation)(
                Bucket=self.config.bucket, Key=self.object_key(key)
            )
        except ClientError as exc:
            if _is_not_found(exc):
                raise CheckpointNotFound(key) from exc
            raise
        return response


def _is_not_found(exc: ClientError) -> bool:
    return str(exc.response.get("Error", {}).get("Code", "")) in _NOT_FOUND_CODES


def _expected_sha256(response: dict[str, Any], key: str) -> str:
    value = response.get("Metadata", {}).get(SHA256_METADATA_KEY)
    if not value:
        raise CheckpointCorrupt(f"{key}: no {SHA256_METADATA_KEY} metadata; not written by spotswarm")
    return str(value).lower()


def _verify(key: str, expected: str, actual: str, expected_size: int, received: int) -> None:
    if received != expected_size:
        raise CheckpointCorrupt(f"{key}: received {received} bytes, object has {expected_size}")
    if actual != expected:
        raise CheckpointCorrupt(f"{key}: sha256 {actual} does not match recorded {expected}")
