"""A real DHT peer on 127.0.0.1 keeps serving after a request it cannot read (hivemind 1.1.12's DHT
process died of the ``EOFError`` that ``multiprocessing`` raises when the sender's resource sharer hangs
up while the DHT fetches the request's reply pipe)."""

from __future__ import annotations

from collections.abc import Iterator

import hivemind
import pytest
from hivemind.utils import get_dht_time

from worker.strategy.dht import start_dht

pytestmark = pytest.mark.swarm


def _sender_hung_up() -> None:
    """Unpickling this raises what fetching a pipe end from a sender that hung up raises."""
    raise EOFError


class UnreadableRequest:
    """A request argument whose unpickling in the DHT process fails like a vanished reply pipe."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_sender_hung_up, ())


@pytest.fixture
def dht() -> Iterator[hivemind.DHT]:
    peer = start_dht(initial_peers=[], host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        yield peer
    finally:
        peer.shutdown()


@pytest.mark.timeout(60)
def test_the_dht_answers_the_next_request_after_one_it_could_not_read(dht: hivemind.DHT) -> None:
    dht.store("key", "value", expiration_time=get_dht_time() + 60, return_future=True).result(timeout=10)
    # sent as DHT.get sends its requests, with an argument the DHT process fails to unpickle
    dht._outer_pipe.send(("_get", [], {"key": "key", "latest": False, "future": UnreadableRequest()}))
    found = dht.get("key", latest=False, return_future=True).result(timeout=15)
    assert found is not None and found.value == "value"
    assert dht.is_alive()
