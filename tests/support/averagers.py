"""Two real hivemind averagers on 127.0.0.1, each on a DHT of its own, for tests of a single round."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import hivemind
import torch
from hivemind.averaging import DecentralizedAverager


@contextmanager
def averager_pair(
    values: tuple[float, float], size: int, **opts: Any
) -> Iterator[tuple[DecentralizedAverager, DecentralizedAverager]]:
    """Averagers A and B holding ``size`` copies of ``values[0]`` and ``values[1]``, started with ``opts``;
    shut down (with their DHTs) on exit."""
    first = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    second = hivemind.DHT(
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        initial_peers=[str(addr) for addr in first.get_visible_maddrs()],
        start=True,
    )
    a = DecentralizedAverager([torch.full((size,), values[0])], first, start=True, **opts)
    b = DecentralizedAverager([torch.full((size,), values[1])], second, start=True, **opts)
    try:
        yield a, b
    finally:
        for peer in (a, b, first, second):
            peer.shutdown()
