"""A worker pinned to its own cores (the local launcher's ``cpus_per_worker``; docs/guides/worker-agent.md).

The agent pins its process before it starts any thread, so that every thread and process it makes
after (torch's intra-op pool, hivemind's DHT and averagers, forked) inherits the cores; torch's threads
are set to their number, where torch would otherwise start one per core of the machine and N workers
would each run N threads on their few cores.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def parse_cpu_list(text: str) -> set[int]:
    """``"2,3"`` -> ``{2, 3}``; raises ``ValueError`` for anything else."""
    cpus = {int(part) for part in text.split(",")}
    if not cpus or min(cpus) < 0:
        raise ValueError(f"not a CPU list: {text!r}")
    return cpus


def pin_to_cpus(text: str) -> None:
    """Run this process (and what it starts from now on) on the cores of CPU list ``text``, torch with as
    many threads. Raises ``OSError`` when a core is not this machine's (or not allowed to this process)."""
    cpus = parse_cpu_list(text)
    os.sched_setaffinity(0, cpus)
    threads = str(len(cpus))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # for a torch imported after this
        os.environ[name] = threads
    import torch  # a forked worker has it imported already; its thread pool starts at first use

    torch.set_num_threads(len(cpus))
    logger.info("pinned to cores %s, torch with %d threads", sorted(cpus), len(cpus))
