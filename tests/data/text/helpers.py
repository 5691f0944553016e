"""Tiny text data sets for the tests: pairs whose query and code share words, and labelled texts."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

WORDS = [
    "sort",
    "list",
    "open",
    "file",
    "read",
    "json",
    "parse",
    "date",
    "time",
    "path",
    "join",
    "split",
    "write",
    "close",
    "load",
    "save",
    "merge",
    "copy",
    "print",
    "count",
    "find",
    "match",
    "upper",
    "lower",
    "strip",
    "format",
    "encode",
    "decode",
    "zip",
    "send",
    "fetch",
    "query",
    "table",
]


def pair_rows(count: int, *, seed: int = 0, negatives: bool = False) -> list[dict[str, str]]:
    """``count`` pairs: a query of 3 words and a code line that uses the same words (so they can be learnt)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        words = [str(word) for word in rng.choice(WORDS, 3, replace=False)]
        row = {
            "anchor": f"how to {' '.join(words)} item {i}",
            "positive": f"def f{i}(x): return {words[0]}_{words[1]}(x).{words[2]}()",
        }
        if negatives:
            other = [str(word) for word in rng.choice(WORDS, 3, replace=False)]
            row["negative"] = f"def g{i}(y): return {other[0]}(y)"
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """Write ``rows`` as JSON Lines and return ``path``."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_pairs(path: Path, count: int = 48, **options: object) -> Path:
    """A JSON Lines file of :func:`pair_rows`."""
    return write_jsonl(path, pair_rows(count, **options))  # type: ignore[arg-type]


def write_texts(path: Path, labels: int = 10, per_label: int = 4, seed: int = 0) -> Path:
    """A CSV of labelled texts: each label's texts share two words."""
    rng = np.random.default_rng(seed)
    lines = ["text,label"]
    for label in range(labels):
        shared = " ".join(str(word) for word in rng.choice(WORDS, 2, replace=False))
        lines += [f"{shared} example {label} {k},intent_{label}" for k in range(per_label)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class FullDisk(io.FileIO):
    """A file that takes its first 128 bytes (a .npy header), then reports a full disk."""

    def write(self, data):
        if self.tell() >= 128:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def full_disk_open(file, mode="r", *args, **kwargs):
    """``open`` as the token store calls it, but a file opened for writing is a :class:`FullDisk`."""
    return FullDisk(file, mode.replace("b", "")) if "w" in mode else open(file, mode, *args, **kwargs)


@contextlib.contextmanager
def read_only_folder(folder: Path) -> Iterator[Path]:
    """Make ``folder`` read-only for the ``with`` block (skipping the test where file modes do not stop
    this user, root, from writing), then writable again; yields ``folder``."""
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("file modes do not stop this user (root) from writing")
        yield folder
    finally:
        folder.chmod(0o755)
