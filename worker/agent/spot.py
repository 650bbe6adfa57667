"""Spot interruption watcher: polls the EC2 instance metadata service (IMDSv2) in a thread.

EC2 announces a spot interruption about two minutes ahead at ``/latest/meta-data/spot/instance-action``
(``{"action": "terminate", "time": "..."}``; 404 while none is planned) and, often earlier, a rebalance
recommendation at ``/latest/meta-data/events/recommendations/rebalance`` (``{"noticeTime": "..."}``).
Every read carries a session token from ``PUT /latest/api/token``; a token that expired or was refused
(401) is replaced and the read tried once more.

The metadata base URL comes from ``SPOTSWARM_METADATA_URL`` (default ``http://169.254.169.254``;
``off`` disables the watcher). Off EC2 nothing answers there: after a few unreachable polls, with no
answer ever, the watcher stops by itself. Standard library only: a worker image carries no server code.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from worker.protocol.imds import (
    DEFAULT_METADATA_URL,
    INSTANCE_ACTION_PATH,
    METADATA_URL_ENV,
    REBALANCE_PATH,
    TOKEN_HEADER,
    TOKEN_PATH,
    TOKEN_TTL_HEADER,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpotNotice:
    """A notice from EC2. ``kind``: ``interruption`` or ``rebalance``; ``time``: as EC2 wrote it (UTC)."""

    kind: str
    action: str  # terminate | stop | hibernate for an interruption; "rebalance" for a recommendation
    time: str


class MetadataUnreachable(OSError):
    """Nothing answered at the metadata URL (not on EC2, or IMDS disabled / hop limit too low)."""


class MetadataClient:
    """A tiny IMDSv2 client: session token handling and GETs that return ``None`` on 404."""

    def __init__(
        self,
        base_url: str = DEFAULT_METADATA_URL,
        token_ttl_s: int = 21600,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token_ttl_s = token_ttl_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._token: str | None = None
        self._token_expires_at = 0.0
        # Never through an HTTP proxy from the environment: the metadata service is link-local.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(self, path: str) -> str | None:
        """The body at ``path``, or None on 404. Raises MetadataUnreachable, urllib.error.HTTPError."""
        try:
            return self._get_with_token(path, self._current_token())
        except urllib.error.HTTPError as exc:
            if exc.code != 401:
                raise
        log.info("instance metadata token refused or expired; getting a new one")
        self._token = None
        return self._get_with_token(path, self._current_token())

    def _get_with_token(self, path: str, token: str) -> str | None:
        request = urllib.request.Request(self.base_url + path, headers={TOKEN_HEADER: token})
        try:
            return self._send(request)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def _current_token(self) -> str:
        # Renew a little before EC2 would refuse it, so a poll never races the expiry.
        if self._token is None or self._clock() >= self._token_expires_at:
            request = urllib.request.Request(
                self.base_url + TOKEN_PATH, method="PUT", headers={TOKEN_TTL_HEADER: str(self.token_ttl_s)}
            )
            started = self._clock()
            self._token = self._send(request)
            self._token_expires_at = started + self.token_ttl_s * 0.9
        return self._token

    def _send(self, request: urllib.request.Request) -> str:
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                return str(response.read().decode("utf-8", errors="replace"))
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, OSError) as exc:  # refused, timed out, no route
            raise MetadataUnreachable(f"{request.full_url}: {exc}") from exc


class SpotWatcher:
    """Polls for spot notices in a daemon thread and calls back once per kind.

    ``on_notice`` gets the interruption notice once, after which the watcher stops (nothing more can
    happen). ``on_rebalance``, if given, gets the first rebalance recommendation; watching goes on.
    Exceptions from callbacks are logged with their traceback, not raised into the thread.
    """

    def __init__(
        self,
        on_notice: Callable[[SpotNotice], None],
        metadata_url: str = DEFAULT_METADATA_URL,
        poll_interval_s: float = 5.0,
        on_rebalance: Callable[[SpotNotice], None] | None = None,
        token_ttl_s: int = 21600,
        timeout_s: float = 2.0,
        unreachable_polls_before_giving_up: int = 3,
    ) -> None:
        self.client = MetadataClient(metadata_url, token_ttl_s=token_ttl_s, timeout_s=timeout_s)
        self.poll_interval_s = poll_interval_s
        self._on_notice = on_notice
        self._on_rebalance = on_rebalance
        self._give_up_after = unreachable_polls_before_giving_up
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ever_answered = False
        self._unreachable = 0
        self.interruption: SpotNotice | None = None
        self.rebalance: SpotNotice | None = None

    @classmethod
    def from_env(cls, on_notice: Callable[[SpotNotice], None], **kwargs: object) -> SpotWatcher | None:
        """A watcher for ``$SPOTSWARM_METADATA_URL`` (default EC2's), or None when it is ``off``."""
        url = os.environ.get(METADATA_URL_ENV, DEFAULT_METADATA_URL).strip()
        if url.lower() in {"off", "none", ""}:
            return None
        return cls(on_notice, metadata_url=url, **kwargs)  # type: ignore[arg-type]

    def start(self) -> None:
        """Start polling in a daemon thread (first poll at once)."""
        self._thread = threading.Thread(target=self._run, name="spot-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop polling and wait for the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.poll_once():
                return
            self._stop.wait(self.poll_interval_s)

    def poll_once(self) -> bool:
        """One look at both notices; returns False when watching should end."""
        try:
            if self._on_rebalance is not None and self.rebalance is None:
                body = self.client.get(REBALANCE_PATH)
                if body is not None:
                    self.rebalance = _parse_rebalance(body)
                    self._call(self._on_rebalance, self.rebalance)
            body = self.client.get(INSTANCE_ACTION_PATH)
        except MetadataUnreachable as exc:
            return self._note_unreachable(exc)
        except urllib.error.HTTPError as exc:
            log.warning(
                "instance metadata answered %s; trying again in %.0f s", exc.code, self.poll_interval_s
            )
            return True
        self._ever_answered = True
        self._unreachable = 0
        if body is None:
            return True
        self.interruption = _parse_instance_action(body)
        log.warning("spot interruption notice: %s at %s", self.interruption.action, self.interruption.time)
        self._call(self._on_notice, self.interruption)
        return False

    def _note_unreachable(self, exc: MetadataUnreachable) -> bool:
        self._unreachable += 1
        if not self._ever_answered and self._unreachable >= self._give_up_after:
            log.info("no instance metadata service at %s; spot watcher off", self.client.base_url)
            return False
        if self._unreachable == 1 or self._unreachable % 60 == 0:
            log.warning("instance metadata unreachable (%d in a row): %s", self._unreachable, exc)
        return True

    @staticmethod
    def _call(callback: Callable[[SpotNotice], None], notice: SpotNotice) -> None:
        try:
            callback(notice)
        except Exception:  # a callback's bug must not kill the watcher silently: log it in full
            log.exception("spot notice callback failed for %s", notice)


def _parse_instance_action(body: str) -> SpotNotice:
    try:
        data = json.loads(body)
        return SpotNotice("interruption", str(data.get("action", "unknown")), str(data.get("time", "")))
    except (ValueError, AttributeError):
        log.warning("unreadable instance-action notice %r; treating it as an interruption", body[:200])
        return SpotNotice("interruption", "unknown", "")


def _parse_rebalance(body: str) -> SpotNotice:
    try:
        return SpotNotice("rebalance", "rebalance", str(json.loads(body).get("noticeTime", "")))
    except (ValueError, AttributeError):
        return SpotNotice("rebalance", "rebalance", "")
