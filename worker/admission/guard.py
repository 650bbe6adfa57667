"""Guarding averaging: only peers with a valid swarm token of this run may call our averagers.

hivemind authorizes DHT calls (``DHT(authorizer=...)``), but its averagers (``rpc_join_group``,
``rpc_aggregate_part``, ``rpc_download_state``) accept calls from any peer that can reach them. What
they do know is the caller's peer id, which libp2p authenticates for every stream. So:

- every admitted peer serves its current token on the handler :data:`ADMISSION_HANDLER` (from its DHT
  process, where the authorizer renews it); a token is no secret, it is useless without the key;
- :class:`~worker.admission.authorizer.AdmissionDHT` (a ``hivemind.DHT`` with a
  :class:`~worker.admission.authorizer.SwarmAuthorizer`) hands averagers a :class:`GuardedP2P`, whose every
  registered handler first asks :class:`AdmissionGuard`: has the calling peer a token for this run, signed by
  the orchestrator, unexpired, *whose key is the caller's peer id*? The guard fetches the caller's token once
  and remembers the answer until the token expires (refusals for ``refusal_ttl_s``, so a stranger cannot make
  us call it back in a loop); expired answers are dropped, so new identities cannot grow that memory without
  bound.

A refused call fails on the caller's side with hivemind's ``P2PHandlerError``; it never reaches the
averager, so an unknown peer cannot join a group, send parts of an all-reduce or download the model.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from google.protobuf.message import DecodeError
from hivemind.p2p import P2P, P2PContext, P2PDaemonError, P2PHandlerError, PeerID
from hivemind.proto.auth_pb2 import AccessToken
from hivemind.utils.timed_storage import get_dht_time

from worker._hivemind_compat import quiet_refusal_tracebacks
from worker.admission.access_tokens import from_access_token
from worker.admission.tokens import TokenFields, TokenVerifier

logger = logging.getLogger(__name__)

ADMISSION_HANDLER = "spotswarm.SwarmAdmission.rpc_token"


class PeerNotAdmitted(PermissionError):
    """A peer called an averaging handler without a valid swarm token of this run."""


class AdmissionGuard:
    """Decides, per calling peer, whether it holds a valid token of this run (cached until expiry)."""

    def __init__(
        self,
        verifier: TokenVerifier,
        *,
        request_timeout_s: float = 5.0,
        refusal_ttl_s: float = 5.0,
        clock: Callable[[], float] = get_dht_time,
    ) -> None:
        self._verifier = verifier
        self._timeout_s = request_timeout_s
        self._refusal_ttl_s = refusal_ttl_s
        self._clock = clock
        self._admitted: dict[PeerID, float] = {}  # peer -> its token's expiry
        self._refused: dict[PeerID, tuple[float, str]] = {}  # peer -> (until, reason)
        self._checks: dict[PeerID, asyncio.Task[tuple[float | None, str]]] = {}
        self._next_prune_at = 0.0

    def remembered_peers(self) -> int:
        """How many callers' answers the guard holds (admitted and refused)."""
        return len(self._admitted) + len(self._refused)

    async def require(self, p2p: P2P, peer: PeerID) -> None:
        """Return if ``peer`` is admitted; raise :class:`PeerNotAdmitted` (with the reason) otherwise."""
        now = self._clock()
        if self._admitted.get(peer, 0.0) > now:
            return
        refused = self._refused.get(peer)
        if refused is not None and refused[0] > now:
            raise PeerNotAdmitted(f"peer {peer} is not admitted to this swarm: {refused[1]}")
        task = self._checks.get(peer)
        if task is None:
            task = asyncio.create_task(self._check(p2p, peer))
            self._checks[peer] = task
            task.add_done_callback(lambda _: self._checks.pop(peer, None))
        expires_at, reason = await asyncio.shield(task)
        if expires_at is not None:
            return
        raise PeerNotAdmitted(f"peer {peer} is not admitted to this swarm: {reason}")

    def _forget_expired(self, now: float) -> None:
        """Drop answers that no longer count (at most once per ``refusal_ttl_s``), so the guard holds the
        callers of about one token lifetime, not every identity that ever called."""
        if now < self._next_prune_at:
            return
        self._next_prune_at = now + self._refusal_ttl_s
        self._admitted = {peer: until for peer, until in self._admitted.items() if until > now}
        self._refused = {peer: refusal for peer, refusal in self._refused.items() if refusal[0] > now}

    async def _check(self, p2p: P2P, peer: PeerID) -> tuple[float | None, str]:
        started = time.monotonic()
        self._forget_expired(self._clock())
        fields, reason = await self._fetch_token(p2p, peer)
        if fields is not None:
            reason = self._verifier.problem_for_peer(fields, peer.to_base58()) or ""
        if fields is not None and not reason:
            expires_at = fields.expires_at()
            self._admitted[peer] = expires_at
            self._refused.pop(peer, None)
            elapsed_ms = (time.monotonic() - started) * 1000
            until = fields.expiration_time
            logger.debug("peer %s admitted until %s (checked in %.0f ms)", peer, until, elapsed_ms)
            return expires_at, ""
        self._refused[peer] = (self._clock() + self._refusal_ttl_s, reason)
        logger.warning("refusing averaging requests of peer %s: %s", peer, reason)
        return None, reason

    async def _fetch_token(self, p2p: P2P, peer: PeerID) -> tuple[TokenFields | None, str]:
        """The token ``peer`` serves, or None and why not."""
        try:
            async with asyncio.timeout(self._timeout_s):
                token = await p2p.call_protobuf_handler(peer, ADMISSION_HANDLER, AccessToken(), AccessToken)
        except (TimeoutError, P2PHandlerError, P2PDaemonError, OSError, EOFError, DecodeError) as exc:
            return None, f"it showed no token ({type(exc).__name__})"
        return from_access_token(token), ""

    def wrap(self, p2p: P2P, handler: Callable[..., Any], stream_output: bool) -> Callable[..., Any]:
        """``handler`` behind the admission check (same calling convention as hivemind handlers)."""
        if stream_output:

            async def guarded_stream(request: Any, context: P2PContext) -> AsyncIterator[Any]:
                await self.require(p2p, context.remote_id)
                async for item in handler(request, context):
                    yield item

            return functools.wraps(handler)(guarded_stream)

        async def guarded(request: Any, context: P2PContext) -> Any:
            await self.require(p2p, context.remote_id)
            return await handler(request, context)

        return functools.wraps(handler)(guarded)


class GuardedP2P(P2P):
    """A hivemind P2P replica whose handlers all pass :class:`AdmissionGuard` first (when one is set)."""

    admission_guard: AdmissionGuard | None = None

    async def add_protobuf_handler(  # type: ignore[override]
        self,
        name: str,
        handler: Callable[..., Any],
        input_protobuf_type: Any,
        *,
        stream_input: bool = False,
        stream_output: bool = False,
        balanced: bool = False,
    ) -> None:
        if self.admission_guard is not None:
            handler = self.admission_guard.wrap(self, handler, stream_output)
        await super().add_protobuf_handler(
            name,
            handler,
            input_protobuf_type,
            stream_input=stream_input,
            stream_output=stream_output,
            balanced=balanced,
        )


quiet_refusal_tracebacks(PeerNotAdmitted)  # refused peers are logged once, by the guard
