"""Checkpoint bytes for tests that upload checkpoints without training: what ``torch.save`` writes (a zip
of one folder holding ``data.pkl``) of a dict with a ``state_dict``, made without torch, so that the
server's format check (``orchestrator/api/checkpoint_format.py``) takes them. No model loads them."""

from __future__ import annotations

import io
import pickle
import zipfile


def checkpoint_bytes(
    payload: bytes = b"",
    *,
    state_dict: dict[str, object] | None = None,
    extra: dict[str, object] | None = None,
) -> bytes:
    """A checkpoint the server stores; ``payload`` (any bytes) makes checkpoints differ or grow, ``extra``
    adds keys (an object ``torch.load(weights_only=True)`` refuses makes one that does not load)."""
    pickled = pickle.dumps({"state_dict": state_dict or {}, "epoch": 0, **(extra or {})}, protocol=2)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/version", "3\n")
        archive.writestr("archive/data/0", payload)  # where torch.save puts a tensor's bytes
    return buffer.getvalue()


class NotAWeight:
    """An object no ``torch.load(weights_only=True)`` builds: in ``extra``, a checkpoint the server stores
    (its format is right) that does not load."""
