"""A small, complete language-model example: a byte-level transformer on a public-domain text it ships.

The text is ``data/founding_documents.txt`` beside this file (13 KB, United States public-domain works:
the Declaration of Independence, the Preamble of the Constitution, the Bill of Rights and the
Gettysburg Address), so nothing is downloaded. Bytes are the tokens (256 of them): no tokenizer to
install or ship. The model predicts each next byte; validation reports ``val_loss`` (nats per byte) and
``val_ppl``, its perplexity, ``exp(val_loss)``: 256 for uniform guessing, about 20 for a model that
only knows how often each letter occurs.

The file reads its text relative to itself, so it works both installed (``worker.examples.tinylm``) and
copied into a user's own project as a starting point (``mypkg/model.py`` with ``mypkg/data/...``). On a
GPU, train it in bf16 with the run's ``trainer: {precision: bf16-mixed}``: the loss is computed in
float32 either way.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule, LightningModule
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

TEXT_PATH = Path(__file__).parent / "data" / "founding_documents.txt"
VOCAB_SIZE = 256  # bytes


def load_text_bytes(path: Path = TEXT_PATH) -> Tensor:
    """The text as a 1-D int64 tensor of its bytes (values 0..255)."""
    return torch.tensor(list(path.read_bytes()), dtype=torch.int64)


class ByteWindows(Dataset[tuple[Tensor, Tensor]]):
    """Windows of ``context_bytes`` inputs and the same window shifted by one byte as targets.

    Window ``i`` starts at ``i * stride_bytes``; every window fits inside ``data``.
    """

    def __init__(self, data: Tensor, context_bytes: int, stride_bytes: int) -> None:
        if len(data) < context_bytes + 1:
            raise ValueError(f"{len(data)} bytes are too few for a window of {context_bytes} + 1 bytes")
        self.data = data
        self.context_bytes = context_bytes
        self.stride_bytes = stride_bytes

    def __len__(self) -> int:
        return (len(self.data) - self.context_bytes - 1) // self.stride_bytes + 1

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.stride_bytes
        window = self.data[start : start + self.context_bytes + 1]
        return window[:-1], window[1:]


class TinyTextData(LightningDataModule):
    """The text split in two contiguous parts: the first for training, the last ``val_fraction`` for
    validation. The split has no randomness, so every worker of a run validates on the same bytes and
    none of them were trained on (a random split of overlapping windows would leak)."""

    def __init__(
        self, batch_size: int = 16, context_bytes: int = 64, val_fraction: float = 0.1, num_workers: int = 0
    ) -> None:
        super().__init__()
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be between 0 and 1, got {val_fraction}")
        self.batch_size = batch_size
        self.context_bytes = context_bytes
        self.val_fraction = val_fraction
        self.num_workers = num_workers
        self.train_set: ByteWindows | None = None
        self.val_set: ByteWindows | None = None

    def setup(self, stage: str | None = None) -> None:
        data = load_text_bytes()
        split = len(data) - int(len(data) * self.val_fraction)
        # training windows overlap by half (more distinct contexts); validation windows do not
        self.train_set = ByteWindows(data[:split], self.context_bytes, max(1, self.context_bytes // 2))
        self.val_set = ByteWindows(data[split:], self.context_bytes, self.context_bytes)

    def train_dataloader(self) -> DataLoader[tuple[Tensor, Tensor]]:
        assert self.train_set is not None, "call setup() first"
        # Each worker shuffles on its own: workers drawing different batches add different gradients
        # to the swarm's sum, where the same order everywhere would repeat the same batches.
        return DataLoader(
            self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers
        )

    def val_dataloader(self) -> DataLoader[tuple[Tensor, Tensor]]:
        assert self.val_set is not None, "call setup() first"
        return DataLoader(self.val_set, batch_size=64, num_workers=self.num_workers)


class TinyLM(LightningModule):
    """A decoder-only transformer over bytes (pre-norm, causal, embeddings tied to the output layer).

    Logs ``train_loss`` every step, and after each validation ``val_loss`` (mean nats per byte over
    the whole validation set) and ``val_ppl`` = ``exp(val_loss)``.
    """

    def __init__(
        self,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        context_bytes: int = 64,
        dropout: float = 0.0,
        lr: float = 3e-3,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(VOCAB_SIZE, d_model)
        self.position = nn.Embedding(context_bytes, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, dim_feedforward=4 * d_model, dropout=dropout, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        # small embeddings (as GPT-2's): the tied output layer then starts near uniform, loss ~ ln(256)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.position.weight, std=0.02)
        self.lr = lr
        self._val_nats = 0.0
        self._val_bytes = 0

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits of the next byte at every position: [batch, time] -> [batch, time, 256]."""
        length = tokens.shape[1]
        if length > self.position.num_embeddings:
            raise ValueError(
                f"a window of {length} bytes is longer than the model's context_bytes "
                f"({self.position.num_embeddings}): give the module and the datamodule the same context_bytes"
            )
        positions = torch.arange(length, device=tokens.device)
        hidden = self.embed(tokens) + self.position(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        hidden = self.blocks(hidden, mask=mask, is_causal=True)
        return self.norm(hidden) @ self.embed.weight.T

    def loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """Mean cross-entropy per byte, in float32 also under bf16 autocast."""
        tokens, targets = batch
        return F.cross_entropy(self(tokens).float().flatten(0, 1), targets.flatten())

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=False)
        return loss

    def on_validation_epoch_start(self) -> None:
        self._val_nats, self._val_bytes = 0.0, 0

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        count = batch[1].numel()
        self._val_nats += float(self.loss(batch)) * count
        self._val_bytes += count

    def on_validation_epoch_end(self) -> None:
        # The mean over all validation bytes, then its exp: averaging per-batch perplexities would not
        # be the perplexity of the validation text.
        val_loss = self._val_nats / max(1, self._val_bytes)
        self.log("val_loss", val_loss, prog_bar=True)
        self.log("val_ppl", math.exp(val_loss), prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)
