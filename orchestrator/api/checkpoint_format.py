"""A cheap check that an uploaded checkpoint is what ``torch.save`` writes of a Lightning checkpoint, made
before it is stored: bytes that no worker could ever load never become the checkpoint every launched
worker resumes from.

``torch.save`` writes a zip archive of one top-level folder holding ``data.pkl`` (the pickled object;
tensors' bytes are other members of the folder). The check opens the zip's directory, finds that
member, and reads its pickle opcodes with :func:`pickletools.genops`, which parses without unpickling:
no object is built and no code named in it runs. The pickle must parse to its end and name
``state_dict``, the key every Lightning checkpoint has. That refuses junk and truncated or foreign
files; a well-formed checkpoint of the wrong model still passes, and workers that cannot load it fall
back to an older one (``worker/agent/resume.py``).
"""

from __future__ import annotations

import io
import pickletools
import zipfile
from pathlib import Path

from orchestrator.errors import InvalidRequest

#: the largest pickle the check reads: the tensors are other members, so even a large model's is small
MAX_PICKLE_BYTES = 256 << 20
PICKLE_MEMBER = "data.pkl"
REQUIRED_KEY = "state_dict"
#: opcodes that push a string constant (a dict key among them)
_STRING_OPCODES = frozenset(
    {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
)


class NotACheckpoint(InvalidRequest):
    """The uploaded bytes are not a torch-saved Lightning checkpoint (422)."""


def check_checkpoint_file(path: Path) -> None:
    """Raise :class:`NotACheckpoint`, saying what is wrong, unless ``path`` looks like a checkpoint (see the
    module docstring). Reads the zip directory and the pickle member only."""
    if not zipfile.is_zipfile(path):
        raise NotACheckpoint("not a checkpoint: not a zip archive, as torch.save writes")
    try:
        with zipfile.ZipFile(path) as archive:
            pickle_bytes = _pickle_member(archive)
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError) as exc:
        raise NotACheckpoint(f"not a checkpoint: unreadable zip archive ({exc})") from exc
    if REQUIRED_KEY not in _string_constants(pickle_bytes):
        raise NotACheckpoint(f"not a Lightning checkpoint: its pickle names no {REQUIRED_KEY!r}")


def _pickle_member(archive: zipfile.ZipFile) -> bytes:
    members = [i for i in archive.infolist() if i.filename.rsplit("/", 1)[-1] == PICKLE_MEMBER]
    tops = {i.filename.split("/", 1)[0] for i in archive.infolist()}
    if len(members) != 1 or members[0].filename.count("/") != 1 or len(tops) != 1:
        raise NotACheckpoint(f"not a checkpoint: torch.save writes one folder holding one {PICKLE_MEMBER}")
    if members[0].file_size > MAX_PICKLE_BYTES:
        raise NotACheckpoint(f"not a checkpoint: its {PICKLE_MEMBER} is over {MAX_PICKLE_BYTES} bytes")
    with archive.open(members[0]) as handle:
        return handle.read(MAX_PICKLE_BYTES + 1)


def _string_constants(pickle_bytes: bytes) -> set[str]:
    """The strings the pickle pushes, parsed to its STOP opcode; :class:`NotACheckpoint` if it does not
    parse or has bytes after its end."""
    stream = io.BytesIO(pickle_bytes)
    strings: set[str] = set()
    try:
        for opcode, arg, _ in pickletools.genops(stream):
            if opcode.name in _STRING_OPCODES and isinstance(arg, str | bytes):
                strings.add(arg if isinstance(arg, str) else arg.decode("latin-1"))
    except (ValueError, EOFError) as exc:
        raise NotACheckpoint(f"not a checkpoint: its {PICKLE_MEMBER} is no pickle ({exc})") from exc
    if stream.tell() != len(pickle_bytes):
        raise NotACheckpoint(f"not a checkpoint: bytes after the end of its {PICKLE_MEMBER}")
    return strings
