"""Texts tokenized once, cached on disk, and read back memory-mapped.

:func:`tokenize_texts` encodes a list of distinct texts with a Hugging Face ``tokenizers.Tokenizer``
(``encode_batch``, multi-threaded in Rust, in chunks) and writes a :class:`TokenStore` folder:

* ``ids.npy``: every text's token ids, concatenated, ``uint32``;
* ``offsets.npy``: ``int64``, ``len + 1`` entries; text ``i`` is ``ids[offsets[i]:offsets[i + 1]]``;
* ``text_hash.npy``: ``int64``, a 63-bit hash of each text's normalised form (:func:`text_hash`);
* ``meta.json``: the cache key's parts and the counts (texts, tokens, texts truncated).

Why flat ``.npy`` files opened with ``np.load(mmap_mode="r")`` rather than Arrow: a batch's rows are a
zero-copy view of the page cache (no deserialisation, nothing copied into each DataLoader worker: a
forked worker shares the pages, a spawned one re-opens the files by path); gathering a row is O(1)
(two offsets, one slice); training needs numpy only, not ``pyarrow``; and a corpus larger than RAM
works, since only the pages a batch touches are read.

The folder is named by the SHA-256 of the data file's bytes, the tokenizer's JSON serialization hash,
``max_length`` and the loader's column layout, so a changed file, tokenizer or ``max_length`` misses it
and a rerun reads it back without tokenizing. It is written into a temporary folder that is renamed
into place (``os.replace``), so an interrupted run never leaves a half-written cache; two processes
that build the same cache at once both succeed and the first rename wins.

Texts longer than ``max_length`` tokens (special tokens included) are truncated by the tokenizer,
counted (:attr:`TokenStore.num_truncated`) and reported once per load with a warning; a text too long
to encode whole is cut to a character budget first (:mod:`~composer_dynsample.data.text.truncation`).
The cache folder is checked before anything is tokenized for it, and a folder that cannot be written
is one :class:`~composer_dynsample.data.text.cache.TokenCacheError` line
(:mod:`~composer_dynsample.data.text.cache`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from composer_dynsample.data.text.cache import TokenCacheError, cache_write_error, check_cache_dir
from composer_dynsample.data.text.text_identity import TextInterner, normalise_text, text_hash
from composer_dynsample.data.text.truncation import TruncatingEncoder, encode_chunk
from composer_dynsample.validation import check_int

__all__ = [
    "TextInterner",
    "TokenStore",
    "TokenStoreWriter",
    "normalise_text",
    "pad_spans",
    "text_hash",
    "tokenize_texts",
]

_CACHE_VERSION = 1  # bump when the layout of a token store changes: the cache key carries it
_CHUNK = 8192  # texts per encode_batch call: bounds the Python objects alive at once
_FILES = ("ids.npy", "offsets.npy", "text_hash.npy", "meta.json")


class TokenStore:
    """The token ids of many texts, memory-mapped from a folder written by :class:`TokenStoreWriter`.

    Pickling keeps only the folder's path: a spawned DataLoader worker re-opens the files instead of
    receiving a copy of the ids.

    Args:
        directory (str | os.PathLike): The folder.

    Attributes:
        directory (Path): The folder.
        ids (np.ndarray): ``uint32`` token ids of all texts, concatenated (memory-mapped).
        offsets (np.ndarray): ``int64`` ``(len + 1,)``: text ``i`` is ``ids[offsets[i]:offsets[i + 1]]``.
        text_hash (np.ndarray): ``int64`` ``(len,)`` hashes of the normalised texts.
        meta (dict): The contents of ``meta.json``.
        from_cache (bool): Whether :func:`tokenize_texts` found it rather than built it.

    Raises:
        TokenCacheError: If a file is missing or the arrays do not agree with ``meta.json``.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp()) / "tokens"
        >>> with TokenStoreWriter(folder, {"max_length": 8}) as writer:
        ...     writer.append(np.array([2, 7, 3, 2, 3]), np.array([3, 2]), np.array([11, 12]))
        >>> store = TokenStore(folder)
        >>> len(store), store.row(0).tolist()
        (2, [2, 7, 3])
        >>> ids, mask = store.pad(np.array([1, 0]), pad_id=0)
        >>> ids.tolist(), mask.tolist()
        ([[2, 3, 0], [2, 7, 3]], [[1, 1, 0], [1, 1, 1]])
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.from_cache = False
        missing = [name for name in _FILES if not (self.directory / name).is_file()]
        if missing:
            raise TokenCacheError(
                f"{self.directory}: not a token store, {missing[0]} is missing. {self._hint()}"
            )
        try:
            self.meta: dict[str, Any] = json.loads((self.directory / "meta.json").read_text())
            self.offsets = np.load(self.directory / "offsets.npy", mmap_mode="r")
            self.text_hash = np.load(self.directory / "text_hash.npy", mmap_mode="r")
            num_tokens = int(self.meta["num_tokens"])
            mode = "r" if num_tokens else None  # an empty file cannot be memory-mapped
            self.ids = np.load(self.directory / "ids.npy", mmap_mode=mode)
            num_texts = int(self.meta["num_texts"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise TokenCacheError(
                f"{self.directory}: unreadable token store ({error}). {self._hint()}"
            ) from None
        shapes_ok = (
            self.ids.shape == (num_tokens,)
            and self.offsets.shape == (num_texts + 1,)
            and self.text_hash.shape == (num_texts,)
            and int(self.offsets[-1]) == num_tokens
        )
        if not shapes_ok:
            raise TokenCacheError(
                f"{self.directory}: the arrays do not match meta.json ({num_texts} texts, {num_tokens} "
                f"tokens). {self._hint()}"
            )

    def _hint(self) -> str:
        return f"Delete {self.directory} to tokenize again."

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.directory)!r}, num_texts={len(self)}, num_tokens={self.num_tokens})"

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "from_cache": self.from_cache}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["directory"])  # type: ignore[misc]
        self.from_cache = state["from_cache"]

    @property
    def num_tokens(self) -> int:
        """The number of token ids over all texts."""
        return int(self.meta["num_tokens"])

    @property
    def num_truncated(self) -> int:
        """How many texts were longer than ``max_length`` tokens and were truncated."""
        return int(self.meta.get("num_truncated", 0))

    @property
    def max_length(self) -> int | None:
        """The ``max_length`` the texts were truncated to, if recorded."""
        value = self.meta.get("max_length")
        return None if value is None else int(value)

    def lengths(self) -> np.ndarray:
        """``int64`` ``(len,)``: each text's number of tokens."""
        return np.diff(np.asarray(self.offsets))

    def row(self, text_id: int) -> np.ndarray:
        """The token ids of one text (a read-only view)."""
        return self.ids[int(self.offsets[text_id]) : int(self.offsets[text_id + 1])]

    def pad(
        self, text_ids: np.ndarray, pad_id: int, pad_to_multiple_of: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Gather texts and right-pad them to the longest of them (rounded up to a multiple, if asked).

        Args:
            text_ids (np.ndarray): ``(B,)`` text indices.
            pad_id (int): The id written at padded positions.
            pad_to_multiple_of (int, optional): Round ``L`` up to a multiple of this (8 fills a GPU's
                tensor-core tiles); the extra columns are ``pad_id`` with mask 0. Default: ``None`` (the
                longest text's length).

        Returns:
            tuple[np.ndarray, np.ndarray]: ``int64`` ``(B, L)`` ids and ``int64`` ``(B, L)`` attention mask,
            ``L`` the longest text's length, rounded up to ``pad_to_multiple_of``.

        Example:
            >>> import tempfile
            >>> folder = Path(tempfile.mkdtemp()) / "tokens"
            >>> with TokenStoreWriter(folder, {}) as writer:
            ...     writer.append(np.array([2, 7, 3]), np.array([3]), np.array([11]))
            >>> ids, mask = TokenStore(folder).pad(np.array([0]), pad_id=0, pad_to_multiple_of=4)
            >>> ids.tolist(), mask.tolist()
            ([[2, 7, 3, 0]], [[1, 1, 1, 0]])
        """
        text_ids = np.asarray(text_ids, dtype=np.int64)
        starts = np.asarray(self.offsets[text_ids])
        return pad_spans(
            self.ids, starts, np.asarray(self.offsets[text_ids + 1]) - starts, pad_id, pad_to_multiple_of
        )


def pad_spans(
    ids: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    pad_id: int,
    pad_to_multiple_of: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``ids[starts[i]:starts[i] + lengths[i]]`` right-padded to the longest (rounded up to a multiple):
    ``int64`` ``(B, L)`` ids and attention mask, as :meth:`TokenStore.pad` returns them."""
    multiple = check_int("pad_to_multiple_of", pad_to_multiple_of, minimum=1, allow_none=True)
    width = int(lengths.max()) if len(lengths) else 0
    if multiple is not None:
        width = -(-width // multiple) * multiple
    positions = np.arange(width, dtype=np.int64)
    mask = positions[None, :] < lengths[:, None]
    padded = np.full((len(starts), width), pad_id, dtype=np.int64)
    padded[mask] = ids[(starts[:, None] + positions[None, :])[mask]]
    return padded, mask.astype(np.int64)


class TokenStoreWriter:
    """Write a :class:`TokenStore` folder atomically, chunk by chunk, without holding all ids in memory.

    The ids stream into ``ids.npy`` in a temporary sibling folder; on a clean exit the ``.npy`` header
    gets the final length (numpy pads headers so the length can grow in place), the offsets, hashes and
    ``meta.json`` are written, and the folder is renamed to ``directory``. On an exception the temporary
    folder is removed. If ``directory`` appeared meanwhile (another process built the same cache), it is
    kept and the new copy dropped.

    Args:
        directory (Path): The folder to create.
        meta (dict): JSON-serialisable entries for ``meta.json`` (``num_texts`` and ``num_tokens`` are
            added; ``num_truncated`` may be set on the writer before it closes).
    """

    def __init__(self, directory: str | os.PathLike[str], meta: dict[str, Any]) -> None:
        self.directory = Path(directory)
        self.meta = dict(meta)
        self.num_truncated = 0
        self._lengths: list[np.ndarray] = []
        self._hashes: list[np.ndarray] = []
        self._num_tokens = 0

    def _header(self, num_tokens: int) -> dict[str, Any]:
        return {
            "descr": np.lib.format.dtype_to_descr(np.dtype(np.uint32)),
            "fortran_order": False,
            "shape": (num_tokens,),
        }

    def __enter__(self) -> TokenStoreWriter:
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(tempfile.mkdtemp(prefix=self.directory.name + ".tmp-", dir=self.directory.parent))
        try:
            self._ids = open(self._tmp / "ids.npy", "wb")  # closed in __exit__
            np.lib.format.write_array_header_1_0(self._ids, self._header(0))
        except BaseException:
            if hasattr(self, "_ids"):
                self._ids.close()
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise
        self._data_start = self._ids.tell()
        return self

    def append(self, ids: np.ndarray, lengths: np.ndarray, hashes: np.ndarray) -> None:
        """Add texts: their concatenated ``ids``, each one's token count and each one's hash."""
        lengths = np.asarray(lengths, dtype=np.int64)
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(np.uint32).max):
            raise ValueError("token ids must fit in uint32 (0 .. 2**32 - 1).")
        if int(lengths.sum()) != ids.size or len(hashes) != len(lengths):
            raise ValueError(
                f"append got {ids.size} ids for lengths summing to {int(lengths.sum())} and "
                f"{len(hashes)} hashes for {len(lengths)} texts; they must agree."
            )
        self._ids.write(ids.astype(np.uint32, copy=False).tobytes())
        self._lengths.append(lengths)
        self._hashes.append(np.asarray(hashes, dtype=np.int64))
        self._num_tokens += ids.size

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            if kind is None:
                self._finish()
        finally:
            self._ids.close()
            shutil.rmtree(self._tmp, ignore_errors=True)

    def _finish(self) -> None:
        self._ids.seek(0)
        np.lib.format.write_array_header_1_0(self._ids, self._header(self._num_tokens))
        if self._ids.tell() != self._data_start:
            raise RuntimeError("the .npy header changed length; the token store cannot be finished in place.")
        self._ids.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        np.save(self._tmp / "offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        np.save(
            self._tmp / "text_hash.npy",
            np.concatenate(self._hashes) if self._hashes else np.zeros(0, np.int64),
        )
        meta = {**self.meta, "num_texts": len(lengths), "num_tokens": self._num_tokens}
        meta["num_truncated"] = self.num_truncated
        (self._tmp / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        os.chmod(self._tmp, 0o755)  # mkdtemp creates 0700; a shared cache should be readable
        try:
            os.replace(self._tmp, self.directory)
        except OSError:
            if not (self.directory / "meta.json").is_file():  # not a finished store that won the race
                raise


def _progress(total: int, description: str, show: bool | None) -> Any:
    from tqdm.auto import tqdm

    enabled = sys.stderr.isatty() if show is None else bool(show)
    return tqdm(total=total, desc=description, unit=" texts", disable=not enabled, leave=False)


def _write_token_store(
    directory: Path,
    meta: dict[str, Any],
    texts: Sequence[str],
    tokenizer: Any,
    locate: Callable[[int], str] | None,
    progress: bool | None,
) -> None:
    """Encode ``texts`` chunk by chunk, truncated to ``meta["max_length"]``, into the store ``directory``,
    once its folder's parent is known to be writable: encode a chunk, check it, append it.

    Raises:
        ValueError: If a text encodes to no tokens, naming where it is (``locate``, else its number).
        TokenCacheError: If the store cannot be written (a file, read-only, a full disk).
    """
    check_cache_dir(directory.parent)
    encoder = TruncatingEncoder.of(tokenizer, meta["max_length"])
    source = meta["source"]
    try:
        with (
            TokenStoreWriter(directory, meta) as writer,
            _progress(len(texts), f"tokenizing {source}", progress) as bar,
        ):
            for start in range(0, len(texts), _CHUNK):
                chunk = texts[start : start + _CHUNK]
                ids, lengths, truncated = encode_chunk(encoder, chunk)
                if not lengths.all():
                    first = start + int(np.flatnonzero(lengths == 0)[0])
                    where = locate(first) if locate is not None else f"{source}: text {first}"
                    raise ValueError(
                        f"{where}: the text encodes to no tokens with this tokenizer; remove or fix it."
                    )
                hashes = np.fromiter(map(text_hash, chunk), dtype=np.int64, count=len(chunk))
                writer.append(ids, lengths, hashes)
                writer.num_truncated += truncated
                bar.update(len(chunk))
    except OSError as error:
        raise cache_write_error(directory.parent, error) from error


def cache_key(data_sha256: str, tokenizer_sha256: str, max_length: int, layout: str) -> str:
    """The SHA-256 naming a token cache: data bytes, tokenizer JSON, ``max_length`` and column layout."""
    parts = [_CACHE_VERSION, data_sha256, tokenizer_sha256, int(max_length), layout]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def tokenize_texts(
    texts: Sequence[str],
    tokenizer: Any,
    *,
    max_length: int,
    cache_dir: str | os.PathLike[str],
    data_sha256: str,
    tokenizer_sha256: str,
    layout: str,
    source: str,
    locate: Callable[[int], str] | None = None,
    progress: bool | None = None,
) -> TokenStore:
    """Tokenize ``texts`` into a cached :class:`TokenStore`, or open the cached one.

    Args:
        texts (Sequence[str]): The distinct texts, in a fixed order (text ``i`` is row ``i``).
        tokenizer (tokenizers.Tokenizer): The tokenizer (left unchanged: a copy truncates).
        max_length (int): Truncate every text to this many tokens, special tokens included, at least 2.
        cache_dir (str | os.PathLike): Where the store folder ``tokens-<key>`` goes.
        data_sha256 (str): The data file's SHA-256 (part of the key).
        tokenizer_sha256 (str): The tokenizer's JSON SHA-256 (part of the key).
        layout (str): Which columns of the file made ``texts``, and how (part of the key).
        source (str): The data file, for messages and the progress bar.
        locate (Callable[[int], str], optional): Where text ``i`` is in the file, for an error about it.
        progress (bool, optional): Show a progress bar; ``None`` shows one only on a terminal.

    Returns:
        TokenStore: ``from_cache`` tells whether it was read back.

    Raises:
        ValueError: If a text encodes to no tokens.
        TokenCacheError: If the cached store does not hold ``len(texts)`` texts, or it must be built
            and ``cache_dir`` cannot be written (a file, read-only, full).
    """
    key = cache_key(data_sha256, tokenizer_sha256, max_length, layout)
    directory = Path(cache_dir).expanduser() / f"tokens-{key[:24]}"
    cached = (directory / "meta.json").is_file()
    if not cached:
        meta = {"key": key, "max_length": int(max_length), "layout": layout, "source": source}
        meta.update(data_sha256=data_sha256, tokenizer_sha256=tokenizer_sha256)
        _write_token_store(directory, meta, texts, tokenizer, locate, progress)
    store = TokenStore(directory)
    store.from_cache = cached
    if len(store) != len(texts):
        raise TokenCacheError(
            f"{directory}: holds {len(store)} texts but {source} has {len(texts)}. Delete it to tokenize again."
        )
    if store.num_truncated:
        # Past tokenize_sources and TokenizeOptions.tokenize, to the caller of load_* (to load_* itself
        # before Python 3.12, where the comprehension in tokenize_sources is a frame of its own).
        warnings.warn(
            f"{store.num_truncated} of {len(store)} distinct texts in {source} are longer than "
            f"max_length={max_length} tokens and were truncated.",
            UserWarning,
            stacklevel=5,
        )
    return store
