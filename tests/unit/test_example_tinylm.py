"""The language-model example (worker/examples/tinylm.py): its shipped text, its deterministic split, the
model's shapes, perplexity as exp(loss), and a few CPU steps that learn (plain Lightning, no swarm)."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch

from worker.examples.tinylm import TEXT_PATH, VOCAB_SIZE, TinyLM, TinyTextData, load_text_bytes


def quiet_trainer(**kwargs: object) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,  # type: ignore[arg-type]
    )


def test_the_text_ships_with_the_package_small_and_plain() -> None:
    data = TEXT_PATH.read_bytes()
    assert 10_000 < len(data) < 200_000
    assert data.isascii() and b"We hold these truths to be self-evident" in data
    assert torch.equal(load_text_bytes(), torch.tensor(list(data)))


def test_the_split_is_contiguous_deterministic_and_without_overlap() -> None:
    first, second = TinyTextData(context_bytes=32), TinyTextData(context_bytes=32)
    first.setup("fit")
    second.setup("fit")
    assert first.train_set is not None and first.val_set is not None and second.val_set is not None
    data = load_text_bytes()
    split = len(data) - int(len(data) * 0.1)
    assert torch.equal(first.train_set.data, data[:split]) and torch.equal(first.val_set.data, data[split:])
    assert len(first.val_set) == len(second.val_set) > 0
    assert all(torch.equal(first.val_set[i][0], second.val_set[i][0]) for i in range(len(first.val_set)))
    tokens, targets = first.train_set[len(first.train_set) - 1]
    assert tokens.shape == targets.shape == (32,) and torch.equal(tokens[1:], targets[:-1])
    with pytest.raises(IndexError):
        first.train_set[len(first.train_set)]


def test_the_model_predicts_every_next_byte_and_starts_near_uniform() -> None:
    torch.manual_seed(0)
    data = TinyTextData(batch_size=4, context_bytes=16)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    model = TinyLM(context_bytes=16)
    with torch.no_grad():
        assert model(batch[0]).shape == (4, 16, VOCAB_SIZE)
        initial_loss = float(model.loss(batch))
    assert initial_loss == pytest.approx(math.log(VOCAB_SIZE), abs=0.2)
    with pytest.raises(ValueError, match="give the module and the datamodule the same context_bytes"):
        TinyLM(context_bytes=8)(batch[0])


def test_val_ppl_is_exp_of_the_mean_val_loss_and_a_few_steps_lower_it() -> None:
    torch.manual_seed(0)
    model, data = TinyLM(), TinyTextData(batch_size=16)
    [before] = quiet_trainer().validate(model, data, verbose=False)
    assert before["val_ppl"] == pytest.approx(math.exp(before["val_loss"]), rel=1e-5)
    assert before["val_ppl"] == pytest.approx(VOCAB_SIZE, rel=0.25)  # near uniform guessing

    quiet_trainer(max_steps=20, limit_val_batches=0).fit(model, data)
    [after] = quiet_trainer().validate(model, data, verbose=False)
    assert after["val_ppl"] == pytest.approx(math.exp(after["val_loss"]), rel=1e-5)
    assert after["val_ppl"] < before["val_ppl"] / 4, (before, after)
