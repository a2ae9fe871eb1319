"""File digests: one sha256 for the output hash chain, the build cache and direct mode's record."""

from __future__ import annotations

import hashlib
import os


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The file's sha256, hex, read in 1 MiB chunks (a ``.pte`` or ``.pt2`` can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
