"""A split's MDS shards read by index through MosaicML Streaming, behind the stores every sampler and collate use.

:class:`ShardReader` opens one split with ``StreamingDataset`` and reads rows with its random access
(``prepare_shard``, then the rows sliced at their offsets from the shard's memory-mapped file, as ``get_item``
reads them from the file): a row's shard is downloaded into the node's ``local`` cache the first time a batch needs
it (bounded by ``cache_limit``, the coldest shard evicted first), so a rank downloads only the shards its
batches touch. The sample order is never ``StreamingDataset``'s: the samplers choose the indices, as
they do for a file, and ``StreamingDataset`` only serves them.

Two stores wrap it, so the index-only dataset and the gathering collates are the ones of every source:

- :class:`StreamingTokens`, a :class:`~composer_dynsample.data.text.tokenized.TokenStore` whose "texts"
  are the split's rows (each row's ids by its tower's tokenizer), under a
  :class:`~composer_dynsample.data.text.TextStore` built from the manifest's per-row arrays;
- :class:`StreamingFeatures`, a :class:`~composer_dynsample.data.TensorStore` whose ``gather`` reads
  the rows of a batch.

A shard that cannot be downloaded (missing, the server gone) or fails its hash check is one
:class:`~composer_dynsample.data.streaming.manifest.StreamingDataError` line naming the shard's remote
path and the attempts made, and the shard is marked remote again, so no other reader waits on it.
DataLoader workers (``num_workers > 0``) collate the next batches while the current step runs: that is
what overlaps a shard's download with training.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from composer_dynsample.data.store import TensorStore
from composer_dynsample.data.streaming.cache_owner import release_caches
from composer_dynsample.data.streaming.locks import hold_locks_until_exit
from composer_dynsample.data.streaming.manifest import SPLITS, StreamingDataError, join_remote
from composer_dynsample.data.text.tokenized import TokenStore, pad_spans

__all__ = [
    "ShardReader",
    "StreamingFeatures",
    "StreamingTokens",
    "check_open",
    "close_readers",
    "open_reader",
]

#: Tries at registering a reader's shared memory: two processes starting a StreamingDataset at the same moment
#: can pick one free prefix, and the later one's registration fails with FileExistsError.
_PREFIX_ATTEMPTS = 5
_OPEN: dict[str, ShardReader] = {}  # local split folder -> its reader: StreamingDataset allows one per folder
_LOCK = threading.Lock()
_MAPPED = 64  # shard files kept mapped per reader and process (address space; a batch touches many)


class ShardReader:
    """One split's shards through ``StreamingDataset``'s random access; picklable (DataLoader workers).

    Args:
        remote (str): The converted folder (``s3://bucket/prefix``, any remote Streaming reads, or a path).
        split (str): ``"train"`` or ``"test"``.
        local (Path): The node's cache folder for the data set (the split's shards go in ``local/split``).
        cache_limit (int | str, optional): The most bytes of shards the cache holds (``"50gb"``).
        retries (int): Download attempts after the first. timeout (float): Seconds a download may take.
        validate_hash (str, optional): Check each downloaded shard against its hash in ``index.json``.
    """

    def __init__(
        self,
        remote: str,
        split: str,
        local: Path,
        *,
        cache_limit: int | str | None,
        retries: int,
        timeout: float,
        validate_hash: str | None,
        digest: str | None = None,
    ) -> None:
        from streaming import StreamingDataset

        self.remote, self.split, self.retries = remote, split, retries
        self.digest = digest  # the manifest hash of the conversion read
        options = {
            "remote": join_remote(remote, split), "local": str(local / split), "cache_limit": cache_limit,
            "download_retry": retries + 1,  # Streaming counts every attempt, the first too
            "download_timeout": timeout, "validate_hash": validate_hash, "batch_size": 1,
        }  # fmt: skip
        try:
            for attempt in range(_PREFIX_ATTEMPTS):
                try:
                    self.dataset = StreamingDataset(**options)
                    break
                except FileExistsError:  # another process took the same shared-memory prefix at once
                    if attempt == _PREFIX_ATTEMPTS - 1:
                        raise
                    time.sleep(0.05 * (attempt + 1))  # its prefix is registered now: the next search skips it
        except ValueError as error:  # cache_limit too small for the shards, a bad option
            text = str(error).strip().splitlines()[0]
            if text.startswith("Reused local directory"):  # another live StreamingDataset's folder
                text = (
                    f"data.local {str(local)!r}: another reader (of this process, or of another run) still "
                    f"holds its {split} folder; give this run another data.local, or wait for that run to end."
                )
            raise StreamingDataError(f"{join_remote(remote, split)}: {text}") from None
        hold_locks_until_exit(self.dataset)  # Streaming's lock files in the temp folder go when the run ends
        self.num_rows = self.dataset.num_samples
        self._starts = np.concatenate([[0], np.cumsum(self.dataset.samples_per_shard)]).astype(np.int64)
        stream = self.dataset.streams[0]
        folder = os.path.join(stream.local, stream.split or "")
        #: Where each shard's decompressed file is in the cache.
        self._paths = [os.path.join(folder, shard.file_pairs[0][0].basename) for shard in self.dataset.shards]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({join_remote(self.remote, self.split)!r}, num_rows={self.num_rows})"

    def shard_ids(self, rows: np.ndarray) -> np.ndarray:
        """The shard each of ``rows`` lives in."""
        return np.searchsorted(self._starts, np.asarray(rows, dtype=np.int64), side="right") - 1

    def column(self, rows: np.ndarray, name: str) -> list[bytes]:
        """Column ``name`` of ``rows``, downloading the shards they live in when the cache lacks them.

        Rows are read shard by shard: a shard missing from the cache is prepared once (downloaded, the
        shards of one call in parallel, and decompressed) through ``StreamingDataset.prepare_shard``, then
        its rows are sliced from the memory-mapped file at their offsets (:meth:`_read`).
        """
        rows = np.asarray(rows, dtype=np.int64)
        shards = self.shard_ids(rows)
        touched = np.unique(shards).tolist()
        take = _column_taker(self.dataset.shards[0], name)  # one writer: every shard has the same columns
        try:
            self._prepare([shard for shard in touched if not os.path.isfile(self._paths[shard])])
            found: list[Any] = [None] * len(rows)
            for shard in touched:
                at = np.flatnonzero(shards == shard)
                for position, data in zip(at.tolist(), self._read(shard, rows[at] - self._starts[shard])):
                    found[position] = take(data)
            return found
        except Exception as error:  # botocore, OSError, ValueError (hash), RuntimeError: one line each
            raise self._failure(rows, error) from None

    def _prepare(self, shards: list[int]) -> None:
        """Download (and decompress) ``shards``, several at once: a cold batch touches many."""
        if len(shards) <= 1:
            for shard in shards:
                self.dataset.prepare_shard(shard)
            return
        with ThreadPoolExecutor(max_workers=min(8, len(shards))) as pool:
            for done in [pool.submit(self.dataset.prepare_shard, shard) for shard in shards]:
                done.result()

    def _read(self, shard: int, offsets: np.ndarray) -> list[bytes]:
        """The raw samples ``offsets`` of a local shard, sliced from its memory map (MDS: a uint32 count, then
        the uint32 byte offsets of its samples, then the samples). A shard evicted meanwhile is prepared again."""
        data = self._map(shard)
        low, high = int(offsets.min()), int(offsets.max())
        bounds = np.frombuffer(data, np.uint32, count=high - low + 2, offset=4 * (1 + low)).astype(np.int64)
        begins, ends = bounds[offsets - low].tolist(), bounds[offsets - low + 1].tolist()
        self.dataset._shard_access_times[shard] = time.time_ns()  # the cache evicts the coldest shard first
        return [data[begin:end] for begin, end in zip(begins, ends)]

    def _map(self, shard: int) -> mmap.mmap:
        """The shard's file mapped read-only; the last 64 are kept open while their file is the cached one (an
        evicted and downloaded again shard is a new file, mapped anew; the maps of evicted files are closed)."""
        path = self._paths[shard]
        for attempt in range(3):
            try:
                inode = os.stat(path).st_ino
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
                self.dataset.prepare_shard(shard)
        maps = self.__dict__.setdefault("_maps", OrderedDict())
        kept = maps.get(shard)
        if kept is not None and kept[0] == inode:
            maps.move_to_end(shard)
            return kept[1]
        with open(path, "rb") as handle:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        if kept is not None:
            kept[1].close()
        maps[shard] = (inode, mapped)
        while len(maps) > _MAPPED:
            maps.popitem(last=False)[1][1].close()
        self._maps_opened = self.__dict__.get("_maps_opened", 0) + 1
        if self._maps_opened % _MAPPED == 0:  # an evicted shard's disk space is freed once its map is closed
            for gone in [s for s, (ino, _) in maps.items() if not _same_file(self._paths[s], ino)]:
                maps.pop(gone)[1].close()
        return mapped

    def __getstate__(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != "_maps"}  # maps stay in-process

    def _failure(self, rows: np.ndarray, error: BaseException) -> StreamingDataError:
        """The one-line error of a failed read; the shards that were being prepared are marked remote."""
        from streaming.base.dataset import _ShardState

        cause = error.__context__ if isinstance(error, RuntimeError) and error.__context__ else error
        shards = sorted(set(self.shard_ids(rows).tolist()))
        for shard in shards:  # a failed download leaves its shard "preparing": every later reader would wait
            if self.dataset._shard_states[shard] == _ShardState.PREPARING:
                self.dataset._shard_states[shard] = _ShardState.REMOTE
        text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        shard = next((s for s in shards if self._basename(s) in text), shards[0])
        where = join_remote(self.remote, self.split, self._basename(shard))
        if text.startswith("Checksum failure"):
            return StreamingDataError(
                f"{where}: its {self.dataset.streams[0].validate_hash} hash is not the one index.json records; "
                "the shard is corrupt (upload it again from the converted folder)."
            )
        return StreamingDataError(
            f"{where}: could not download it from {self.remote} after {self.retries + 1} attempts "
            f"({type(cause).__name__}: {text})."
        )

    def _basename(self, shard: int) -> str:
        raw, zipped = self.dataset.shards[shard].file_pairs[0]
        return (zipped or raw).basename


def _same_file(path: str, inode: int) -> bool:
    try:
        return os.stat(path).st_ino == inode
    except FileNotFoundError:
        return False


def _column_taker(shard: Any, name: str) -> Any:
    """A function from an MDS sample's bytes to column ``name``'s value. A ``bytes`` column is sliced out of
    the sample as it is (MDS: a uint32 size per variable-size column, then the columns' bytes in order);
    another is decoded with the rest of the sample."""
    encodings = dict(zip(shard.column_names, shard.column_encodings))
    if encodings.get(name) != "bytes":
        return lambda data: shard.decode_sample(data)[name]
    sizes = list(zip(shard.column_names, shard.column_sizes))
    variable = sum(1 for _, size in sizes if not size)
    if sizes[0] == (name, None):  # the first column, of variable size (input_ids, features): its size leads
        start = 4 * variable
        return lambda data: data[start : start + int.from_bytes(data[:4], "little")]

    def take(data: bytes) -> bytes:
        heads = iter(np.frombuffer(data, np.uint32, count=variable).tolist())
        position = 4 * variable
        for column, size in sizes:
            size = size or next(heads)
            if column == name:
                return data[position : position + size]
            position += size
        raise KeyError(name)

    return take


def check_open(remote: str, local: Path, digest: str | None = None) -> None:
    """Refuse ``local`` when this process reads another remote there, or (``digest``) another conversion.

    Raises:
        StreamingDataError: One line naming the folder, the remote it caches and the fix.
    """
    with _LOCK:
        for split in SPLITS:
            reader = _OPEN.get(os.path.abspath(local / split))
            if reader is None:
                continue
            if reader.remote != remote:
                raise StreamingDataError(
                    f"data.local {str(local)!r}: this process already caches {reader.remote} there; give "
                    f"{remote} another local folder."
                )
            if digest is not None and reader.digest != digest:
                raise StreamingDataError(
                    f"data.local {str(local)!r}: this process still reads the conversion of {remote} before the "
                    "last one there; give another local folder (or close_readers() first)."
                )


def open_reader(remote: str, split: str, local: Path, *, digest: str, **options: Any) -> ShardReader:
    """The reader of ``remote``'s ``split`` (the conversion of manifest hash ``digest``) cached in ``local``:
    one per folder and process, reused."""
    check_open(remote, local, digest)
    key = os.path.abspath(local / split)
    with _LOCK:
        reader = _OPEN.get(key)
        if reader is None:
            reader = _OPEN[key] = ShardReader(remote, split, local, digest=digest, **options)
        return reader


def close_readers() -> None:
    """Forget this process's readers and release their cache folders, so a folder can be opened again
    (Streaming frees their shared memory at exit)."""
    with _LOCK:
        _OPEN.clear()
        release_caches()


class StreamingTokens(TokenStore):
    """A split's rows as a :class:`TokenStore`: text ``i`` is row ``i``, read from its shard when padded.

    Args:
        reader (ShardReader): The split's shards.
        text_hash (np.ndarray): ``(R,)`` each row's text hash (the manifest's).
        lengths (np.ndarray): ``(R,)`` each row's token count (the manifest's).
        meta (dict): ``max_length`` and ``num_truncated`` of the converted data.
    """

    def __init__(
        self, reader: ShardReader, text_hash: np.ndarray, lengths: np.ndarray, meta: dict[str, Any]
    ) -> None:
        self.reader, self.directory, self.from_cache = reader, Path(reader.dataset.streams[0].local), True
        self.text_hash = np.asarray(text_hash, np.int64)
        self._lengths = np.asarray(lengths, np.int64)
        if len(self.text_hash) != reader.num_rows or len(self._lengths) != reader.num_rows:
            raise StreamingDataError(
                f"{reader!r}: the manifest lists {len(self.text_hash)} rows, the shards hold {reader.num_rows}."
            )
        self.meta = {**meta, "num_texts": reader.num_rows, "num_tokens": int(self._lengths.sum())}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reader!r})"

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __len__(self) -> int:
        return len(self.text_hash)

    def lengths(self) -> np.ndarray:
        """``int64`` ``(R,)``: each row's number of tokens (from the manifest: no shard is read)."""
        return self._lengths

    def row(self, text_id: int) -> np.ndarray:
        """The token ids of one row."""
        return np.frombuffer(self.reader.column(np.asarray([text_id]), "input_ids")[0], dtype="<u4")

    def pad(
        self, text_ids: np.ndarray, pad_id: int, pad_to_multiple_of: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`TokenStore.pad`, the rows read from their shards."""
        blobs = self.reader.column(np.asarray(text_ids, dtype=np.int64), "input_ids")
        lengths = np.fromiter(map(len, blobs), dtype=np.int64, count=len(blobs)) // 4
        starts = np.cumsum(lengths) - lengths
        return pad_spans(
            np.frombuffer(b"".join(blobs), dtype="<u4"), starts, lengths, pad_id, pad_to_multiple_of
        )


class StreamingFeatures(TensorStore):
    """A split of features whose rows are read from their shards by :meth:`gather`.

    ``features`` (all rows at once, as an evaluation embeds a whole split) reads every shard once and keeps
    the tensor.

    Args:
        reader (ShardReader): The split's shards.
        labels (np.ndarray): ``(N,)`` the labels (the manifest's).
        feature_shape (tuple[int, ...]): One row's shape. dtype (str): Its numpy dtype.
    """

    def __init__(
        self, reader: ShardReader, labels: np.ndarray, feature_shape: tuple[int, ...], dtype: str
    ) -> None:
        self.reader, self.shape, self.dtype = reader, tuple(int(n) for n in feature_shape), np.dtype(dtype)
        self.labels = torch.from_numpy(np.asarray(labels, np.int64).copy())
        self._all: torch.Tensor | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reader!r}, feature_shape={self.shape}, dtype={self.dtype})"

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """The shape of one item's features."""
        return self.shape

    @property
    def features(self) -> torch.Tensor:  # type: ignore[override]
        """Every row's features, read once."""
        if self._all is None:
            self._all = self.gather(torch.arange(len(self)))
        return self._all

    def gather(self, index: torch.Tensor) -> torch.Tensor:
        """``features[index]``, the rows read from their shards."""
        rows = self.reader.column(np.asarray(index, dtype=np.int64), "features")
        array = np.stack([np.frombuffer(row, dtype=self.dtype).reshape(self.shape) for row in rows])
        return torch.from_numpy(array)
