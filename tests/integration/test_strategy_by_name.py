"""``import worker.strategy``, then ``Trainer(strategy="hivemind")``: a lone peer fits, and the name is
registered whether Lightning loads before the package or after it (the package never loads it itself)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import hivemind
import pytest
from lightning.pytorch import Trainer

import worker.strategy
from tests.support.strategy import digits
from worker.examples.digits import DigitsModule
from worker.protocol.trainer import NO_VALIDATION, QUIET

pytestmark = pytest.mark.timeout(120)


def test_a_lone_peer_fits_two_steps_with_the_strategy_named_hivemind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INITIAL_PEERS", raising=False)
    monkeypatch.delenv("PL_INITIAL_PEERS", raising=False)  # no initial peers: a new swarm of one
    trainer = Trainer(strategy="hivemind", accelerator="cpu", max_steps=2, **QUIET, **NO_VALIDATION)
    strategy = trainer.strategy
    assert isinstance(strategy, worker.strategy.HivemindStrategy)

    trainer.fit(DigitsModule(), digits(batch_size=32))

    assert isinstance(trainer.optimizers[0], hivemind.Optimizer)
    assert trainer.global_step == 2 and strategy.local_samples == 2 * 32
    progress = strategy.swarm_progress()  # the last view: 64 of the 8192 samples of its first swarm epoch
    assert (progress.epoch, progress.samples_accumulated, progress.target_batch_size) == (0, 64, 8192)
    with pytest.raises(worker.strategy.SwarmNotStartedError):
        strategy.dht  # noqa: B018  (its own DHT is shut down with the fit)


@pytest.mark.parametrize("lightning_first", [False, True], ids=["package-first", "lightning-first"])
def test_importing_the_package_registers_the_name_in_either_order(lightning_first: bool) -> None:
    program = textwrap.dedent(
        f"""
        import sys
        if {lightning_first}:
            import lightning.pytorch
        import worker.strategy
        assert ("lightning" in sys.modules) == {lightning_first}, "the package loaded Lightning"
        from lightning.pytorch import Trainer
        strategy = Trainer(strategy="hivemind", accelerator="cpu", devices=1, logger=False).strategy
        print(type(strategy).__name__, strategy.target_batch_size)
        """
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["HivemindStrategy", "8192"]
