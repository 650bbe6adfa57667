"""Cores of one machine shared out among its local workers (``launcher_options: {"cpus_per_worker": N}``).

Without it every worker of a machine runs on every core, and torch in each starts a thread per core: N
workers on N cores fight over all of them, and no figure of what more workers buy means anything. With
it the launcher gives each worker N cores of its own (the lowest ones no live worker of this launcher
holds), in the worker's environment as ``SPOTSWARM_CPUS``; the agent pins itself to them and sets
torch's threads to N before it trains (``worker/agent/cpus.py``). A run whose desired workers do not fit
on this machine's cores is refused when it is created.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from orchestrator.launchers.base import LauncherConfigError

CPUS_OPTION = "cpus_per_worker"
#: the agent's setting (``AgentSettings.cpus``) that carries a worker's cores, as a CPU list ``2,3``
CPUS_ENV = "SPOTSWARM_CPUS"


def usable_cpus() -> list[int]:
    """The cores this process may run on (its affinity: a container's or a cgroup's share, not the host's)."""
    return sorted(os.sched_getaffinity(0))


def cpus_per_worker(options: Mapping[str, Any]) -> int | None:
    """The option's value (None when absent); raises :class:`LauncherConfigError` when it is not a
    positive int."""
    if CPUS_OPTION not in options:
        return None
    value = options[CPUS_OPTION]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise LauncherConfigError(f"{CPUS_OPTION} must be a positive int (cores per worker), got {value!r}")
    return value


def check_capacity(per_worker: int, workers: int, available: Sequence[int]) -> None:
    """Refuse ``workers`` x ``per_worker`` cores when this machine has fewer, with the numbers to change."""
    needed = per_worker * max(workers, 1)
    if needed > len(available):
        raise LauncherConfigError(
            f"{CPUS_OPTION}={per_worker} for {max(workers, 1)} desired worker(s) needs {needed} cores, and "
            f"this machine gives the orchestrator {len(available)}: lower desired_workers or {CPUS_OPTION} "
            f"(at most {len(available) // max(workers, 1)} per worker for {max(workers, 1)} worker(s))"
        )


def allocate(per_worker: int, available: Sequence[int], in_use: Collection[int]) -> list[int]:
    """The lowest ``per_worker`` cores of ``available`` that no live worker holds; when fewer are free (runs
    beside each other asked for more than the machine has), the least loaded ones, shared."""
    free = [cpu for cpu in available if cpu not in in_use]
    if len(free) >= per_worker:
        return free[:per_worker]
    load = {cpu: sum(1 for used in in_use if used == cpu) for cpu in available}
    return sorted(sorted(available, key=lambda cpu: (load[cpu], cpu))[:per_worker])


def cpu_list(cpus: Sequence[int]) -> str:
    return ",".join(str(cpu) for cpu in cpus)
