"""DiLoCo peers without Lightning, for tests of rounds: a tiny linear model, plain SGD as the inner
optimizer, a ``DiLoCoOptimizer`` on a DHT of its own on 127.0.0.1; and the plain-torch reference of the
outer update rule."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import hivemind
import torch

from worker.strategy.diloco.optimizer import DiLoCoOptimizer
from worker.strategy.diloco.settings import DiLoCoSettings
from worker.strategy.keywords import averager_options

MATCHMAKING_S, AVERAGING_TIMEOUT_S = 1.0, 10.0
FEATURES = 8
#: a record of a peer killed without goodbye is forgotten this long after its last write
RECORD_EXPIRATION_S = 4.0


@dataclass
class Peer:
    """One DiLoCo peer: its model, optimizer and DHT."""

    model: torch.nn.Linear
    optimizer: DiLoCoOptimizer
    dht: hivemind.DHT

    def train(self, steps: int, seed: int, batch: int = 16) -> None:
        """``steps`` inner steps of least squares on data drawn with ``seed``."""
        generator = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            x = torch.randn(batch, FEATURES, generator=generator)
            y = x.sum(dim=1, keepdim=True)
            self.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            self.optimizer.batch_samples = batch
            self.optimizer.step()

    def flat(self) -> torch.Tensor:
        return torch.cat([p.detach().flatten() for p in self.model.parameters()])

    def global_flat(self) -> torch.Tensor:
        return torch.cat([g.detach().flatten() for g in self.optimizer.outer.global_params])


def start_dht(initial_peers: Sequence[str] = ()) -> hivemind.DHT:
    return hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=list(initial_peers), start=True)


def make_peer(dht: hivemind.DHT, run_id: str = "diloco_test", **settings: Any) -> Peer:
    """A peer whose rounds run only when the test calls ``run_round`` (unless ``settings`` say)."""
    torch.manual_seed(0)  # every peer starts from the same weights, as after a state download
    model = torch.nn.Linear(FEATURES, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    optimizer = DiLoCoOptimizer(
        inner,
        dht=dht,
        run_id=run_id,
        settings=DiLoCoSettings(**{"sync_every_steps": 10**9, **settings}),
        target_batch_size=64,
        matchmaking_time=MATCHMAKING_S,
        averaging_timeout=AVERAGING_TIMEOUT_S,
        averager_opts=averager_options(None, MATCHMAKING_S),
        tracker_opts={
            "private_key": hivemind.utils.crypto.RSAPrivateKey(),
            "metadata_expiration": RECORD_EXPIRATION_S,
            "stale_after_s": RECORD_EXPIRATION_S,
        },
    )
    return Peer(model, optimizer, dht)


@contextmanager
def diloco_peers(count: int, **settings: Any) -> Iterator[list[Peer]]:
    """``count`` peers of one swarm, shut down (optimizers, then DHTs) on exit."""
    with ExitStack() as stack:
        dhts: list[hivemind.DHT] = []
        for _ in range(count):
            initial = [str(addr) for addr in dhts[0].get_visible_maddrs()] if dhts else []
            dht = start_dht(initial)
            stack.callback(dht.shutdown)
            dhts.append(dht)
        peers = []
        for dht in dhts:
            peer = make_peer(dht, **settings)
            stack.callback(peer.optimizer.shutdown)
            peers.append(peer)
        yield peers


def reference_outer_steps(
    start: Sequence[torch.Tensor],
    rounds: Sequence[Sequence[tuple[Sequence[torch.Tensor], float]]],
    lr: float,
    momentum: float,
) -> list[list[torch.Tensor]]:
    """The global weights after each round, written out from the update rule. ``rounds`` holds, per
    round, each worker's (pseudo-gradient: global minus its local weights, samples). The round's
    pseudo-gradient ``g`` is the samples-weighted mean; Nesterov SGD keeps ``buf = momentum * buf + g``
    (``buf = g`` at the first step) and moves the weights by ``-lr * (g + momentum * buf)``."""
    params = [t.clone() for t in start]
    buffers: list[torch.Tensor] | None = None
    after = []
    for workers in rounds:
        total = sum(weight for _, weight in workers)
        grads = [sum(weight * delta[i] for delta, weight in workers) / total for i in range(len(params))]
        if buffers is None:
            buffers = [g.clone() for g in grads]
        else:
            buffers = [momentum * b + g for b, g in zip(buffers, grads, strict=True)]
        params = [p - lr * (g + momentum * b) for p, g, b in zip(params, grads, buffers, strict=True)]
        after.append([p.clone() for p in params])
    return after
