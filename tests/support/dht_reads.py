"""Reads of the DHT by the test's own peers, bounded: a request the DHT never answers must not hang a test.

Under load a DHT process can fail to fetch a request's reply pipe from the sender (an ``EOFError`` in
``multiprocessing``'s resource sharer, hivemind 1.1.12); it then drops that request, which is never
answered, and serves the next (``worker/_hivemind_compat.py``). hivemind's blocking ``get`` would
wait for that answer for good; these reads ask again instead.
"""

from __future__ import annotations

import sys
from typing import Any

import hivemind

#: how long one read waits for its answer (a healthy one takes well under a second on 127.0.0.1)
READ_TIMEOUT_S = 20.0
READ_ATTEMPTS = 3


def read_latest(dht: hivemind.DHT, key: str, *, attempts: int = READ_ATTEMPTS) -> Any:
    """``dht.get(key, latest=True)``, asked again when no answer comes within :data:`READ_TIMEOUT_S`;
    raises ``TimeoutError`` after ``attempts`` unanswered reads (each one noted on stderr)."""
    for attempt in range(1, attempts + 1):
        try:
            return dht.get(key, latest=True, return_future=True).result(timeout=READ_TIMEOUT_S)
        except TimeoutError:
            print(
                f"no answer to read {attempt} of {key} within {READ_TIMEOUT_S:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    raise TimeoutError(f"{attempts} reads of {key} went unanswered")
