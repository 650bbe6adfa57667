"""A byte-level transformer language model on the Python standard library's own sources, for
``bench/scaling.py``: a compute-bound model whose data ships with Python (nothing downloaded).

The ``*.py`` files of the standard library's top directory are split by file: every ``VAL_EVERY``-th
file is validation, the others training. A sample is ``context + 1`` consecutive bytes at a random
offset; the model predicts each next byte (cross-entropy in nats per byte).
"""

from __future__ import annotations

import argparse
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

VAL_EVERY = 10


def stdlib_bytes(max_train_bytes: int, max_val_bytes: int) -> tuple[Tensor, Tensor]:
    """(training bytes, validation bytes) as uint8 tensors, split by file."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    train, val = bytearray(), bytearray()
    for index, path in enumerate(files):
        part = val if index % VAL_EVERY == 0 else train
        limit = max_val_bytes if part is val else max_train_bytes
        if len(part) < limit:
            part += path.read_bytes()[: limit - len(part)]
    return torch.frombuffer(train, dtype=torch.uint8), torch.frombuffer(val, dtype=torch.uint8)


def windows(data: Tensor, starts: Tensor, context: int) -> Tensor:
    """The ``context + 1`` bytes from each start, as int64 (inputs and next-byte targets)."""
    index = starts.unsqueeze(1) + torch.arange(context + 1)
    return data[index].long()


def random_batches(data: Tensor, batch_size: int, context: int, seed: int) -> Iterator[Tensor]:
    """Endless batches of windows at random offsets (a seed per worker: different batches)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(data) - context - 1, (batch_size,), generator=generator)
        yield windows(data, starts, context)


def validation_windows(data: Tensor, count: int, context: int) -> Tensor:
    """``count`` windows evenly spread over the validation bytes: the same set for every arm."""
    starts = torch.linspace(0, len(data) - context - 2, count).long()
    return windows(data, starts, context)


class ByteTransformer(nn.Module):
    """A small pre-norm causal transformer over bytes."""

    def __init__(self, width: int = 128, layers: int = 2, heads: int = 4, context: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)
        self.register_buffer(
            "mask", nn.Transformer.generate_square_subsequent_mask(context), persistent=False
        )

    def forward(self, tokens: Tensor) -> Tensor:
        length = tokens.shape[1]
        hidden = self.embed(tokens) + self.position[:length]
        hidden = self.blocks(hidden, mask=self.mask[:length, :length], is_causal=True)
        return self.head(self.norm(hidden))

    def loss(self, batch: Tensor) -> Tensor:
        """Mean next-byte cross-entropy (nats) of a batch of windows."""
        logits = self(batch[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model's and the data's options, alike in every benchmark that trains this model."""
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--train-bytes", type=int, default=4_000_000)
    parser.add_argument("--val-bytes", type=int, default=400_000)
    parser.add_argument("--val-windows", type=int, default=128)
