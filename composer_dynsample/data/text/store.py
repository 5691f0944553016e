"""A split of texts over a memory-mapped token store, and the collate that pads a batch of them.

A :class:`TextStore` is the text counterpart of :class:`~composer_dynsample.data.TensorStore`: rows are
texts (indices into a :class:`~composer_dynsample.data.text.tokenized.TokenStore`, so a text repeated in the
data is stored once) with integer labels. Its first ``len(store)`` rows are the ones a sampler draws
(``store.labels`` has exactly those); rows after them are *given negatives*, reached only through the
anchors that list them. The index-only pipeline is unchanged: ``IndexDataset(store.labels)`` returns
``(index, label)`` and :class:`TextCollate` gathers the batch::

    loader = DataLoader(
        IndexDataset(store.labels),
        batch_sampler=PKBatchSampler(store.labels, classes_per_batch=64, samples_per_class=2),
        collate_fn=TextCollate(store),
        num_workers=2,
        pin_memory=True,
    )
    batch = next(iter(loader))
    # {"features": {"input_ids": int64 (B, L), "attention_mask": int64 (B, L), "is_query": bool (B,),
    #               "prompt_length": int64 (B,) of a prompted store},
    #  "labels": int64 (B,), "index": int64 (B,), "text_hash": int64 (B,), "text_group": int64 (B,)}

``L`` is the longest text of the batch (rounded up to ``pad_to_multiple_of`` when given), not
``max_length``. With given negatives, ``B`` is the sampled rows followed by the negatives of the batch's
anchors (their store rows as ``index``, each a label of its own, so it matches no other row), which is
why Composer needs :func:`~composer_dynsample.data.text.data_spec.text_data_spec` to count a batch's
samples and keep it whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from composer_dynsample.data.splits import DatasetSplits
from composer_dynsample.data.text.text_identity import text_groups
from composer_dynsample.data.text.tokenized import TokenStore
from composer_dynsample.data.text.tokenizer import TextTokenizer, load_tokenizer
from composer_dynsample.validation import check_bool, check_instance, check_int

__all__ = ["QUERIES_VS_PASSAGES", "TextCollate", "TextInfo", "TextSplits", "TextStore"]


#: The test protocol of pairs: each test anchor (query) ranked against the test split's positives (passages).
QUERIES_VS_PASSAGES = "queries_vs_passages"


def _int_array(name: str, values: Any, length: int | None = None) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise ValueError(
            f"{name} must be a 1-D integer array, got dtype {array.dtype} and shape {array.shape}."
        )
    if length is not None and len(array) != length:
        raise ValueError(f"{name} has {len(array)} entries; expected {length}.")
    return array.astype(np.int64, copy=False)


class TextStore:
    """Texts of one split: token rows, labels, which rows are queries, and the given negatives.

    Args:
        tokens (TokenStore): The token ids of the distinct texts.
        text_ids (np.ndarray): ``(R,)`` the text of every row, an index into ``tokens``.
        row_labels (np.ndarray): ``(R,)`` the label of every row.
        pad_id (int): The id padded positions get.
        vocab_size (int): The tokenizer's vocabulary size (for building an encoder).
        num_sampled (int, optional): The rows a sampler draws, the first ones; the rest are given
            negatives. Default: all ``R``.
        is_query (np.ndarray, optional): ``(R,)`` bool, true for queries (anchors). Default: all false.
        negatives (tuple[np.ndarray, np.ndarray], optional): ``(offsets, rows)`` in CSR form: the given
            negatives of sampled row ``i`` are ``rows[offsets[i]:offsets[i + 1]]``, rows at or after
            ``num_sampled``. Default: none.
        source_rows (np.ndarray, optional): ``(R,)`` the row of the input table each row came from.
            Default: ``0 .. R-1``.
        prompt_lengths (np.ndarray, optional): ``(R,)`` the tokens of each row's prompt at the start of
            its text (:func:`~composer_dynsample.data.text.prompts.prompt_token_count`), which
            :class:`TextCollate` puts in ``features["prompt_length"]``. Default: ``None`` (no prompts).
        passage_tokens (TokenStore, optional): The same distinct texts tokenized by a second tokenizer, the
            passage tower's of a two-tower encoder whose towers tokenize otherwise: the rows that are not
            queries take their ids from it (and ``passage_pad_id``), the queries from ``tokens``.
            Default: ``None`` (one tokenizer).
        passage_pad_id (int, optional): The second tokenizer's pad id, given with ``passage_tokens``.

    Example:
        >>> import tempfile
        >>> from composer_dynsample.data.text.tokenized import TokenStoreWriter
        >>> folder = Path(tempfile.mkdtemp()) / "tokens"
        >>> with TokenStoreWriter(folder, {}) as writer:
        ...     writer.append(np.array([5, 6, 7, 8, 9]), np.array([2, 1, 2]), np.array([1, 2, 3]))
        >>> store = TextStore(TokenStore(folder), [0, 1, 2], [0, 0, 1], pad_id=0, vocab_size=10,
        ...                   num_sampled=2, is_query=[True, False, False], negatives=([0, 1, 1], [2]))
        >>> len(store), store.num_rows, store.labels.tolist(), store.negatives_of(np.array([0, 1])).tolist()
        (2, 3, [0, 0], [2])
    """

    def __init__(
        self,
        tokens: TokenStore,
        text_ids: Sequence[int] | np.ndarray,
        row_labels: Sequence[int] | np.ndarray,
        *,
        pad_id: int,
        vocab_size: int,
        num_sampled: int | None = None,
        is_query: Sequence[bool] | np.ndarray | None = None,
        negatives: tuple[Sequence[int] | np.ndarray, Sequence[int] | np.ndarray] | None = None,
        source_rows: Sequence[int] | np.ndarray | None = None,
        prompt_lengths: Sequence[int] | np.ndarray | None = None,
        passage_tokens: TokenStore | None = None,
        passage_pad_id: int | None = None,
    ) -> None:
        self.tokens = check_instance("tokens", tokens, TokenStore)
        self.text_ids = _int_array("text_ids", text_ids)
        num_rows = len(self.text_ids)
        if num_rows and (self.text_ids.min() < 0 or self.text_ids.max() >= len(tokens)):
            raise ValueError(f"text_ids must index the {len(tokens)} texts of the token store.")
        self.row_labels = _int_array("row_labels", row_labels, num_rows)
        self.num_sampled = check_int(
            "num_sampled", num_rows if num_sampled is None else num_sampled, minimum=0, maximum=num_rows
        )
        self.is_query = np.zeros(num_rows, bool) if is_query is None else np.asarray(is_query, dtype=bool)
        if self.is_query.shape != (num_rows,):
            raise ValueError(f"is_query must have {num_rows} entries, got shape {self.is_query.shape}.")
        offsets, rows = negatives if negatives is not None else (np.zeros(self.num_sampled + 1, np.int64), [])
        self.negative_offsets = _int_array("negatives offsets", offsets, self.num_sampled + 1)
        self.negative_rows = _int_array("negatives rows", rows, int(self.negative_offsets[-1]))
        if np.any(np.diff(self.negative_offsets) < 0) or self.negative_offsets[0] != 0:
            raise ValueError("negatives offsets must start at 0 and never decrease.")
        if len(self.negative_rows) and (
            self.negative_rows.min() < self.num_sampled or self.negative_rows.max() >= num_rows
        ):
            raise ValueError(
                f"negatives rows must be in [num_sampled, {num_rows}), the rows no sampler draws."
            )
        self.pad_id = check_int("pad_id", pad_id, minimum=0)
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=1)
        self.source_rows = _int_array(
            "source_rows", np.arange(num_rows) if source_rows is None else source_rows, num_rows
        )
        self.prompt_lengths = (
            None if prompt_lengths is None else _int_array("prompt_lengths", prompt_lengths, num_rows)
        )
        self.labels = torch.from_numpy(self.row_labels[: self.num_sampled].copy())
        self.text_hash = np.asarray(tokens.text_hash)[self.text_ids]
        # Labels linked by a shared text (pairs of one query, one passage answering two): one group each.
        self.text_group = text_groups(self.row_labels, self.text_hash, self.num_sampled)
        self.passage_tokens, self.passage_pad_id = passage_tokens, passage_pad_id
        if passage_tokens is not None:
            if not isinstance(passage_tokens, TokenStore) or len(passage_tokens) != len(tokens):
                raise ValueError(
                    f"passage_tokens must be a TokenStore of the same {len(tokens)} texts as tokens, got "
                    f"{len(passage_tokens) if isinstance(passage_tokens, TokenStore) else type(passage_tokens).__name__}."
                )
            if not np.array_equal(np.asarray(passage_tokens.text_hash), np.asarray(tokens.text_hash)):
                raise ValueError("passage_tokens must hold the same texts as tokens, in the same order.")
            self.passage_pad_id = check_int("passage_pad_id", passage_pad_id, minimum=0)

    def pad(self, rows: np.ndarray, pad_to_multiple_of: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, attention_mask)`` of ``rows``, right-padded to the longest (rounded up to a
        multiple, if asked); with ``passage_tokens``, each row's ids and pad id from its tower's tokenizer."""
        text_ids = self.text_ids[rows]
        if self.passage_tokens is None:
            return self.tokens.pad(text_ids, self.pad_id, pad_to_multiple_of)
        query = self.is_query[rows]
        sides = ((query, self.tokens, self.pad_id), (~query, self.passage_tokens, self.passage_pad_id))
        padded = [
            (at, *store.pad(text_ids[at], pad, pad_to_multiple_of), pad)
            for at, store, pad in sides
            if at.any()
        ]
        width = max(ids.shape[1] for _, ids, _, _ in padded)
        input_ids, mask = np.empty((len(rows), width), np.int64), np.zeros((len(rows), width), np.int64)
        for at, ids, attention, pad in padded:
            input_ids[at] = pad
            input_ids[at, : ids.shape[1]], mask[at, : ids.shape[1]] = ids, attention
        return input_ids, mask

    def lengths(self, rows: np.ndarray) -> np.ndarray:
        """The token count of each of ``rows``, by its tower's tokenizer."""
        lengths = self.tokens.lengths()[self.text_ids[rows]]
        if self.passage_tokens is not None:
            passages = ~self.is_query[rows]
            lengths = np.where(passages, self.passage_tokens.lengths()[self.text_ids[rows]], lengths)
        return lengths

    def __len__(self) -> int:
        return self.num_sampled

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_sampled={len(self)}, num_rows={self.num_rows}, "
            f"num_classes={self.num_classes}, tokens={self.tokens!r})"
        )

    @property
    def num_rows(self) -> int:
        """All rows: the sampled ones and the given negatives."""
        return len(self.text_ids)

    @property
    def num_classes(self) -> int:
        """The number of distinct labels among the sampled rows."""
        return int(np.unique(self.row_labels[: self.num_sampled]).size)

    @property
    def max_length(self) -> int | None:
        """The ``max_length`` the texts were truncated to."""
        return self.tokens.max_length

    def negatives_of(self, rows: np.ndarray) -> np.ndarray:
        """The given negatives of sampled ``rows``, concatenated in their order."""
        starts, ends = self.negative_offsets[rows], self.negative_offsets[rows + 1]
        if not (ends > starts).any():
            return np.zeros(0, np.int64)
        return np.concatenate([self.negative_rows[s:e] for s, e in zip(starts, ends)])


class TextCollate:
    """Gather a batch of :class:`TextStore` rows, append their anchors' given negatives, pad to the longest.

    Items are indices, or ``(index, label)`` pairs from :class:`~composer_dynsample.data.IndexDataset`.
    A given negative is left out when its text (by :func:`~composer_dynsample.data.text.text_identity.text_hash`)
    is already in the batch, as a sampled row or an earlier negative: the text is there once, and an
    anchor's positive is never also one of its negatives. A plain, picklable object: works with
    ``num_workers > 0`` (fork or spawn) and ``pin_memory=True``.

    Args:
        store (TextStore): The split.
        negatives (bool): Append the given negatives of the batch's anchors. Default: ``True``.
        max_negatives_per_anchor (int, optional): Append at most this many per anchor (the first ones).
            Default: ``None`` (all).
        pad_to_multiple_of (int, optional): Pad the batch's length up to a multiple of this: the extra
            columns are the pad id with ``attention_mask`` 0, so the values do not change, and a GPU's
            matrix units get whole tiles (8 for bf16 tensor cores) and ``torch.compile`` fewer shapes.
            ``None`` or 1: the longest row. Default: ``None`` (the train loader of a config gets
            ``dataloader.pad_to_multiple_of``: 8 on a CUDA device unless set).

    Example:
        >>> import tempfile
        >>> from composer_dynsample.data.text.tokenized import TokenStoreWriter
        >>> folder = Path(tempfile.mkdtemp()) / "tokens"
        >>> with TokenStoreWriter(folder, {}) as writer:
        ...     writer.append(np.array([5, 6, 7, 8, 9]), np.array([2, 3]), np.array([1, 2]))
        >>> store = TextStore(TokenStore(folder), [0, 1], [0, 0], pad_id=0, vocab_size=10)
        >>> TextCollate(store, pad_to_multiple_of=8)([0, 1])["features"]["attention_mask"].tolist()
        [[1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]]
    """

    def __init__(
        self,
        store: TextStore,
        *,
        negatives: bool = True,
        max_negatives_per_anchor: int | None = None,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        self.store = check_instance("store", store, TextStore)
        self.negatives = check_bool("negatives", negatives)
        self.max_negatives_per_anchor = check_int(
            "max_negatives_per_anchor", max_negatives_per_anchor, minimum=0, allow_none=True
        )
        self.pad_to_multiple_of = check_int(
            "pad_to_multiple_of", pad_to_multiple_of, minimum=1, allow_none=True
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(store={self.store!r}, negatives={self.negatives})"

    def _indices(self, items: Sequence[Any]) -> np.ndarray:
        if len(items) == 0:
            raise ValueError("TextCollate got an empty batch.")
        raw = [item[0] for item in items] if isinstance(items[0], (tuple, list)) else list(items)
        index = np.asarray([int(i) for i in raw], dtype=np.int64)
        n = len(self.store)
        if index.min() < 0 or index.max() >= n:
            raise IndexError(f"TextCollate got indices outside [0, {n - 1}] for a store of {n} sampled rows.")
        return index

    def _given_negatives(self, index: np.ndarray) -> np.ndarray:
        store, cap = self.store, self.max_negatives_per_anchor
        if cap is not None:
            starts = store.negative_offsets[index]
            ends = np.minimum(store.negative_offsets[index + 1], starts + cap)
            found = [store.negative_rows[s:e] for s, e in zip(starts, ends) if e > s]
            candidates = np.concatenate(found) if found else np.zeros(0, np.int64)
        else:
            candidates = store.negatives_of(index)
        if not len(candidates):
            return candidates
        seen = set(store.text_hash[index].tolist())
        keep = []
        for row, value in zip(candidates.tolist(), store.text_hash[candidates].tolist()):
            if value not in seen:
                seen.add(value)
                keep.append(row)
        return np.asarray(keep, dtype=np.int64)

    def __call__(self, items: Sequence[Any]) -> dict[str, Any]:
        rows = self._indices(items)
        if self.negatives and len(self.store.negative_rows):
            rows = np.concatenate([rows, self._given_negatives(rows)])
        store = self.store
        input_ids, attention_mask = store.pad(rows, self.pad_to_multiple_of)
        features = {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "is_query": torch.from_numpy(store.is_query[rows]),
        }
        if store.prompt_lengths is not None:
            features["prompt_length"] = torch.from_numpy(store.prompt_lengths[rows])
        batch = {
            "features": features,
            "labels": torch.from_numpy(store.row_labels[rows]),
            "index": torch.from_numpy(rows),
            "text_hash": torch.from_numpy(store.text_hash[rows]),
            "text_group": torch.from_numpy(store.text_group[rows]),
        }
        sources = getattr(store, "row_sources", None)  # a mix of data sets: the batch's source, by name
        if sources is not None and rows.size and bool((sources[rows] == sources[rows[0]]).all()):
            batch["source"] = store.source_names[int(sources[rows[0]])]
        return batch


@dataclasses.dataclass(frozen=True, eq=False)
class TextInfo:
    """What a text data set was made from, and what an encoder needs to know of its tokens.

    Attributes:
        tokenizer (str): Where the tokenizer came from: a path, or ``"trained: ..."``.
        tokenizer_path (Path | None): Its ``tokenizer.json`` (loaded, cached or saved), if a file.
        tokenizer_sha256 (str): SHA-256 of its JSON serialization.
        vocab_size (int): Token ids are below this.
        pad_id (int): The id at padded positions.
        max_length (int): Texts were truncated to this many tokens.
        split (str): How the test split was made: ``"test_path"``, ``"bundled"`` (a ``DatasetDict``'s
            ``test``), ``"group"``, ``"random"`` (pairs) or ``"labels"`` (unseen labels).
        num_truncated (int): Distinct texts truncated, over the files read.
        cache_dirs (tuple[Path, ...]): The token stores, one per file read.
        from_cache (tuple[bool, ...]): Whether each was read back rather than tokenized.
        label_names (tuple | None): The original label of each integer label (labelled texts).
        num_train_classes (int): Labels below this are the training split's.
        num_negatives (tuple[int, int]): Given negatives in the train and test split.
        num_missing_negatives (int): Empty or ``null`` negative cells, read as no negative.
        columns (dict[str, str]): The columns read under another name (the loader's ``columns``), which
            ``embed --input`` reads a file with too.
        files (dict[str, str]): The SHA-256 of each file read (of a ``datasets`` folder's files and
            split), by its path: what a checkpoint records of the data.
        prompts (dict[str, str]): The prompt put before each column's texts (the loader's ``prompts``),
            which ``embed --input`` puts before a file's texts too.
    """

    tokenizer: str
    tokenizer_path: Path | None
    tokenizer_sha256: str
    vocab_size: int
    pad_id: int
    max_length: int
    split: str
    num_truncated: int
    cache_dirs: tuple[Path, ...]
    from_cache: tuple[bool, ...]
    label_names: tuple[Any, ...] | None = None
    num_train_classes: int = 0
    num_negatives: tuple[int, int] = (0, 0)
    num_missing_negatives: int = 0
    columns: dict[str, str] = dataclasses.field(default_factory=dict)
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    prompts: dict[str, str] = dataclasses.field(default_factory=dict)

    def load_tokenizer(self) -> TextTokenizer:
        """The tokenizer the texts were tokenized with, read back from ``tokenizer_path`` (or its folder)."""
        return load_tokenizer(self.tokenizer_path if self.tokenizer_path is not None else self.tokenizer)

    @classmethod
    def describe(
        cls,
        tokenizer: TextTokenizer,
        stores: Sequence[TokenStore],
        max_length: int,
        split: str,
        **counts: Any,
    ) -> TextInfo:
        """The info of splits tokenized by ``tokenizer`` into ``stores``; ``counts`` fill the other fields."""
        return cls(
            tokenizer=tokenizer.source,
            tokenizer_path=tokenizer.path,
            tokenizer_sha256=tokenizer.sha256,
            vocab_size=tokenizer.vocab_size,
            pad_id=tokenizer.pad_id,
            max_length=int(max_length),
            split=split,
            num_truncated=sum(store.num_truncated for store in stores),
            cache_dirs=tuple(store.directory for store in stores),
            from_cache=tuple(store.from_cache for store in stores),
            **counts,
        )


@dataclasses.dataclass(frozen=True)
class TextSplits(DatasetSplits):
    """:class:`~composer_dynsample.data.DatasetSplits` of :class:`TextStore` splits, with their :class:`TextInfo`.

    Labels are global: the test split's labels follow the training split's, so a label never names two
    classes, and ``num_classes`` counts every label of both splits (a given negative's included).

    Labelled texts get ``class_names``, their labels' original values as strings, when none are given.

    Attributes:
        info (TextInfo): The tokenizer, caches and counts.
        test_protocol (str): How an evaluation scores the test split. ``"queries_vs_passages"`` when
            the test split has queries (pairs): its queries (anchors) are ranked against its other sampled
            rows (the positives, their passages). ``"leave_one_out"`` otherwise (labelled texts): each
            test row queries the other test rows. Default: chosen from the test split's ``is_query``.
    """

    train: TextStore  # type: ignore[assignment]
    test: TextStore  # type: ignore[assignment]
    info: TextInfo
    test_protocol: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.test_protocol:
            has_queries = bool(self.test.is_query[: len(self.test)].any())
            protocol = QUERIES_VS_PASSAGES if has_queries else "leave_one_out"
            object.__setattr__(self, "test_protocol", protocol)
        names = self.info.label_names
        if self.class_names is None and names is not None and len(names) == self.num_classes:
            object.__setattr__(self, "class_names", tuple(str(name) for name in names))
