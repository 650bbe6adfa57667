"""A small, complete example: scikit-learn's 8x8 handwritten digits and an MLP to classify them.

The data ships inside scikit-learn (1,797 images), so nothing is downloaded. This is what a user's
LightningModule and DataModule look like for ``HivemindStrategy``: nothing hivemind-specific in them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule, LightningModule
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

NUM_FEATURES = 64
NUM_CLASSES = 10
SPLIT_SEED = 20240611


def load_digits_tensors() -> tuple[Tensor, Tensor]:
    """All 1,797 digits as (features in [0, 1], float32, shape [N, 64]; labels, int64, shape [N])."""
    from sklearn.datasets import load_digits  # imported here: only the example needs scikit-learn

    data = load_digits()
    features = torch.tensor(data.data, dtype=torch.float32) / 16.0
    labels = torch.tensor(data.target, dtype=torch.int64)
    return features, labels


class DigitsDataModule(LightningDataModule):
    """Digits split 80/20 into train/validation, the same way in every process (fixed seed)."""

    def __init__(self, batch_size: int = 32, val_fraction: float = 0.2, num_workers: int = 0) -> None:
        super().__init__()
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be between 0 and 1, got {val_fraction}")
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.num_workers = num_workers
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        features, labels = load_digits_tensors()
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
        num_val = int(len(labels) * self.val_fraction)
        val_idx, train_idx = order[:num_val], order[num_val:]
        self.train_set = TensorDataset(features[train_idx], labels[train_idx])
        self.val_set = TensorDataset(features[val_idx], labels[val_idx])

    def train_dataloader(self) -> DataLoader:
        assert self.train_set is not None, "call setup() first"
        return DataLoader(
            self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers
        )

    def val_dataloader(self) -> DataLoader:
        assert self.val_set is not None, "call setup() first"
        return DataLoader(self.val_set, batch_size=256, num_workers=self.num_workers)


class DigitsModule(LightningModule):
    """A two-layer MLP; logs ``train_loss`` (progress bar) and ``val_loss`` / ``val_acc``."""

    def __init__(self, hidden: int = 64, lr: float = 0.01, depth: int = 1) -> None:
        super().__init__()
        self.save_hyperparameters()
        layers: list[nn.Module] = []
        width = NUM_FEATURES
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, NUM_CLASSES))
        self.net = nn.Sequential(*layers)
        self.lr = lr

    def forward(self, features: Tensor) -> Tensor:
        return self.net(features)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        features, labels = batch
        loss = F.cross_entropy(self(features), labels)
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        features, labels = batch
        logits = self(features)
        self.log("val_loss", F.cross_entropy(logits, labels), prog_bar=True)
        self.log("val_acc", (logits.argmax(dim=1) == labels).float().mean(), prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)
