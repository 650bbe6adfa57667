"""The CLI's HTTP client of the orchestrator's admin API (``/api/v1``), and where its URL and token come from.

The CLI is a client like any other: it never starts or calls the server's parts, only imports names and
pure rules (:mod:`orchestrator.schemas`, :mod:`worker.protocol`, :mod:`orchestrator.domain.states`). Every
failure becomes a :class:`CliError` carrying a one-line message and the process exit code (see ``EXIT_*``);
the command layer prints it and exits.

Connection settings, first found wins: ``--url``/``--token``/``--ca-cert`` flags,
``SPOTSWARM_URL``/``SPOTSWARM_TOKEN``/``SPOTSWARM_CA_CERT`` environment variables, then the TOML config
file (``$SPOTSWARM_CONFIG``, else ``$XDG_CONFIG_HOME/spotswarm/config.toml``, else
``~/.config/spotswarm/config.toml``) with keys ``url``, ``token`` and ``ca_cert``. ``ca_cert`` is a PEM
file of certificates to trust for ``https://`` URLs instead of the usual authorities (an orchestrator
with a self-signed certificate).
"""

from __future__ import annotations

import hashlib
import os
import ssl
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from worker.protocol.errors import error_detail
from worker.protocol.paths import API_PREFIX, CHECKSUM_HEADER, ApiPath

DEFAULT_URL = "http://127.0.0.1:8000"
CHUNK_BYTES = 1 << 20
CREATE_WITH_CODE_TIMEOUT_S = 1200.0  # the orchestrator's install_timeout_s (900) and import check (60)

EXIT_ERROR = 1  # the server refused the request (4xx other than below, 5xx), or a local failure
EXIT_USAGE = 2  # bad flags or arguments (click's own code)
EXIT_UNREACHABLE = 3  # no answer: connection refused, DNS, time-out
EXIT_AUTH = 4  # 401/403: missing or wrong token
EXIT_NOT_FOUND = 5  # 404: no such run, worker or checkpoint
EXIT_CONFLICT = 6  # 409: valid, but clashes with the run's state (e.g. resume a running run)

_STATUS_EXIT_CODES = {401: EXIT_AUTH, 403: EXIT_AUTH, 404: EXIT_NOT_FOUND, 409: EXIT_CONFLICT}


class CliError(Exception):
    """A failure to show as one line; ``exit_code`` is the process exit status."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(" ".join(message.split()))  # one line, whatever the server sent
        self.exit_code = exit_code


@dataclass(frozen=True)
class Connection:
    """Where the orchestrator is and the admin token to send (None: read-only calls only)."""

    url: str
    token: str | None
    timeout_s: float = 10.0
    ca_cert: str | None = None  # PEM file of the certificates to trust (None: the usual authorities)


def config_path() -> Path:
    """The config file the CLI reads (it may not exist)."""
    explicit = os.environ.get("SPOTSWARM_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "spotswarm" / "config.toml"


def _read_config(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # TOMLDecodeError is a ValueError
        raise CliError(f"cannot read config file {path}: {exc}") from exc
    for key in ("url", "token", "ca_cert"):
        if key in data and not isinstance(data[key], str):
            raise CliError(f"config file {path}: '{key}' must be a string")
    return data


def resolve_connection(
    url: str | None, token: str | None, timeout_s: float = 10.0, ca_cert: str | None = None
) -> Connection:
    """Combine flags, environment and config file (first found wins); raises :class:`CliError`."""
    config = _read_config(config_path())
    final_url = url or os.environ.get("SPOTSWARM_URL") or config.get("url") or DEFAULT_URL
    final_token = token or os.environ.get("SPOTSWARM_TOKEN") or config.get("token") or None
    final_ca = ca_cert or os.environ.get("SPOTSWARM_CA_CERT") or config.get("ca_cert") or None
    if not final_url.startswith(("http://", "https://")):
        raise CliError(f"orchestrator URL {final_url!r} must start with http:// or https://", EXIT_USAGE)
    if final_ca is not None:
        final_ca = str(Path(final_ca).expanduser())
        if not Path(final_ca).is_file():
            raise CliError(f"CA certificate file {final_ca} does not exist", EXIT_USAGE)
    return Connection(final_url.rstrip("/"), final_token, timeout_s, final_ca)


def _tls_verification(ca_cert: str | None) -> ssl.SSLContext | bool:
    """What httpx checks server certificates against: ``ca_cert`` alone, or the usual authorities."""
    if ca_cert is None:
        return True
    try:
        return ssl.create_default_context(cafile=ca_cert)
    except (ssl.SSLError, OSError) as exc:
        raise CliError(f"cannot use {ca_cert} as CA certificate: {exc}", EXIT_USAGE) from exc


class ApiClient:
    """Admin-side calls of the orchestrator API; each raises :class:`CliError` on any failure."""

    def __init__(self, connection: Connection, transport: httpx.BaseTransport | None = None) -> None:
        self.connection = connection
        headers = {"Authorization": f"Bearer {connection.token}"} if connection.token else {}
        self._http = httpx.Client(
            base_url=connection.url + API_PREFIX,
            headers=headers,
            timeout=connection.timeout_s,
            transport=transport,
            verify=_tls_verification(connection.ca_cert),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs ------------------------------------------------------------------------------------

    def list_runs(self, limit: int = 100, offset: int = 0) -> dict[str, Any]:
        return self._json("GET", ApiPath.runs, params={"limit": limit, "offset": offset})

    def get_run(self, name: str) -> dict[str, Any]:
        return self._json("GET", ApiPath.run.format(name=name))

    def create_run(self, spec: dict[str, Any]) -> dict[str, Any]:
        """POST the spec. With requirements, the orchestrator installs them for its import check first:
        the answer may take minutes, so the wait is at least :data:`CREATE_WITH_CODE_TIMEOUT_S`."""
        timeout_s = self.connection.timeout_s
        if spec.get("requirements") or spec.get("workdir"):
            timeout_s = max(timeout_s, CREATE_WITH_CODE_TIMEOUT_S)
        return self._json("POST", ApiPath.runs, json=spec, timeout=timeout_s)

    def ensure_package(self, archive: Path, sha256: str) -> bool:
        """Upload the code package at ``archive`` unless the orchestrator stores it already; True if
        it was uploaded now."""
        try:
            self._json("GET", ApiPath.package.format(sha256=sha256))
            return False
        except CliError as exc:
            if exc.exit_code != EXIT_NOT_FOUND:
                raise
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(archive.stat().st_size)}
        with archive.open("rb") as handle:
            chunks = iter(lambda: handle.read(CHUNK_BYTES), b"")
            self._json("PUT", ApiPath.package.format(sha256=sha256), content=chunks, headers=headers)
        return True

    def scale_run(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._json("POST", ApiPath.run_scale.format(name=name), json=body)

    def stop_run(self, name: str, reason: str | None = None) -> dict[str, Any]:
        return self._json(
            "POST", ApiPath.run_stop.format(name=name), json={"reason": reason} if reason else {}
        )

    def resume_run(self, name: str, stop: dict[str, Any] | None = None) -> dict[str, Any]:
        body = {"stop": stop} if stop is not None else None
        return self._json("POST", ApiPath.run_resume.format(name=name), json=body)

    def rotate_join_token(self, name: str) -> dict[str, Any]:
        return self._json("POST", ApiPath.run_join_token.format(name=name))

    def revoke_manual_workers(self, name: str) -> dict[str, Any]:
        """End every worker of the run joined by hand; their ids (``revoked``)."""
        return self._json("POST", ApiPath.run_revoke_manual.format(name=name))

    def events(self, name: str, after_id: int = 0, limit: int = 500) -> dict[str, Any]:
        return self._json(
            "GET", ApiPath.run_events.format(name=name), params={"after_id": after_id, "limit": limit}
        )

    def progress(self, name: str, max_points: int = 200) -> dict[str, Any]:
        return self._json("GET", ApiPath.run_progress.format(name=name), params={"max_points": max_points})

    def delete_run(self, name: str) -> None:
        """Delete a finished run with its workers, events and checkpoints (409 while it is active)."""
        self._request("DELETE", ApiPath.run.format(name=name))

    def worker_log(
        self, name: str, worker_id: str, tail_bytes: int, from_offset: int | None = None
    ) -> dict[str, Any]:
        """The last ``tail_bytes`` (at most) of a worker's log, as the orchestrator keeps it; with
        ``from_offset``, at most that many bytes from there on (what was written since)."""
        path = ApiPath.run_worker_log.format(name=name, worker_id=worker_id)
        params: dict[str, int] = {"tail_bytes": tail_bytes}
        if from_offset is not None:
            params["from_offset"] = from_offset
        return self._json("GET", path, params=params)

    # -- workers, checkpoints, peers -------------------------------------------------------------

    def workers(self, name: str, limit: int = 500) -> dict[str, Any]:
        return self._json("GET", ApiPath.run_workers.format(name=name), params={"limit": limit})

    def checkpoints(self, name: str) -> dict[str, Any]:
        return self._json("GET", ApiPath.run_checkpoints.format(name=name))

    def delete_checkpoints(
        self, name: str, epoch: int | None = None, uploaded_by: int | None = None
    ) -> dict[str, Any]:
        """Delete the run's checkpoint of ``epoch``, or every one worker ``uploaded_by`` uploaded; the
        deleted ones (``items``)."""
        if epoch is not None:
            return self._json("DELETE", ApiPath.run_checkpoint_item.format(name=name, epoch=epoch))
        return self._json(
            "DELETE", ApiPath.run_checkpoints.format(name=name), params={"uploaded_by": uploaded_by}
        )

    def peers(self, name: str | None = None) -> dict[str, Any]:
        """A run's initial peers, or the orchestrator's own DHT addresses when ``name`` is None."""
        return self._json("GET", ApiPath.run_peers.format(name=name) if name else ApiPath.peers)

    def download(self, download_path: str, dest: Path, on_bytes: Callable[[int, int | None], None]) -> str:
        """Stream ``download_path`` (an API path) to ``dest`` atomically and return its SHA-256.

        ``on_bytes(received, total)`` is called per chunk. The bytes are checked against the server's
        ``X-Checksum-Sha256`` header when it sends one; a mismatch leaves no file and raises.
        """
        path = download_path.removeprefix(API_PREFIX)
        partial = dest.with_name(f".{dest.name}.part")
        try:
            with self._stream("GET", path) as response:
                length = response.headers.get("Content-Length")
                total = int(length) if length else None
                expected = response.headers.get(CHECKSUM_HEADER)
                digest = hashlib.sha256()
                received = 0
                with partial.open("wb") as handle:
                    for chunk in response.iter_bytes(CHUNK_BYTES):
                        digest.update(chunk)
                        handle.write(chunk)
                        received += len(chunk)
                        on_bytes(received, total)
        except OSError as exc:
            partial.unlink(missing_ok=True)
            raise CliError(f"cannot write {dest}: {exc.strerror or exc}") from exc
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        actual = digest.hexdigest()
        if expected and expected.lower() != actual:
            partial.unlink(missing_ok=True)
            raise CliError(f"download of {path} is corrupt: sha256 {actual}, server said {expected}")
        os.replace(partial, dest)
        return actual

    # -- plumbing --------------------------------------------------------------------------------

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._request(method, path, **kwargs)
        if not response.content:
            return {}
        try:
            body = response.json()
        except ValueError as exc:
            raise CliError(
                f"{method} {path}: the server sent no JSON (is {self.connection.url} "
                "a spotswarm orchestrator?)"
            ) from exc
        return body if isinstance(body, dict) else {"items": body}

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
        self._check(response)
        return response

    @contextmanager
    def _stream(self, method: str, path: str) -> Iterator[httpx.Response]:
        try:
            with self._http.stream(method, path) as response:
                if response.status_code >= 400:
                    response.read()
                self._check(response)
                yield response
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: httpx.TransportError) -> CliError:
        kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "unreachable"
        reason = str(exc) or type(exc).__name__
        if "CERTIFICATE_VERIFY_FAILED" in reason:
            hint = "pass its certificate with --ca-cert (or SPOTSWARM_CA_CERT)"
            problem = f"its TLS certificate is not trusted ({reason})"
            return CliError(f"orchestrator at {self.connection.url}: {problem}; {hint}", EXIT_UNREACHABLE)
        return CliError(f"orchestrator at {self.connection.url} {kind}: {reason}", EXIT_UNREACHABLE)

    def _check(self, response: httpx.Response) -> None:
        status = response.status_code
        if status < 400:
            return
        detail = error_detail(response)
        if status in (401, 403) and not self.connection.token:
            detail += " (no token given: pass --token, set SPOTSWARM_TOKEN or 'token' in the config file)"
        raise CliError(f"{status} {detail}", _STATUS_EXIT_CODES.get(status, EXIT_ERROR))
