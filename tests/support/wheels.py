"""Tiny wheels made in a test, for requirements installed from a local directory (no package index)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path


def build_wheel(
    dest_dir: Path, name: str, version: str, requires: Sequence[str] = (), modules: Mapping[str, str] = ()
) -> Path:
    """A pure-Python wheel of ``name`` holding ``modules`` (path -> source; default: a package whose
    ``VALUE`` names it) that requires ``requires``; returns its path in ``dest_dir``."""
    files = dict(modules) or {f"{name}/__init__.py": f"VALUE = '{name} {version}'\n"}
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files[f"{info}/METADATA"] = metadata + "".join(f"Requires-Dist: {r}\n" for r in requires)
    files[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / f"{name}-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(path, "w") as wheel:
        for member, text in files.items():
            data = text.encode()
            wheel.writestr(member, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{member},sha256={digest},{len(data)}\n")
        wheel.writestr(f"{info}/RECORD", "".join(record) + f"{info}/RECORD,,\n")
    return path
