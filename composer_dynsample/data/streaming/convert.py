"""Write a loaded data set's splits as MosaicML Streaming MDS shards, with the manifest a reader needs.

:func:`convert_to_mds` takes what any loader returns (:class:`~composer_dynsample.data.text.TextSplits` of
pairs or labelled texts, or :class:`~composer_dynsample.data.DatasetSplits` of features or images) and
writes each split's rows in order, so row ``i`` of a split read back is row ``i`` of the split loaded
from its file, and every sampler draws the same batches from either. A text row's MDS sample::

    {"input_ids": bytes (little-endian uint32, its tower's tokenizer), "label": int64,
     "text_hash": int64, "is_query": int8}

and a features row's ``{"features": bytes (the split's dtype and feature shape), "label": int64}``. The
texts are already tokenized (the tokenizer's JSON goes beside the shards); the rows stream from the
memory-mapped token store chunk by chunk into ``MDSWriter``, so the corpus is never held in memory.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from composer_dynsample.data.splits import DatasetSplits
from composer_dynsample.data.streaming.manifest import (
    FORMAT,
    LOCAL_INFO,
    MANIFEST,
    SPLITS,
    VERSION,
    manifest_digest,
    parse_bytes,
    write_json,
)
from composer_dynsample.file_checks import file_sha256

__all__ = ["CODECS", "WRITTEN", "check_options", "check_replaceable", "convert_to_mds"]

#: The compressions a shard may take (``zstd`` also as ``zstd:LEVEL``).
CODECS = ("zstd", "br", "gz", "snappy")
_CHUNK = 4096  # rows read from the token store at once
TEXT_COLUMNS = {"input_ids": "bytes", "label": "int64", "text_hash": "int64", "is_query": "int8"}
FEATURE_COLUMNS = {"features": "bytes", "label": "int64"}
#: The entries of a converted folder.
WRITTEN = (MANIFEST, "tokenizer.json", *SPLITS)


def convert_to_mds(
    splits: DatasetSplits,
    out: str | os.PathLike[str],
    *,
    shard_size: int | str = "64mb",
    compression: str | None = "zstd",
    overwrite: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> Path:
    """Write ``splits`` to ``out``: each split's MDS shards and rows, the tokenizer, the manifest.

    The manifest is written last, so a folder whose writing stopped midway (a process killed) has none and
    is refused by every reader; one whose writing failed or was interrupted (``KeyboardInterrupt``) is
    removed.

    Args:
        splits (DatasetSplits): What a loader returned (texts or features).
        out (str | os.PathLike): A folder to create (upload it whole to object storage afterwards).
        shard_size (int | str): The largest shard before compression, bytes or ``"64mb"``. Default:
            ``"64mb"``.
        compression (str, optional): ``zstd`` (default), ``zstd:LEVEL``, ``br``, ``gz``, ``snappy`` or
            ``None`` (see :func:`check_options`).
        overwrite (bool): Replace ``out`` when it exists and holds only what a convert writes. Default:
            ``False``.
        progress (Callable, optional): Called as ``progress(split, rows_written, rows)`` after each chunk.

    Returns:
        Path: ``out``.

    Raises:
        FileExistsError: If ``out`` exists and ``overwrite`` is false, or it holds other files.
        ValueError: If an option is wrong.
    """
    size, compression = check_options(shard_size, compression)
    out = Path(out)
    exists = f"{out} exists; give another folder, or --overwrite to replace it."
    if out.exists():
        if not overwrite:
            raise FileExistsError(exists)
        check_replaceable(out)
        (out / MANIFEST).unlink(missing_ok=True)  # a removal stopped midway leaves no folder that looks whole
        shutil.rmtree(out)
    try:
        out.mkdir(parents=True)
    except FileExistsError:  # another convert made it meanwhile: it is that one's
        raise FileExistsError(exists) from None
    try:
        _write(splits, out, size, compression, progress)
    except BaseException:  # an error, Ctrl-C: nothing half-written is left to look complete
        shutil.rmtree(out, ignore_errors=True)
        raise
    return out


def check_options(
    shard_size: int | str, compression: str | None, *, names: tuple[str, str] = ("shard_size", "compression")
) -> tuple[int, str | None]:
    """The shard size in bytes and the compression of :func:`convert_to_mds`, checked before anything is read.

    Args:
        shard_size (int | str): Bytes (at least 1024) or a size such as ``"64mb"``.
        compression (str, optional): One of :data:`CODECS`, ``zstd``, ``br`` and ``gz`` also as
            ``NAME:LEVEL``; ``None`` or ``"none"`` for none.
        names (tuple[str, str]): What the caller calls the two options, for the messages.

    Returns:
        tuple[int, str | None]: The shard size in bytes and the compression (``None`` for none).

    Raises:
        ValueError: One line naming the option, its value and the values it takes.
    """
    from streaming.base.compression import get_compressions

    if isinstance(compression, str) and compression.lower() == "none":
        compression = None
    if compression is not None and (
        not isinstance(compression, str)
        or compression not in get_compressions()
        or compression.split(":")[0] not in CODECS
    ):
        raise ValueError(
            f"{names[1]} {compression!r}: give zstd, zstd:LEVEL (1 to 22), br, br:LEVEL (0 to 11), gz, "
            "gz:LEVEL (0 to 9), snappy or none."
        )
    return parse_bytes(names[0], shard_size, minimum=1 << 10), compression


def check_replaceable(out: Path) -> None:
    """Refuse to replace a folder holding anything a convert does not write (:data:`WRITTEN`).

    Raises:
        FileExistsError: Naming the first such entry of ``out``.
    """
    foreign = sorted(
        entry.name
        for entry in out.iterdir()
        if entry.name not in WRITTEN and not entry.name.startswith(f"{MANIFEST}.")  # write_json's temporary
    )
    if foreign:
        raise FileExistsError(
            f"{out} holds {foreign[0]!r}, which convert does not write: --overwrite replaces only a folder "
            "convert wrote; give a new folder."
        )


def _write(
    splits: DatasetSplits,
    out: Path,
    size: int,
    compression: str | None,
    progress: Callable[[str, int, int], None] | None,
) -> None:
    """Write the splits' shards, rows and tokenizer into the new folder ``out``, then the manifest."""
    from streaming import MDSWriter

    text = hasattr(splits, "info")
    body: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "kind": "text" if text else "features",
        "name": splits.name,
        "test_name": splits.test_name,
        "num_classes": int(splits.num_classes),
        "class_names": None if splits.class_names is None else list(splits.class_names),
        "shard_size": size,
        "compression": compression,
        "splits": {},
    }
    if text:
        body.update(_text_info(splits, out))
    for name in SPLITS:
        store = getattr(splits, name)
        folder = out / name
        columns = TEXT_COLUMNS if text else FEATURE_COLUMNS
        with MDSWriter(
            out=str(folder),
            columns=columns,
            compression=compression,
            hashes=["sha1", "xxh3_64"],
            size_limit=size,
        ) as writer:
            rows = (
                _write_text(store, writer, name, progress)
                if text
                else _write_features(store, writer, name, progress)
            )
        np.savez(folder / "rows.npz", **rows)
        labels = rows["row_labels"][: int(rows["num_sampled"])] if text else rows["labels"]
        values, counts = np.unique(labels, return_counts=True)
        body["splits"][name] = {
            "rows": len(rows["row_labels"] if text else rows["labels"]),
            "sampled": int(rows["num_sampled"]) if text else len(labels),
            "labels": len(values),
            "rows_per_label": [int(counts.min()), int(counts.max())] if len(counts) else [0, 0],
            "shards": len(list(folder.glob("shard.*"))),
            "rows_sha256": file_sha256(folder / "rows.npz"),
            "index_sha256": file_sha256(folder / "index.json"),
        }
        if not text:
            body["splits"][name]["feature_shape"] = list(store.feature_shape)
            body["splits"][name]["feature_dtype"] = store.features.numpy().dtype.str
    body["sha256"] = manifest_digest(body)
    write_json(out / MANIFEST, body)


def _text_info(splits: Any, out: Path) -> dict[str, Any]:
    """The manifest's entries of a text data set; writes its tokenizer(s) beside it."""
    info = splits.info
    info.load_tokenizer().tokenizer.save(str(out / "tokenizer.json"))
    fields = [field.name for field in dataclasses.fields(info) if field.name not in LOCAL_INFO]
    entries: dict[str, Any] = {
        "test_protocol": splits.test_protocol,
        "info": {name: _plain(getattr(info, name)) for name in fields},
    }
    store = splits.train
    if store.passage_tokens is not None:
        entries["passage_pad_id"] = int(store.passage_pad_id)
    return entries


def _plain(value: Any) -> Any:
    """``value`` as JSON holds it: tuples as lists, numpy scalars (a label name) as Python ones."""
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value.item() if isinstance(value, np.generic) else value


def _write_text(store: Any, writer: Any, split: str, progress: Callable | None) -> dict[str, np.ndarray]:
    """Write a :class:`TextStore`'s rows, each with its tower's token ids; return its per-row arrays."""
    num_rows = store.num_rows
    two = store.passage_tokens is not None
    for start in range(0, num_rows, _CHUNK):
        rows = np.arange(start, min(start + _CHUNK, num_rows))
        for row in rows.tolist():
            tokens = store.passage_tokens if two and not store.is_query[row] else store.tokens
            writer.write(
                {
                    "input_ids": np.asarray(tokens.row(int(store.text_ids[row])), dtype="<u4").tobytes(),
                    "label": int(store.row_labels[row]),
                    "text_hash": int(store.text_hash[row]),
                    "is_query": int(store.is_query[row]),
                }
            )
        if progress is not None:
            progress(split, int(rows[-1]) + 1, num_rows)
    arrays = {
        "num_sampled": np.asarray(len(store), np.int64),
        "row_labels": store.row_labels,
        "is_query": store.is_query,
        "text_hash": np.asarray(store.text_hash, np.int64),
        "lengths": store.lengths(np.arange(num_rows)).astype(np.int32),
        "negative_offsets": store.negative_offsets,
        "negative_rows": store.negative_rows,
        "source_rows": store.source_rows,
    }
    if store.prompt_lengths is not None:
        arrays["prompt_lengths"] = store.prompt_lengths
    return arrays


def _write_features(store: Any, writer: Any, split: str, progress: Callable | None) -> dict[str, np.ndarray]:
    """Write a :class:`TensorStore`'s rows as bytes of their dtype; return its labels."""
    num_rows = len(store)
    for start in range(0, num_rows, _CHUNK):
        chunk = store.features[start : start + _CHUNK].numpy()
        labels = store.labels[start : start + _CHUNK].tolist()
        for features, label in zip(chunk, labels):
            writer.write({"features": np.ascontiguousarray(features).tobytes(), "label": int(label)})
        if progress is not None:
            progress(split, min(start + _CHUNK, num_rows), num_rows)
    return {"labels": store.labels.numpy()}
