"""``data: {name: streaming, remote: ..., local: ..., cache_limit: ...}``: a converted data set read by index.

:func:`load_streaming` reads the manifest and each split's per-row arrays (labels, queries, text hashes,
lengths, given negatives), checks them against the manifest's hashes and returns the same
:class:`~composer_dynsample.data.text.TextSplits` (or :class:`~composer_dynsample.data.DatasetSplits`) the
file's loader returned, whose stores read their rows from the shards
(:mod:`~composer_dynsample.data.streaming.shards`). Samplers are built from the manifest alone: no shard is
downloaded until a batch needs one.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from composer_dynsample.data.splits import DatasetSplits, default_cache_dir
from composer_dynsample.data.streaming.cache_owner import claim_cache
from composer_dynsample.data.streaming.manifest import (
    MANIFEST,
    SPLITS,
    StreamingDataError,
    fetch,
    join_remote,
    parse_bytes,
    read_manifest,
    read_rows,
)
from composer_dynsample.data.streaming.shards import (
    StreamingFeatures,
    StreamingTokens,
    check_open,
    open_reader,
)
from composer_dynsample.validation import check_float, check_int

__all__ = ["load_streaming"]

HASHES = ("xxh3_64", "sha1", None)
_PAIR_COLUMNS = ("anchor", "positive", "negative")


def load_streaming(
    remote: str,
    local: str | os.PathLike[str] | None = None,
    *,
    cache_limit: int | str | None = None,
    download_retry: int = 2,
    download_timeout: float = 60.0,
    validate_hash: str | None = "xxh3_64",
    tokenizer: str | os.PathLike[str] | None = None,
    passage_tokenizer: str | os.PathLike[str] | None = None,
    max_length: int | None = None,
    run_prompts: Mapping[str, str] | str | None = None,
) -> DatasetSplits:
    """The data set ``composer-dynsample convert --to mds`` wrote to ``remote``, its rows read by index.

    Args:
        remote (str): The converted folder: ``s3://bucket/prefix`` (an S3-compatible store through
            ``S3_ENDPOINT_URL``), ``gs://``, ``azure://``, ``oci://`` or a local path.
        local (str | os.PathLike, optional): This node's cache folder; every rank of a node gives the same
            one, never the converted folder itself, and one run uses it at a time (another run's is refused:
            :mod:`~composer_dynsample.data.streaming.cache_owner`). Shards cached from another conversion of
            ``remote`` (a manifest of another hash) are removed first. Default:
            ``~/.cache/composer_dynsample/streaming/<hash of remote>``.
        cache_limit (int | str, optional): The most bytes of shards the cache holds, e.g. ``"50gb"`` (at
            least four shards); the coldest shard is evicted first. Default: ``None`` (no limit).
        download_retry (int): Attempts after the first for each file. Default: ``2``.
        download_timeout (float): Seconds a file's download may take. Default: ``60``.
        validate_hash (str, optional): Check each shard on download: ``xxh3_64`` (default), ``sha1`` or
            ``None``.
        tokenizer (str | os.PathLike, optional): The tokenizer a run expects (its own, or its model
            folder's): checked against the one the shards' ids come from (by SHA-256).
        passage_tokenizer (str | os.PathLike, optional): Given when the run's towers tokenize otherwise:
            the shards must then hold each row's ids by its tower's tokenizer (checked that they were
            converted with two; the passage tokenizer itself is not recorded).
        max_length (int, optional): The ``max_length`` a run expects, checked the same way.
        run_prompts (Mapping[str, str] | str, optional): The prompts the run's model folder gives a file
            run's texts (by column, or one for every column; ``{}``: none), checked against those the texts
            were converted with. Default: ``None`` (not checked).

    Returns:
        DatasetSplits: :class:`~composer_dynsample.data.text.TextSplits` of texts, or splits of features.

    Raises:
        StreamingDataError: One line: an option out of range (a ``cache_limit`` below four shards names the
            least), a ``local`` that is a file, the converted folder's or another run's cache now, a file
            missing, corrupt or not downloadable (naming it and the attempts), or a tokenizer or
            ``max_length`` other than the shards', or other prompts than ``run_prompts``.
    """
    if not isinstance(remote, str) or not remote:
        raise StreamingDataError(f"data.remote must be a URL or a folder, got {remote!r}.")
    options = _check_options(download_retry, download_timeout, validate_hash, cache_limit)
    if "://" not in remote:
        remote = os.path.abspath(os.path.expanduser(remote))
    folder = _cache_folder(remote, local)
    claim_cache(folder, remote)  # another run's cache is refused before anything in it changes
    manifest = read_manifest(remote, folder, **options)
    check_open(remote, folder, manifest["sha256"])  # nor this process's reader of another
    _forget_other_shards(folder, manifest["sha256"])
    rows = {split: read_rows(remote, split, manifest["splits"][split], folder, **options) for split in SPLITS}
    if cache_limit is not None:
        _check_cache_limit(remote, folder, cache_limit)
    readers = {
        split: open_reader(
            remote,
            split,
            folder,
            digest=manifest["sha256"],
            cache_limit=cache_limit,
            validate_hash=validate_hash,
            **options,
        )
        for split in SPLITS
    }
    common = {
        "num_classes": int(manifest["num_classes"]),
        "name": manifest["name"],
        "test_name": manifest["test_name"],
        "class_names": manifest["class_names"],
    }
    if manifest["kind"] == "features":
        stores = {
            split: StreamingFeatures(
                readers[split], rows[split]["labels"], manifest["splits"][split]["feature_shape"],
                manifest["splits"][split]["feature_dtype"],
            )
            for split in SPLITS
        }  # fmt: skip
        return DatasetSplits(stores["train"], stores["test"], **common)
    return _text_splits(
        remote, folder, manifest, rows, readers, common, options, tokenizer, passage_tokenizer, max_length,
        run_prompts,
    )  # fmt: skip


def _check_options(
    download_retry: object, download_timeout: object, validate_hash: object, cache_limit: object
) -> dict[str, Any]:
    """The download options checked (the cache limit too), as :func:`fetch` takes them."""
    try:
        retries = check_int("data.download_retry", download_retry, minimum=0)
        timeout = check_float("data.download_timeout", download_timeout, minimum=0, strict_minimum=True)
        if cache_limit is not None:
            parse_bytes("data.cache_limit", cache_limit, minimum=1)  # type: ignore[arg-type]
    except ValueError as error:
        raise StreamingDataError(str(error)) from None
    if validate_hash not in HASHES:
        raise StreamingDataError(f"data.validate_hash must be one of {HASHES}, got {validate_hash!r}.")
    return {"retries": retries, "timeout": timeout}


def _check_cache_limit(remote: str, folder: Path, cache_limit: int | str) -> None:
    """Refuse a ``cache_limit`` below what Streaming needs of each split's cache: its ``index.json`` and four
    of its largest shard (decompressed and compressed copies together).

    Raises:
        StreamingDataError: One line naming ``data.cache_limit`` and the least it may be.
    """
    limit = parse_bytes("data.cache_limit", cache_limit, minimum=1)
    needs = {}
    for split in SPLITS:
        index = folder / split / "index.json"
        sizes = [
            shard["raw_data"]["bytes"] + ((shard.get("zip_data") or {}).get("bytes") or 0)
            for shard in json.loads(index.read_text())["shards"]
        ]
        needs[split] = max(4 * max(sizes, default=0), index.stat().st_size + 1)
    short = [split for split in SPLITS if limit < needs[split]]
    if short:
        raise StreamingDataError(
            f"{join_remote(remote, short[0])}: data.cache_limit {cache_limit!r} ({limit} bytes) is below the cache "
            f"limit its shards need: give at least {max(needs.values())} bytes (four times the largest shard of "
            "either split, decompressed and compressed; each split's cache holds up to the limit), or leave it out."
        )


def _cache_folder(remote: str, local: str | os.PathLike[str] | None) -> Path:
    """The cache folder, made: ``local``, or one of the default cache's named by ``remote``'s hash.

    Raises:
        StreamingDataError: If ``local`` is a file, or is ``remote`` (a local folder), inside it or holds it
            where a split's shards are cached: the cache writes and removes files there, so it would change
            the converted data.
    """
    if local is None:
        folder = (
            default_cache_dir() / "streaming" / hashlib.blake2s(remote.encode(), digest_size=8).hexdigest()
        )
    else:
        folder = Path(os.path.abspath(Path(local).expanduser()))
    if "://" not in remote:
        source, cache = Path(remote).resolve(), folder.resolve()
        written = [cache / split for split in SPLITS]  # the cache's shard folders
        if (
            cache == source
            or source in cache.parents
            or any(w == source or w in source.parents for w in written)
        ):
            raise StreamingDataError(
                f"data.local {str(folder)!r} is data.remote {remote!r}, inside it or holds it as a split folder: "
                "the cache writes and removes shards there and would change the converted data; give another "
                "local folder, or leave it out."
            )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise StreamingDataError(
            f"data.local {str(folder)!r}: it, or a folder above it, is a file; give a folder for the cache."
        ) from None
    return folder


def _forget_other_shards(folder: Path, digest: str) -> None:
    """Remove the cached shards of another conversion than the manifest's (``remote`` converted again), so
    none is read for this one's: the cache records the manifest its shards come from in ``shards.sha256``."""
    marker = folder / "shards.sha256"
    try:
        if marker.read_text().strip() == digest:
            return
    except FileNotFoundError:
        pass
    for split in SPLITS:
        for path in (folder / split).glob("shard.*"):
            path.unlink(missing_ok=True)
    partial = marker.with_name(f"{marker.name}.{os.getpid()}.part")
    partial.write_text(digest)
    os.replace(partial, marker)  # the ranks of a node share the folder: none reads half a marker


def _check_prompts(remote: str, recorded: dict[str, str], expected: Any, columns: tuple[str, ...]) -> None:
    """Refuse texts converted with other prompts than ``expected`` (the run's model folder's default prompt),
    column by column (a negative without its own prompt takes the positive's); texts converted with prompts
    for a folder without a default (the prompts named at conversion) are taken, with a note.

    Raises:
        StreamingDataError: One line naming both and how to make them agree.
    """
    from composer_dynsample.data.text.prompts import column_prompt

    def by_column(prompts: Any) -> dict[str, str]:
        prompts = dict.fromkeys(columns, prompts) if isinstance(prompts, str) else prompts
        return {column: prompt for column in columns if (prompt := column_prompt(prompts, column))}

    shards, run = by_column(recorded), by_column(expected)
    if shards == run:
        return
    if not run:  # prompts chosen at conversion (data.prompts, prompt_names) where the folder sets no default
        warnings.warn(
            f"{join_remote(remote, MANIFEST)}: the texts carry the prompts {json.dumps(shards, ensure_ascii=False)} "
            "they were converted with; the run's model folder sets no default prompt.",
            stacklevel=2,
        )
        return
    said = {key: json.dumps(value, ensure_ascii=False) for key, value in (("shards", shards), ("run", run))}
    raise StreamingDataError(
        f"{join_remote(remote, MANIFEST)}: the texts were tokenized "
        + (f"with the prompts {said['shards']}" if shards else "without prompts")
        + ", but the run's model folder (model.encoder.path, its default_prompt_name) gives "
        + (said["run"] if run else "none")
        + ", so the run on the file would read other texts; convert again with this run's model folder, or "
        "train with the folder the shards were converted with."
    )


def _text_splits(
    remote: str,
    folder: Path,
    manifest: dict[str, Any],
    rows: dict[str, dict[str, np.ndarray]],
    readers: dict[str, Any],
    common: dict[str, Any],
    options: dict[str, Any],
    tokenizer: Any,
    passage_tokenizer: Any,
    max_length: int | None,
    run_prompts: Any = None,
) -> Any:
    from composer_dynsample.data.text.store import TextInfo, TextSplits, TextStore
    from composer_dynsample.data.text.tokenizer import load_tokenizer

    info = manifest["info"]
    path = fetch(remote, "tokenizer.json", folder, **options)
    found = None if tokenizer is None else load_tokenizer(tokenizer).sha256
    if found is not None and found != info["tokenizer_sha256"]:
        raise StreamingDataError(
            f"{join_remote(remote, MANIFEST)}: the texts were tokenized by another tokenizer than {tokenizer} "
            f"(SHA-256 {info['tokenizer_sha256'][:12]}, the run's {found[:12]}); convert the data again with "
            f"data.tokenizer: {tokenizer}."
        )
    if max_length is not None and int(max_length) != int(info["max_length"]):
        raise StreamingDataError(
            f"{join_remote(remote, MANIFEST)}: the texts were tokenized to max_length {info['max_length']}, the "
            f"run asks for {max_length}; convert again with data.max_length={max_length}, or leave it out."
        )
    passage_pad = manifest.get("passage_pad_id")
    if passage_tokenizer is not None and passage_pad is None:
        raise StreamingDataError(
            f"{join_remote(remote, MANIFEST)}: the texts were tokenized by one tokenizer, the run's towers read two; "
            "convert again from a config with the passage tower's folder."
        )
    if run_prompts is not None:
        pairs = any(bool(rows[split]["is_query"].any()) for split in SPLITS)
        _check_prompts(remote, info.get("prompts") or {}, run_prompts, _PAIR_COLUMNS if pairs else ("text",))
    stores = {}
    for split in SPLITS:
        arrays = rows[split]
        tokens = StreamingTokens(
            readers[split], arrays["text_hash"], arrays["lengths"],
            {"max_length": info["max_length"], "num_truncated": info["num_truncated"] if split == "train" else 0},
        )  # fmt: skip
        stores[split] = TextStore(
            tokens,
            np.arange(len(arrays["row_labels"]), dtype=np.int64),
            arrays["row_labels"],
            pad_id=info["pad_id"],
            vocab_size=info["vocab_size"],
            num_sampled=int(arrays["num_sampled"]),
            is_query=arrays["is_query"],
            negatives=(arrays["negative_offsets"], arrays["negative_rows"]),
            source_rows=arrays["source_rows"],
            prompt_lengths=arrays.get("prompt_lengths"),
            passage_tokens=tokens if passage_pad is not None else None,
            passage_pad_id=passage_pad,
        )
    text_info = TextInfo(
        **{name: tuple(value) if isinstance(value, list) else value for name, value in info.items()},
        tokenizer_path=path,  # the LOCAL_INFO fields: this node's copy
        cache_dirs=tuple(folder / split for split in SPLITS),
        from_cache=(True, True),
    )
    return TextSplits(
        stores["train"], stores["test"], info=text_info, test_protocol=manifest["test_protocol"], **common
    )
