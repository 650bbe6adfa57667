"""A TCP forwarder to the first backend that accepts a connection: the "one address" in front of two
orchestrators (what a load balancer with health checks is in production). Runs in a daemon thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence


class FailoverProxy:
    """Listens on ``127.0.0.1:port`` and forwards each connection to the first of ``backends`` (ports)
    that accepts it. :meth:`close` stops it."""

    def __init__(self, port: int, backends: Sequence[int]) -> None:
        self.port = port
        self.backends = list(backends)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._run, name="failover-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the failover proxy did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = None
        for port in self.backends:
            with contextlib.suppress(OSError):
                upstream = await asyncio.open_connection("127.0.0.1", port)
                break
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer = upstream
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    def close(self) -> None:
        """Stop listening, end every forwarded connection and the thread."""
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        future.result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            writer.close()
