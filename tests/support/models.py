"""Tiny Lightning classes the API tests name as a run's module and datamodule (never trained)."""

from __future__ import annotations

import os

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


class CredentialQuotingModule(pl.LightningModule):
    """A user's module whose set-up calls an API with a secret in the URL and fails, as an HTTP client's
    error does: the exception's first line quotes the secret named by ``secret_name``."""

    def __init__(self, secret_name: str = "API_KEY") -> None:
        super().__init__()
        url = f"https://api.example/whoami?token={os.environ[secret_name]}"
        raise RuntimeError(f"401 Client Error: Unauthorized for url: {url}")
