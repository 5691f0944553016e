"""The SHA-256 of a file's bytes, read in blocks: what a manifest, a model card and a checked download record."""

from __future__ import annotations

import hashlib
import os

__all__ = ["file_sha256"]


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 of the file at ``path``, read 1 MiB at a time (a file larger than memory is fine).

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile(delete=False) as handle:
        ...     _ = handle.write(b"abc")
        >>> file_sha256(handle.name)[:16]
        'ba7816bf8f01cfea'
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
