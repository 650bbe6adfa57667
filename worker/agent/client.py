"""The worker's small HTTP client of the orchestrator API (paths and models from :mod:`worker.protocol`).

Transient failures (connection errors, time-outs, HTTP 5xx, and 429 no sooner than its ``Retry-After``)
are retried with exponential backoff and surface as :class:`Unreachable` once the retries are spent.
Any other 4xx answer is never retried: it raises the matching :class:`ApiError` subclass at once, with
the server's ``detail`` as message.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from worker.protocol.errors import error_detail
from worker.protocol.paths import API_PREFIX, CHECKSUM_HEADER, ApiPath
from worker.protocol.swarm_tokens import SwarmAuthInfo, SwarmToken, SwarmTokenRequest
from worker.protocol.validators import without_control_characters
from worker.protocol.workers import (
    Deregister,
    DeregisterReason,
    Heartbeat,
    HeartbeatReply,
    PeerList,
    ResumeFailure,
    WorkerRegister,
    WorkerRegistered,
)

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
#: the most of a server's error text a worker puts in an exception (and so in its log)
MAX_MESSAGE_CHARS = 500


class ApiError(Exception):
    """A request the orchestrator did not fulfil; ``status_code`` is None when no answer came."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class Unauthorized(ApiError):
    """401/403: the token is missing, wrong, or does not grant this call (e.g. a bad join token)."""


class NotFound(ApiError):
    """404: the run, worker or checkpoint does not exist."""


class Conflict(ApiError):
    """409: valid, but clashes with the current state (e.g. the run no longer accepts workers)."""


class Rejected(ApiError):
    """Any other 4xx: the request itself is wrong (validation error, body too large, bad checksum)."""


class Unreachable(ApiError):
    """No usable answer after the retries: connection refused, time-outs, HTTP 5xx or 429."""


class ChecksumMismatch(ApiError):
    """Downloaded bytes do not hash to the expected SHA-256 (the partial file was removed)."""


_STATUS_ERRORS: dict[int, type[ApiError]] = {
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    409: Conflict,
}


def sha256_of_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        yield from iter(lambda: handle.read(CHUNK_BYTES), b"")


class OrchestratorClient:
    """Calls the orchestrator at ``base_url`` (e.g. ``http://10.0.0.5:8000``).

    ``token`` is the bearer token of worker calls (set it to the worker token after registering).
    ``retries`` is how many times a transient failure is retried; waits grow from ``backoff_s`` to
    ``max_backoff_s`` with jitter. ``sleep`` is injectable so tests can run on a short timescale.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout_s: float = 10.0,
        retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.retries = retries
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._sleep = sleep
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OrchestratorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- endpoints -------------------------------------------------------------------------------

    def register(self, join_token: str, body: WorkerRegister) -> WorkerRegistered:
        """Join a run with its join token; raises :class:`Unauthorized` for a bad token."""
        response = self._call("POST", ApiPath.register, token=join_token, json=body.model_dump())
        return WorkerRegistered.model_validate(response.json())

    def heartbeat(self, worker_id: str, body: Heartbeat) -> HeartbeatReply:
        """Report progress; the reply says whether to go on and whether this worker checkpoints."""
        path = ApiPath.heartbeat.format(worker_id=worker_id)
        response = self._call("POST", path, json=body.model_dump(mode="json"))
        return HeartbeatReply.model_validate(response.json())

    def deregister(
        self,
        worker_id: str,
        reason: DeregisterReason,
        message: str | None = None,
        unusable_spec: bool = False,
        metrics: dict[str, float] | None = None,
    ) -> None:
        """Leave the run for ``reason``; ``message`` (made one line, at most 4000 chars) says why,
        ``unusable_spec`` that no worker could use the run's spec, ``metrics`` are the worker's last
        reported values (see :class:`Deregister`).

        Fields left at their defaults are not sent.
        """
        text = without_control_characters(message)[:4000] if message else None
        body = Deregister(
            reason=reason, message=text or None, unusable_spec=unusable_spec, metrics=metrics or {}
        )
        path = ApiPath.deregister.format(worker_id=worker_id)
        self._call("POST", path, json=body.model_dump(mode="json", exclude_defaults=True))

    def report_resume_failure(self, worker_id: str, epoch: int, message: str) -> None:
        """Tell the orchestrator that the run's checkpoint of ``epoch`` did not load here, and why."""
        body = ResumeFailure(epoch=epoch, message=without_control_characters(message)[:1000] or "no reason")
        path = ApiPath.resume_failure.format(worker_id=worker_id)
        self._call("POST", path, json=body.model_dump(mode="json"))

    def run_peers(self, run_name: str) -> PeerList:
        """The run's current initial peers (no token needed)."""
        return PeerList.model_validate(self._call("GET", ApiPath.run_peers.format(name=run_name)).json())

    def swarm_auth_info(self) -> SwarmAuthInfo:
        """Whether the orchestrator admits swarm peers by token, and its signing key (no token needed)."""
        return SwarmAuthInfo.model_validate(self._call("GET", ApiPath.swarm_auth).json())

    def swarm_token(self, worker_id: str, public_key: str) -> SwarmToken:
        """A signed swarm token for this worker's peer key (``public_key``, OpenSSH); see
        ``worker/admission/authorizer.py``. :class:`Conflict` when the run or the orchestrator uses no
        tokens."""
        body = SwarmTokenRequest(public_key=public_key)
        response = self._call("POST", ApiPath.swarm_token.format(worker_id=worker_id), json=body.model_dump())
        return SwarmToken.model_validate(response.json())

    def upload_checkpoint(self, worker_id: str, epoch: int, path: Path) -> dict[str, Any]:
        """Stream the file at ``path`` as the run's checkpoint of swarm epoch ``epoch``.

        The SHA-256 is computed first and sent as ``X-Checksum-Sha256``; the server rejects (4xx ->
        :class:`Rejected`) bytes that do not match. Returns the server's JSON answer ({} if none).
        """
        checksum = sha256_of_file(path)
        headers = {
            CHECKSUM_HEADER: checksum,
            "Content-Length": str(path.stat().st_size),
            "Content-Type": "application/octet-stream",
        }
        response = self._call(
            "PUT",
            ApiPath.checkpoint_upload.format(worker_id=worker_id, epoch=epoch),
            headers=headers,
            content_factory=lambda: _file_chunks(path),
        )
        return response.json() if response.content else {}

    def download_package(self, run_name: str, dest: Path, sha256: str) -> Path:
        """Download the run's code package to ``dest`` (atomically); its SHA-256 must be ``sha256``."""
        return self.download_checkpoint(ApiPath.run_package.format(name=run_name), dest, sha256)

    def download_checkpoint(self, download_path: str, dest: Path, sha256: str | None = None) -> Path:
        """Download a checkpoint (or any file of the API) to ``dest`` (atomically) and verify it.

        ``download_path`` is an API path such as ``/runs/<name>/checkpoints/latest/download`` (with or
        without :data:`~worker.protocol.paths.API_PREFIX`). The expected SHA-256 is ``sha256`` or else the
        response's ``X-Checksum-Sha256``; a mismatch raises :class:`ChecksumMismatch` and leaves no file
        behind.
        """
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(f".{dest.name}.{os.getpid()}.part")
        for attempt in range(self.retries + 1):
            try:
                with self._http.stream("GET", self._url(download_path), headers=self._auth()) as response:
                    self._raise_for_status(response, read=True)
                    expected = sha256 or response.headers.get(CHECKSUM_HEADER)
                    actual = self._save(response, partial)
                break
            except (httpx.TransportError, _Transient) as exc:
                partial.unlink(missing_ok=True)
                self._wait_or_give_up(attempt, "GET", download_path, exc)
        if expected and actual != expected.lower():
            partial.unlink(missing_ok=True)
            raise ChecksumMismatch(f"download {download_path}: sha256 {actual}, expected {expected}")
        os.replace(partial, dest)
        return dest

    # -- plumbing --------------------------------------------------------------------------------

    @staticmethod
    def _save(response: httpx.Response, path: Path) -> str:
        digest = hashlib.sha256()
        with path.open("wb") as handle:
            for chunk in response.iter_bytes(CHUNK_BYTES):
                digest.update(chunk)
                handle.write(chunk)
        return digest.hexdigest()

    def _url(self, path: str) -> str:
        return path if path.startswith(API_PREFIX + "/") else API_PREFIX + path

    def _auth(self, token: str | None = None) -> dict[str, str]:
        token = token or self.token
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _call(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        headers: dict[str, str] | None = None,
        json: Any = None,
        content_factory: Callable[[], Iterator[bytes]] | None = None,
    ) -> httpx.Response:
        """One API call with retries of transient failures; raises an :class:`ApiError` subclass."""
        all_headers = {**self._auth(token), **(headers or {})}
        for attempt in range(self.retries + 1):
            content = content_factory() if content_factory else None
            try:
                response = self._http.request(
                    method, self._url(path), headers=all_headers, json=json, content=content
                )
                self._raise_for_status(response)
                return response
            except (httpx.TransportError, _Transient) as exc:
                self._wait_or_give_up(attempt, method, path, exc)
        raise AssertionError("unreachable: the loop returns or raises")

    def _raise_for_status(self, response: httpx.Response, read: bool = False) -> None:
        if response.status_code < 400:
            return
        if read:
            response.read()
        if response.status_code >= 500 or response.status_code == 429:  # 429: a rate limit, retried later
            raise _Transient(
                response.status_code, error_detail(response, MAX_MESSAGE_CHARS), _retry_after_s(response)
            )
        error = _STATUS_ERRORS.get(response.status_code, Rejected)
        raise error(
            f"{response.status_code}: {error_detail(response, MAX_MESSAGE_CHARS)}", response.status_code
        )

    def _wait_or_give_up(self, attempt: int, method: str, path: str, exc: Exception) -> None:
        status = exc.status_code if isinstance(exc, _Transient) else None
        if attempt >= self.retries:
            raise Unreachable(f"{method} {self.base_url}{self._url(path)} failed: {exc}", status) from exc
        delay_s = min(self._max_backoff_s, self._backoff_s * 2**attempt) * random.uniform(0.8, 1.2)
        if isinstance(exc, _Transient):
            delay_s = max(delay_s, exc.retry_after_s)
        logger.warning(
            "%s %s failed (%s); retry %d/%d in %.1f s", method, path, exc, attempt + 1, self.retries, delay_s
        )
        self._sleep(delay_s)


class _Transient(Exception):
    """An HTTP 5xx or 429 answer: worth another try (not before ``retry_after_s``)."""

    def __init__(self, status_code: int, detail: str, retry_after_s: float = 0.0) -> None:
        super().__init__(f"HTTP {status_code}: {detail}")
        self.status_code = status_code
        self.retry_after_s = retry_after_s


def _retry_after_s(response: httpx.Response) -> float:
    """The ``Retry-After`` header in seconds (0 when absent or not a number of seconds)."""
    try:
        return max(0.0, float(response.headers.get("Retry-After", "0")))
    except ValueError:
        return 0.0
