"""``composer-dynsample convert CONFIG.yaml --to mds OUT``: a config's data as MosaicML Streaming shards.

The data section is loaded exactly as ``train`` loads it (its tokenizer, or its model folder's, its
``max_length``, prompts and split), so the shards hold the rows a run reads from the file, in the same
order; :func:`~composer_dynsample.data.streaming.convert_to_mds` writes them with the manifest.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from composer_dynsample.cli.commands import OutputError, _check_config, _load
from composer_dynsample.config.components import ConfigError

__all__ = ["convert"]


class _Progress:
    """A line per tenth of a split (or every 30 s) on stderr: conversion of a large corpus takes minutes."""

    def __init__(self) -> None:
        self.last, self.shown = 0.0, -1

    def __call__(self, split: str, done: int, total: int) -> None:
        tenth = done * 10 // max(total, 1)
        now = time.monotonic()
        if tenth > self.shown or now - self.last > 30 or done == total:
            self.shown, self.last = tenth, now
            print(f"convert: {split}: {done}/{total} rows", file=sys.stderr, flush=True)


def convert(
    config: str | os.PathLike[str],
    overrides: Sequence[str],
    to_format: str,
    out: Path,
    *,
    shard_size: str = "64mb",
    compression: str | None = "zstd",
    overwrite: bool = False,
) -> Path:
    """Load ``config``'s data and write it to ``out`` as MDS shards; print what was written.

    Raises:
        ConfigError: If the format is not ``mds``, an option is wrong, the streaming extra is missing or
            the data section fails to load.
        OutputError: If ``out`` exists (without ``overwrite``).
    """
    from composer_dynsample.config.builders import build_data

    if to_format != "mds":
        raise ConfigError(f"--to {to_format!r}: the one format written is mds (MosaicML Streaming).")
    _check_folder_can_be_made(out)
    if out.exists() and not overwrite:
        raise OutputError(
            f"--to mds {str(out)!r}: it exists; give a new folder, or --overwrite to replace it."
        )
    try:
        from composer_dynsample.data.streaming.convert import convert_to_mds
    except ImportError as error:
        raise ConfigError(
            f"convert needs the streaming extra: pip install 'composer-dynsample[streaming]' ({error})."
        ) from None
    cfg = _load(config, overrides, {})
    _check_config(cfg)
    splits = build_data(cfg)
    started = time.monotonic()
    try:
        convert_to_mds(
            splits, out, shard_size=shard_size, overwrite=overwrite, progress=_Progress(),
            compression=None if str(compression).lower() == "none" else compression,
        )  # fmt: skip
    except ValueError as error:
        raise ConfigError(f"convert: {error}") from None
    except OSError as error:  # a folder this user cannot write in, a disk that is full
        shutil.rmtree(out, ignore_errors=True)  # nothing half-written is left to look complete
        reason = error.strerror or type(error).__name__
        where = f" ({error.filename})" if error.filename else ""
        raise OutputError(
            f"--to mds {str(out)!r}: cannot write there: {reason}{where}; give another folder."
        ) from None
    size = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    print(
        f"wrote {_rows(splits.train)} training and {_rows(splits.test)} test rows of {splits.name!r} to {out} "
        f"({size / 2**20:.1f} MiB, {time.monotonic() - started:.1f} s); train on them with "
        f"data={{name: streaming, remote: {out}}} (or the URL it is uploaded to)",
        flush=True,
    )
    return out


def _check_folder_can_be_made(out: Path) -> None:
    """Refuse an ``out`` that is a file, or whose nearest existing parent is a file, before any data is loaded."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"--to mds {str(out)!r}: it is a file, not a folder; give a folder to create.")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise OutputError(
            f"--to mds {str(out)!r}: {str(parent)!r} is a file, so no folder can be made under it; give another "
            "folder."
        )


def _rows(store: object) -> int:
    """A split's rows: a text split's given negatives included."""
    return int(getattr(store, "num_rows", len(store)))  # type: ignore[arg-type]
