"""Tiny Lightning classes the API tests name as a run's module and datamodule (never trained)."""

from __future__ import annotations

import lightning.pytorch as pl
import torch


class TinyModule(pl.LightningModule):
    def __init__(self, hidden: int = 4) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, hidden)


class TinyDataModule(pl.LightningDataModule):
    def __init__(self, size: int = 8) -> None:
        super().__init__()
        self.size = size


class NotAModule:
    """A plain class: the API must refuse it as a module."""
