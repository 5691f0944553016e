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
from typing import Any

from composer_dynsample.cli.commands import Interrupted, OutputError, _check_config, _load
from composer_dynsample.config.components import ConfigError
from composer_dynsample.config.mix_data import one_source

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
    source: str | None = None,
) -> Path:
    """Load ``config``'s data (of a mix, the source ``source``: ``--source NAME``) and write it to ``out`` as
    MDS shards; print what was written.

    The options and ``out`` are checked before the data is loaded. A convert that fails or is interrupted
    removes what it began; one killed midway leaves a folder without ``manifest.json``, which every reader
    refuses.

    Raises:
        ConfigError: If the format is not ``mds``, an option is wrong, the streaming extra is missing or
            the data section fails to load.
        OutputError: If ``out`` exists (without ``overwrite``) or holds files a convert does not write, if
            it holds a path the config names (its data, a cache, a tokenizer, a streaming source), or if it
            cannot be written.
        Interrupted: On ``KeyboardInterrupt`` (Ctrl-C), once the folder begun is removed.
    """
    from composer_dynsample.config.builders import build_data

    if to_format != "mds":
        raise ConfigError(
            f"--to {to_format!r}: the one format written is mds (MosaicML Streaming); give --to mds OUT."
        )
    _check_folder_can_be_made(out)
    if out.exists() and not overwrite:
        raise OutputError(
            f"--to mds {str(out)!r}: it exists; give a new folder, or --overwrite to replace it."
        )
    try:
        from composer_dynsample.data.streaming.convert import check_options, check_replaceable, convert_to_mds
    except ImportError as error:
        raise ConfigError(
            f"convert needs the streaming extra: pip install 'composer-dynsample[streaming]' ({error})."
        ) from None
    try:
        shard_size, compression = check_options(
            shard_size, compression, names=("--shard-size", "--compression")
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if out.exists():
        try:
            check_replaceable(out)
        except FileExistsError as error:
            raise OutputError(f"--to mds {str(out)!r} --overwrite: {error}") from None
    cfg = one_source(_load(config, overrides, {}), source, "convert")  # a mix: a folder a source
    _check_no_input_inside(out, config, cfg)
    _check_config(cfg)
    started, existed = time.monotonic(), out.exists()
    try:
        splits = build_data(cfg)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while loading the data; nothing was written to {out}", 130) from None
    try:
        convert_to_mds(splits, out, shard_size=shard_size, overwrite=overwrite, progress=_Progress(),
                       compression=compression)  # fmt: skip
    except KeyboardInterrupt:  # convert_to_mds removed the folder it began
        raise Interrupted(f"interrupted; no half-written {out} is left; run convert again", 130) from None
    except FileExistsError as error:  # made by another process meanwhile: it is not this convert's to remove
        raise OutputError(f"--to mds {str(out)!r}: {error}") from None
    except ValueError as error:
        raise ConfigError(f"convert: {error}") from None
    except OSError as error:  # a folder this user cannot write in, a disk that is full
        if (
            not existed
        ):  # nothing half-written is left to look complete (convert_to_mds removes what it began)
            shutil.rmtree(out, ignore_errors=True)
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


def _check_no_input_inside(out: Path, config: str | os.PathLike[str], cfg: Any) -> None:
    """Refuse an ``out`` holding a path this convert reads or writes besides it: the config file, or a path the
    config names (the data files, their cache, a tokenizer, a streaming source or its cache, the run directory).
    ``--overwrite`` would delete it, and a cache written there would make ``out`` exist before the shards."""
    from omegaconf import OmegaConf

    target = out.resolve()
    named = [("the config", str(config)), *_strings(OmegaConf.to_container(cfg, resolve=True))]
    for key, value in named:
        if "://" in value:
            continue
        try:
            path = Path(value).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):  # not a path
            continue
        if path == target or target in path.parents:
            raise OutputError(
                f"--to mds {str(out)!r}: {key} {value!r} is that folder or inside it, and convert replaces the folder with its "
                "shards; give another folder."
            )


def _strings(value: Any, key: str = "") -> list[tuple[str, str]]:
    """Every string of a config container with its dotted key."""
    if isinstance(value, dict):
        return [
            found for name, item in value.items() for found in _strings(item, f"{key}.{name}".lstrip("."))
        ]
    if isinstance(value, list):
        return [found for i, item in enumerate(value) for found in _strings(item, f"{key}.{i}")]
    return [(key, value)] if isinstance(value, str) and value else []


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
