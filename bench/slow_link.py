"""Workers behind links of capped bandwidth on one machine: a network namespace per worker, joined to the
benchmark's own namespace by a veth pair whose two ends are shaped with ``tc ... tbf``.

Spot fleets spread over zones and GPUs at home talk over links far slower than loopback; this kernel
has ``tbf`` and ``htb`` but not ``netem``, so the links are capped in rate, not given a delay. The
bridge's end (``10.88.0.1``) stays in the benchmark's namespace, where the bootstrap DHT peer listens;
worker ``i`` lives at ``10.88.0.<10 + i>`` and reaches the bridge and every other worker through its
own capped link: an all-reduce between two workers crosses two caps, as between two machines.

Needs root (``ip netns``, ``tc``); :func:`links_available` says whether this machine allows it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

BRIDGE = "ssbr0"
BRIDGE_IP = "10.88.0.1"
_CLONE_NEWNET = 0x40000000
#: tbf's bucket (burst) and queue bound; a bucket of 64 KiB lets a 100 Mbit/s link run near its rate
_BURST, _LATENCY = "64kb", "200ms"


def worker_ip(index: int) -> str:
    return f"10.88.0.{10 + index}"


def _namespace(index: int) -> str:
    return f"ssw{index}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _shape(device: str, mbit: float, namespace: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    subprocess.run(
        [*prefix, "tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", f"{mbit}mbit",
         "burst", _BURST, "latency", _LATENCY],
        check=True, capture_output=True, text=True,
    )  # fmt: skip


def links_available() -> str | None:
    """None when capped links can be built here; else why not."""
    if os.geteuid() != 0:
        return "capped links need root (ip netns, tc)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"capped links need {' and '.join(missing)} (iproute2)"
    return None


def _remove(count: int) -> None:
    for index in range(count):
        subprocess.run(["ip", "netns", "del", _namespace(index)], capture_output=True)
        subprocess.run(["ip", "link", "del", f"ssh{index}"], capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


@contextmanager
def capped_links(count: int, mbit: float) -> Iterator[list[str]]:
    """``count`` namespaces, each behind a link capped at ``mbit`` each way; yields their addresses and
    removes everything on exit (also what an interrupted run left)."""
    _remove(count)
    try:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{BRIDGE_IP}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for index in range(count):
            namespace, host_end, inner_end = _namespace(index), f"ssh{index}", f"ssn{index}"
            _ip("netns", "add", namespace)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", inner_end)
            _ip("link", "set", inner_end, "netns", namespace)
            _ip("link", "set", host_end, "master", BRIDGE)
            _ip("link", "set", host_end, "up")
            _ip("-n", namespace, "addr", "add", f"{worker_ip(index)}/24", "dev", inner_end)
            _ip("-n", namespace, "link", "set", inner_end, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            _shape(host_end, mbit)  # towards the worker
            _shape(inner_end, mbit, namespace)  # from the worker
        yield [worker_ip(index) for index in range(count)]
    finally:
        _remove(count)


def enter(index: int) -> None:
    """Move the calling process (a freshly forked worker, one thread) into worker ``index``'s namespace:
    the DHT and ``p2pd`` it starts then listen and send there. Python 3.11 has no ``os.setns``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{_namespace(index)}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {_namespace(index)}: {os.strerror(errno)}")
    finally:
        os.close(fd)
