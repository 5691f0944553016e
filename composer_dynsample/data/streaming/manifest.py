"""The manifest of a converted data set: what a reader needs before it reads any shard.

A converted data set is a folder (local, or uploaded as is to object storage)::

    OUT/manifest.json          the row counts, label counts, what the rows are, and the hash of the rest
    OUT/tokenizer.json         texts: the tokenizer the ids come from (passage_tokenizer.json for a second)
    OUT/train/index.json       MosaicML Streaming's index of the split's MDS shards
    OUT/train/shard.00000.mds.zstd ...
    OUT/train/rows.npz         the split's per-row arrays: labels, and for texts which rows are queries,
                               their text hashes and lengths, the given negatives (CSR)
    OUT/test/...

``rows.npz`` is what every sampler reads (labels, which rows are passages, duplicate texts), so building a
sampler downloads the manifest and it, never a shard. The manifest's ``sha256`` covers the other files of
the manifest and each split's ``index.json`` (whose entries carry each shard's own hashes), so a reader
knows the folder it reads is the one converted, whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from composer_dynsample.file_checks import file_sha256

__all__ = [
    "FORMAT",
    "LOCAL_INFO",
    "MANIFEST",
    "SPLITS",
    "StreamingDataError",
    "fetch",
    "join_remote",
    "manifest_digest",
    "parse_bytes",
    "read_manifest",
    "read_rows",
    "write_json",
]

FORMAT = "composer-dynsample-mds"
VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "test")
#: The fields of a text data set's ``TextInfo`` that describe this machine's copy, not the data: the manifest
#: records every other one, and a reader sets these to its own cache.
LOCAL_INFO = ("tokenizer_path", "cache_dirs", "from_cache")


class StreamingDataError(ValueError):
    """A converted data set that cannot be read: a missing or corrupt file, a remote gone, a mismatch."""


def join_remote(remote: str, *parts: str) -> str:
    """``remote`` (a URL such as ``s3://bucket/prefix`` or a local folder) joined with ``parts``."""
    if "://" in remote:
        return "/".join([remote.rstrip("/"), *parts])
    return str(Path(remote, *parts))


def write_json(path: Path, body: dict[str, Any]) -> None:
    """Write ``body`` as JSON atomically (a reader never sees a partial file)."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump(body, handle, indent=1, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def parse_bytes(name: str, value: int | str, *, minimum: int) -> int:
    """``value`` (bytes, or a size such as ``"64mb"``) as bytes, at least ``minimum``.

    Raises:
        ValueError: One line naming ``name``, the value and what is expected.
    """
    from streaming.base.util import bytes_to_int

    try:
        size = bytes_to_int(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        size = None
    if size is None or size < minimum:
        raise ValueError(
            f"{name} {value!r}: give bytes (at least {minimum}) or a size such as '64mb' or '50gb'."
        )
    return int(size)


def manifest_digest(body: dict[str, Any]) -> str:
    """The hash of a manifest: of its entries (``sha256`` left out), which name every other file's hash."""
    rest = {key: value for key, value in body.items() if key != "sha256"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def fetch(remote: str, name: str, local: Path, *, retries: int, timeout: float) -> Path:
    """Download ``remote/name`` into ``local/name`` (a local remote is copied), retrying ``retries`` times.

    Uses MosaicML Streaming's downloader, so every remote it reads (S3 and S3-compatible stores through
    ``S3_ENDPOINT_URL``, GCS, Azure, OCI, local paths) works here too.

    Raises:
        StreamingDataError: One line naming the remote file and the attempts, when every attempt failed.
    """
    from streaming.base.storage import CloudDownloader

    source, target = join_remote(remote, *name.split("/")), local / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if "://" not in remote and not Path(source).is_file():
        raise StreamingDataError(f"{source}: no such file; is {remote} a folder written by convert --to mds?")
    error: BaseException | None = None
    for attempt in range(retries + 1):
        partial = target.with_name(f"{target.name}.{os.getpid()}.part")
        try:
            if "://" in remote:
                CloudDownloader.direct_download(source, str(partial), timeout)
            else:
                shutil.copyfile(source, partial)
            os.replace(partial, target)
            return target
        except Exception as caught:  # botocore, OSError, TimeoutError, ...: all end the same way
            error = caught
            partial.unlink(missing_ok=True)
            if attempt < retries:
                time.sleep(min(0.5 * 2**attempt, 4.0))
    first = str(error).strip().splitlines()[0] if error is not None and str(error).strip() else ""
    raise StreamingDataError(
        f"{source}: could not download it after {retries + 1} attempts ({type(error).__name__}: {first})."
    )


def read_manifest(remote: str, local: Path, *, retries: int, timeout: float) -> dict[str, Any]:
    """Download and check ``remote/manifest.json``: its format, version and hash.

    Raises:
        StreamingDataError: If it cannot be downloaded (a local folder holding a split but no manifest is a
            convert that did not finish), is not a manifest of this format, or its hash does not match its
            entries.
    """
    if "://" not in remote and not Path(remote, MANIFEST).exists() and Path(remote, SPLITS[0]).is_dir():
        raise StreamingDataError(
            f"{join_remote(remote, MANIFEST)}: no such file, so {remote} is a convert that did not finish (stopped "
            "midway, or still writing); run convert again with --overwrite."
        )
    path = fetch(remote, MANIFEST, local, retries=retries, timeout=timeout)
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise StreamingDataError(f"{join_remote(remote, MANIFEST)}: not JSON ({error}).") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise StreamingDataError(
            f"{join_remote(remote, MANIFEST)}: not a manifest written by composer-dynsample convert --to mds."
        )
    if body.get("version") != VERSION:
        raise StreamingDataError(
            f"{join_remote(remote, MANIFEST)}: format version {body.get('version')}, this reader reads "
            f"{VERSION}; convert the data again with this version."
        )
    if body.get("sha256") != manifest_digest(body):
        raise StreamingDataError(f"{join_remote(remote, MANIFEST)}: its hash does not match its entries.")
    return body


def read_rows(
    remote: str, split: str, entry: dict[str, Any], local: Path, *, retries: int, timeout: float
) -> dict[str, np.ndarray]:
    """Download a split's ``rows.npz`` and ``index.json``, check both against the manifest, load the rows.

    Raises:
        StreamingDataError: If a file cannot be downloaded or its SHA-256 is not the manifest's.
    """
    for name, key in (("rows.npz", "rows_sha256"), ("index.json", "index_sha256")):
        path = fetch(remote, f"{split}/{name}", local, retries=retries, timeout=timeout)
        if file_sha256(path) != entry[key]:
            raise StreamingDataError(
                f"{join_remote(remote, split, name)}: its SHA-256 is not the manifest's; the folder was "
                "changed after convert wrote it (convert again, or upload the whole folder)."
            )
    with np.load(local / split / "rows.npz") as loaded:
        return {key: loaded[key] for key in loaded.files}
