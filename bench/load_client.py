"""The heartbeat load of ``bench/api_load.py``: simulated workers, each heartbeating on its own schedule.

Cheap on purpose: the client shares the machine with the server, so it speaks HTTP/1.1 over a bounded pool
of keep-alive connections itself (a request is one pre-built byte string; an answer is read by its
Content-Length) instead of paying a full HTTP library per request.

Open loop: worker ``i`` sends at ``start + offset_i + k * interval`` whatever happened before, and a
request's latency runs from that scheduled moment to the end of the answer, so waiting for a free
connection, or a server that falls behind, counts (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Tally:
    """What one client process saw: latencies (s) of answered requests in the window, and failures."""

    latencies_s: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    answered: int = 0  # every 200, warm-up included (for the server's CPU time per heartbeat)
    busy_s: float = 0.0  # from the first send to the last answer
    errors: int = 0
    first_error: str = ""

    def fail(self, why: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or why


class Connection:
    """One keep-alive HTTP/1.1 connection; reconnects after a failure."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, payload: bytes) -> tuple[int, bytes]:
        """Send one request (complete bytes) and read its answer: (status, body). Raises OSError."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        try:
            self._writer.write(payload)
            status_line = await self._reader.readline()
            status = int(status_line.split(b" ", 2)[1])
            length = 0
            while (line := await self._reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            return status, await self._reader.readexactly(length)
        except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as exc:
            self.close()
            raise OSError(f"connection failed: {exc!r}") from exc

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


def heartbeat_request(host: str, worker_id: str, token: str, samples: int) -> bytes:
    body = json.dumps({"samples": samples, "swarm_epoch": samples // 1000, "loss": 0.5, "phase": "training"})
    return (
        f"POST /api/v1/workers/{worker_id}/heartbeat HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


async def run_load(
    url: str,
    workers: list[tuple[str, str]],
    interval_s: float,
    warmup_s: float,
    duration_s: float,
    connections: int,
) -> Tally:
    """Heartbeat as ``workers`` (id, token) for ``warmup_s + duration_s``; tally the measured window."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    pool: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(Connection(host, port))
    tally = Tally()
    start = time.monotonic() + 0.5
    window = (start + warmup_s, start + warmup_s + duration_s)

    async def worker(index: int, worker_id: str, token: str) -> None:
        due = start + interval_s * index / max(1, len(workers))
        samples = 0
        while due < window[1]:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            samples += 1
            conn = await pool.get()
            try:
                status, body = await conn.request(heartbeat_request(host, worker_id, token, samples))
            except OSError as exc:
                if due >= window[0]:
                    tally.fail(str(exc))
                continue
            finally:
                pool.put_nowait(conn)
                due += interval_s
            tally.answered += status == 200
            if due - interval_s >= window[0]:
                tally.statuses[status] = tally.statuses.get(status, 0) + 1
                if status == 200 and b'"action"' in body:
                    tally.latencies_s.append(time.monotonic() - (due - interval_s))
                else:
                    tally.fail(f"HTTP {status}: {body[:200]!r}")

    await asyncio.gather(*(worker(i, wid, token) for i, (wid, token) in enumerate(workers)))
    tally.busy_s = time.monotonic() - start
    while not pool.empty():
        pool.get_nowait().close()
    return tally


def run_load_process(
    url: str,
    workers: list[tuple[str, str]],
    interval_s: float,
    warmup_s: float,
    duration_s: float,
    connections: int,
) -> Tally:
    """:func:`run_load` in this (client) process, on uvloop when it is installed."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(run_load(url, workers, interval_s, warmup_s, duration_s, connections))
