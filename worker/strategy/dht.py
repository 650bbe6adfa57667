"""Joining a hivemind swarm: where the initial peers come from, starting the DHT, what to tell others.

``HivemindStrategy`` uses these in ``setup``; the worker agent can use them to print or report the
addresses of its peer. Nothing here talks to Lightning.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import hivemind

from worker._hivemind_compat import (
    p2pd_in_own_session,
    quiet_dead_sender_errors,
    survive_unreadable_requests,
)
from worker.protocol.peer_addresses import usable_initial_peers
from worker.runtime.lifeline import exit_with_parent

log = logging.getLogger(__name__)

#: Environment variables read for initial peers, first non-empty one wins. ``PL_INITIAL_PEERS`` is
#: what lightning-hivemind read; it is kept so that existing launch scripts keep working.
INITIAL_PEERS_ENV_VARS: tuple[str, ...] = ("INITIAL_PEERS", "PL_INITIAL_PEERS")
DHT_SHUTDOWN_TIMEOUT_S = 10.0


def parse_initial_peers(
    initial_peers: str | Sequence[str] | None, environ: Mapping[str, str] | None = None
) -> list[str]:
    """The multiaddrs to join: from ``initial_peers`` if given, else from the environment.

    ``initial_peers`` may be a list of multiaddrs or one comma-separated string; blanks are dropped.
    An empty result means "start a new swarm". Raises ``TypeError`` for anything else.
    """
    if initial_peers is None:
        env = os.environ if environ is None else environ
        initial_peers = next((env[name] for name in INITIAL_PEERS_ENV_VARS if env.get(name, "").strip()), "")
    if isinstance(initial_peers, str):
        items: Sequence[object] = initial_peers.split(",")
    elif isinstance(initial_peers, Sequence):
        items = initial_peers
    else:
        raise TypeError(f"initial_peers must be a list or a comma-separated string, got {initial_peers!r}")
    return [str(item).strip() for item in items if str(item).strip()]


class PeerAuthorizer(Protocol):
    """This peer's pass into a swarm with admission, as the strategy sees it: something that starts the
    DHT peer that signs its calls and guards its averaging (``worker.admission.authorizer.SwarmAuthorizer``
    is one). Declared here so that the strategy imports nothing of ``worker.admission``, which builds on
    this module."""

    def start_dht(self, initial_peers: list[str], **dht_kwargs: Any) -> hivemind.DHT:
        """Start the DHT with these keywords of ``hivemind.DHT`` and wait until it is ready."""
        ...


def start_dht(
    *,
    initial_peers: Sequence[str],
    host_maddrs: Sequence[str] | None = None,
    announce_maddrs: Sequence[str] | None = None,
    identity_path: str | None = None,
    client_mode: bool = False,
    authorizer: PeerAuthorizer | None = None,
    extra: Mapping[str, Any] | None = None,
) -> hivemind.DHT:
    """Start a DHT peer and wait until it is ready (and has joined ``initial_peers`` if any).

    Initial peers p2pd would refuse (an address that does not parse, or names no peer id) are dropped
    with a warning: one bad address would otherwise stop the peer from starting at all. ``host_maddrs``
    defaults to every IPv4 interface on a free TCP port. Fails with hivemind's errors
    (for example ``P2PDaemonError`` when the identity in ``identity_path`` is already in use).
    ``authorizer``: take part in a swarm with admission (``worker/admission/``: DHT calls signed and
    checked, averaging guarded); the authorizer starts the DHT, with its own identity. ``extra``: further
    keywords of ``hivemind.DHT`` and what it passes on (``use_relay``, ``use_auto_relay``...:
    :mod:`worker.strategy.keywords`).
    """
    quiet_dead_sender_errors()
    kwargs: dict[str, Any] = {
        # long enough to outlast the pause (3 s) hivemind's DHT takes after a failed request, so that
        # shutdown() ends cleanly instead of terminating the DHT process (and orphaning its p2pd)
        "shutdown_timeout": DHT_SHUTDOWN_TIMEOUT_S,
        "host_maddrs": list(host_maddrs) if host_maddrs else ["/ip4/0.0.0.0/tcp/0"],
        "client_mode": client_mode,
    }
    if announce_maddrs:
        kwargs["announce_maddrs"] = list(announce_maddrs)
    if identity_path is not None:
        kwargs["identity_path"] = identity_path
    kwargs.update(extra or {})
    peers = usable_initial_peers(initial_peers)
    if authorizer is not None:
        return authorizer.start_dht(peers, **kwargs)
    return LifelineDHT(initial_peers=peers, start=True, **kwargs)


class LifelineDHT(hivemind.DHT):  # type: ignore[misc]
    """A ``hivemind.DHT`` whose process, ``p2pd`` included, ends as soon as the process that created it is
    gone, even killed with SIGKILL (:func:`worker.runtime.lifeline.exit_with_parent`): a worker agent
    killed by its PID alone would otherwise leave its peer running, announcing a worker that no longer
    trains."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self._owner_pid = os.getpid()  # read by the forked child (run)
        super().__init__(*args, **kwargs)

    def run(self) -> None:
        """The DHT's process: take the lifeline first, then serve as hivemind does (surviving a request
        it cannot read, its ``p2pd`` out of the worker's process group)."""
        exit_with_parent(self._owner_pid, exit_code=1)
        survive_unreadable_requests(self)
        p2pd_in_own_session()
        super().run()


def _is_loopback(maddr: str) -> bool:
    parts = maddr.split("/")
    for proto, value in itertools.pairwise(parts[1:]):
        if proto in ("ip4", "ip6"):
            try:
                return ipaddress.ip_address(value).is_loopback
            except ValueError:
                return False
    return False


def shareable_maddrs(maddrs: Sequence[object]) -> list[str]:
    """The addresses other machines should use: all but loopback, or loopback if that is all there is."""
    as_text = [str(maddr) for maddr in maddrs]
    outside = [maddr for maddr in as_text if not _is_loopback(maddr)]
    return outside or as_text


def initial_peers_line(maddrs: Sequence[object]) -> str:
    """The ``INITIAL_PEERS=...`` line another peer can put in its environment to join this one."""
    return "INITIAL_PEERS=" + ",".join(shareable_maddrs(maddrs))
