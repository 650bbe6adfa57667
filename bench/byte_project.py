"""A user's own project around ``bench/bytelm.py``'s byte-level transformer, written into a directory for
``spotswarm runs create --workdir``: what ``bench/orchestrated_scaling.py`` ships with each run.

The project is a package ``bytelmproj`` with a copy of ``bench/bytelm.py`` (the very model and data of
``bench/scaling.py``: the standard library's sources, nothing downloaded) and ``model.py``, a
LightningModule and a LightningDataModule as a user would write them. Training batches stream at random
offsets (a seed per worker process, so workers draw different batches); validation is a fixed set of
windows of the held-out files, small enough to run every few seconds so ``val_loss`` shows early.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

PACKAGE = "bytelmproj"
MODULE = f"{PACKAGE}.model:ByteLM"
DATAMODULE = f"{PACKAGE}.model:StdlibBytes"

MODEL_PY = textwrap.dedent(
    """
    import os

    import torch
    from lightning.pytorch import LightningDataModule, LightningModule
    from torch.utils.data import DataLoader, IterableDataset

    from bytelmproj.bytelm import ByteTransformer, random_batches, stdlib_bytes, validation_windows


    class ByteLM(LightningModule):
        def __init__(self, width: int = 128, layers: int = 2, heads: int = 4, context: int = 64,
                     lr: float = 3e-3) -> None:
            super().__init__()
            torch.manual_seed(0)  # the same initial weights in every worker and run
            self.net = ByteTransformer(width, layers, heads, context)
            self.lr = lr

        def training_step(self, batch, batch_idx):
            loss = self.net.loss(batch)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.net.loss(batch))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=self.lr)


    class Stream(IterableDataset):
        def __init__(self, data, batch_size: int, context: int) -> None:
            self.data, self.batch_size, self.context = data, batch_size, context

        def __iter__(self):
            return random_batches(self.data, self.batch_size, self.context, seed=os.getpid())


    class StdlibBytes(LightningDataModule):
        def __init__(self, batch_size: int = 32, context: int = 64, train_bytes: int = 4_000_000,
                     val_bytes: int = 400_000, val_windows: int = 128) -> None:
            super().__init__()
            self.batch_size, self.context = batch_size, context
            self.train_bytes, self.val_bytes, self.val_windows = train_bytes, val_bytes, val_windows

        def setup(self, stage: str) -> None:
            self.train, self.val = stdlib_bytes(self.train_bytes, self.val_bytes)

        def train_dataloader(self):
            return DataLoader(Stream(self.train, self.batch_size, self.context), batch_size=None)

        def val_dataloader(self):
            windows = validation_windows(self.val, self.val_windows, self.context)
            return DataLoader(windows, batch_size=len(windows))
    """
).lstrip()


def write_project(root: Path) -> Path:
    """Write the project into ``root`` (created); returns ``root``."""
    package = root / PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""A byte-level language model on the standard library."""\n')
    shutil.copyfile(Path(__file__).with_name("bytelm.py"), package / "bytelm.py")
    (package / "model.py").write_text(MODEL_PY)
    return root
