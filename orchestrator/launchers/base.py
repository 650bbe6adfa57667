"""The launcher interface: how the reconcile loop starts and stops workers on some kind of machine.

Rules every backend follows (the reconciler relies on them):

- ``launch`` is idempotent by ``request_id``: calling it twice for one request starts one worker.
  The worker row carrying that request id is written to the database *before* ``launch`` is called.
- ``launch`` and ``terminate`` do not raise for failures of the machines themselves (no capacity, a
  process that died at once): those are reported by ``poll_errors``. They raise only
  :class:`LauncherConfigError` for a request that can never succeed (bad options).
- ``describe`` lists everything this launcher owns that is not known to be gone, including workers
  launched by an earlier orchestrator process (adoption after a restart).

A launch starts one *machine*: one peer (a worker agent with its own request id, worker row and token),
or, where :meth:`Launcher.peers_per_machine` says a machine holds more (a multi-GPU instance), up to that
many, one per device. The request's own id is its first peer's and names the machine; the other peers
ride along in ``LaunchRequest.siblings``. Everything else stays per peer: ``describe`` lists each peer
under its own request id (its ``details`` name the machine), ``poll_errors`` reports each, and
``terminate`` ends one peer: the machine goes when none of its peers is left.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class LauncherConfigError(ValueError):
    """A launch request that can never succeed as given (unknown option, bad instance type...)."""


#: the run option that sets how many peers one machine runs (one per device); every launcher takes it
PEERS_OPTION = "peers_per_machine"
#: ``Instance.details`` keys that place a peer: its machine (the machine's first request id) and device
MACHINE_DETAIL, PEER_INDEX_DETAIL = "machine", "peer_index"


def peers_option(options: Mapping[str, Any], *, most: int) -> int | None:
    """The run's ``peers_per_machine`` (None when absent); raises :class:`LauncherConfigError` unless it is
    an int from 1 to ``most``."""
    if PEERS_OPTION not in options:
        return None
    value = options[PEERS_OPTION]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise LauncherConfigError(
            f"{PEERS_OPTION} must be a whole number from 1 to {most} (peers, one per device, on each "
            f"machine), got {value!r}"
        )
    return value


@dataclass(frozen=True)
class PeerRequest:
    """One more peer on a launch's machine: its request id and its environment (its own join token)."""

    request_id: str
    env: Mapping[str, str]


@dataclass(frozen=True)
class LaunchRequest:
    """One machine to start, with its first worker. ``env`` is what that worker's agent needs to boot
    (URL, join token, request id); ``siblings`` are the machine's other peers, devices 1, 2, ... in order."""

    request_id: str
    run_name: str
    env: Mapping[str, str]
    options: Mapping[str, Any] = field(default_factory=dict)
    siblings: tuple[PeerRequest, ...] = ()

    @property
    def peers(self) -> tuple[PeerRequest, ...]:
        """Every peer of the machine, its first (this request's own id and env) included."""
        return (PeerRequest(self.request_id, self.env), *self.siblings)


@dataclass(frozen=True)
class Instance:
    """A worker machine or process as the launcher sees it."""

    request_id: str
    handle: str  # PID for local, instance id for EC2
    run_name: str
    alive: bool
    details: Mapping[str, Any] = field(default_factory=dict)  # instance type, zone, price, exit code...


# Keys of ``Instance.details`` that anonymous readers see (with public reads): what kind of machine a
# worker runs on and what it costs, never where it is or how to reach it (IPs, subnets, file paths).
PUBLIC_DETAILS = frozenset(
    {
        "instance_type",
        "availability_zone",
        "market",
        "state",
        "interrupted",
        "launch_time",
        "launched_at",
        "price_usd_per_hour",
        "price_per_hour",
        "exit_code",
        "terminating",
    }
)


@dataclass(frozen=True)
class LaunchFailure:
    """A launch that failed or a worker that died at start-up, reported by polling."""

    request_id: str
    run_name: str
    reason: str
    retryable: bool = True
    #: the market had no machine to give (EC2's ``InsufficientInstanceCapacity``): the reconciler asks
    #: again ever less often, and never fails a run for it; nothing is wrong with the run
    capacity: bool = False


@runtime_checkable
class Launcher(Protocol):
    """A backend that runs worker agents. Implementations: ``local`` (subprocesses), ``ec2`` (spot)."""

    name: str

    def validate_options(self, options: Mapping[str, Any], *, workers: int = 1) -> None:
        """Raise :class:`LauncherConfigError` when a run's ``launcher_options`` can never work for its
        ``workers`` desired workers: called when the run is created, so a bad option is a 422 then, not
        failed launches later."""
        ...

    def peers_per_machine(self, options: Mapping[str, Any]) -> int:
        """How many peers one machine of a run with ``options`` runs (one per device; 1 unless the
        launcher knows better or ``peers_per_machine`` says so). Raises :class:`LauncherConfigError` for
        options that :meth:`validate_options` refuses."""
        ...

    def launch(self, request: LaunchRequest) -> str:
        """Start the machine of ``request`` and its peers (idempotent by request id); return its handle."""
        ...

    def terminate(self, request_id: str) -> None:
        """Stop the worker of ``request_id`` if it still runs; a no-op for an unknown or gone one. A peer
        beside others on a machine: that peer where the launcher can stop one alone, else the machine
        once none of its peers is left."""
        ...

    def describe(self) -> list[Instance]:
        """Every worker this launcher owns, alive or recently gone, with its request id."""
        ...

    def poll_errors(self) -> list[LaunchFailure]:
        """Failures seen since the last call; each is reported once."""
        ...

    def close(self) -> None:
        """Release clients and threads; workers keep running (they outlive an orchestrator restart)."""
        ...
