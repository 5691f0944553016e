"""Several text splits as one: the token stores of several sources read as one, and their rows concatenated.

A run on several data sets (``data: {name: mix}``, :mod:`composer_dynsample.data.mix`) trains one model on
sources tokenized apart, each by its own ``max_length`` and prompts, into token stores of their own.
:class:`ConcatTokenStore` reads those stores as one without copying a token, and :func:`concat_text_stores`
gives the arguments of the one :class:`~composer_dynsample.data.text.store.TextStore` the sampler, the collate and the model
see: every source's sampled rows, source after source, then every source's given negatives, each source's
labels shifted past the previous sources' so that no two sources share a label.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from composer_dynsample.data.text.store import TextStore
from composer_dynsample.data.text.tokenized import TokenStore

__all__ = ["ConcatTokenStore", "concat_text_stores"]


class ConcatTokenStore(TokenStore):
    """Token stores read as one: text ``i`` of part ``p`` is text ``starts[p] + i``.

    Pickling keeps the parts, each of which keeps only its folder's path.

    Args:
        parts (Sequence[TokenStore]): The stores, in order.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from composer_dynsample.data.text.tokenized import TokenStoreWriter
        >>> folders = [Path(tempfile.mkdtemp()) / name for name in ("a", "b")]
        >>> for folder, ids in zip(folders, ([2, 7, 3], [4, 5])):
        ...     with TokenStoreWriter(folder, {"max_length": 8}) as writer:
        ...         writer.append(np.array(ids), np.array([len(ids)]), np.array([len(ids)]))
        >>> both = ConcatTokenStore([TokenStore(folder) for folder in folders])
        >>> len(both), both.row(1).tolist(), both.pad(np.array([1, 0]), pad_id=0)[0].tolist()
        (2, [4, 5], [[4, 5, 0], [2, 7, 3]])
    """

    def __init__(
        self, parts: Sequence[TokenStore]
    ) -> None:  # no folder of its own: TokenStore's is not called
        self.parts = tuple(parts)
        if not self.parts or not all(isinstance(part, TokenStore) for part in self.parts):
            raise ValueError("parts must be a non-empty sequence of TokenStore.")
        sizes = np.asarray([len(part) for part in self.parts], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.text_hash = np.concatenate([np.asarray(part.text_hash) for part in self.parts])
        lengths = [part.max_length for part in self.parts]
        self.meta: dict[str, Any] = {
            "num_texts": int(self.starts[-1]),
            "num_tokens": sum(part.num_tokens for part in self.parts),
            "num_truncated": sum(part.num_truncated for part in self.parts),
            "max_length": None if None in lengths else max(lengths),  # type: ignore[type-var]
        }
        self.directory = self.parts[0].directory
        self.from_cache = all(part.from_cache for part in self.parts)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self.parts)!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"parts": self.parts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["parts"])  # type: ignore[misc]

    def _locate(self, text_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each text's part and its id within that part."""
        part = np.searchsorted(self.starts, text_ids, side="right") - 1
        return part, text_ids - self.starts[part]

    def lengths(self) -> np.ndarray:
        """``int64`` ``(len,)``: each text's number of tokens."""
        return np.concatenate([part.lengths() for part in self.parts])

    def row(self, text_id: int) -> np.ndarray:
        """The token ids of one text (a read-only view)."""
        part, local = self._locate(np.asarray([int(text_id)]))
        return self.parts[int(part[0])].row(int(local[0]))

    def pad(
        self, text_ids: np.ndarray, pad_id: int, pad_to_multiple_of: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Gather texts of any parts and right-pad them to the longest, as :meth:`TokenStore.pad`."""
        text_ids = np.asarray(text_ids, dtype=np.int64)
        part, local = self._locate(text_ids)
        padded = [
            (at, *self.parts[p].pad(local[at], pad_id, pad_to_multiple_of))
            for p in np.unique(part)
            for at in [part == p]
        ]
        width = max((ids.shape[1] for _, ids, _ in padded), default=0)
        input_ids = np.full((text_ids.size, width), pad_id, np.int64)
        mask = np.zeros((text_ids.size, width), np.int64)
        for at, ids, attention in padded:
            input_ids[at, : ids.shape[1]], mask[at, : ids.shape[1]] = ids, attention
        return input_ids, mask


def concat_text_stores(
    stores: Sequence[TextStore], names: Sequence[str], label_offsets: Sequence[int]
) -> tuple[dict[str, Any], np.ndarray]:
    """The :class:`TextStore` arguments of several sources' stores as one, and each source's first sampled row.

    The sampled rows come first, source after source, then the given negatives, source after source (a
    given negative is reached only through its anchor, whose row in the result points at it). Source
    ``s``'s labels are shifted by ``label_offsets[s]`` (the number of classes of the sources before it),
    so no label names a class of two sources.

    Raises:
        ValueError: If a store has a second tokenizer for passages (two towers).
    """
    for name, store in zip(names, stores, strict=True):
        if store.passage_tokens is not None:
            raise ValueError(
                f"source {name!r} has a second tokenizer for passages (two towers), which a mix of sources "
                "does not take yet; train the two-tower model on one source."
            )
    text_starts = np.concatenate([[0], np.cumsum([len(s.tokens) for s in stores])])
    sampled_starts = np.concatenate([[0], np.cumsum([s.num_sampled for s in stores])])
    given_starts = sampled_starts[-1] + np.concatenate(
        [[0], np.cumsum([s.num_rows - s.num_sampled for s in stores])]
    )
    keys = ("text", "label", "query", "source", "prompt")
    parts: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {key: ([], []) for key in keys}
    offsets, negatives = [np.zeros(1, np.int64)], []
    for p, store in enumerate(stores):
        prompt = (
            store.prompt_lengths if store.prompt_lengths is not None else np.zeros(store.num_rows, np.int64)
        )
        for key, values in (
            ("text", store.text_ids + text_starts[p]),
            ("label", store.row_labels + int(label_offsets[p])),
            ("query", store.is_query),
            ("source", store.source_rows),
            ("prompt", prompt),
        ):
            parts[key][0].append(np.asarray(values)[: store.num_sampled])  # sampled rows
            parts[key][1].append(np.asarray(values)[store.num_sampled :])  # given negatives
        # A given negative's row moves from num_sampled + j of its store to given_starts[p] + j.
        negatives.append(store.negative_rows - store.num_sampled + given_starts[p])
        offsets.append(store.negative_offsets[1:] + offsets[-1][-1])
    joined = {key: np.concatenate(heads + tails) for key, (heads, tails) in parts.items()}
    arguments = {
        "tokens": ConcatTokenStore([store.tokens for store in stores]),
        "text_ids": joined["text"],
        "row_labels": joined["label"],
        "pad_id": stores[0].pad_id,
        "vocab_size": stores[0].vocab_size,
        "num_sampled": int(sampled_starts[-1]),
        "is_query": joined["query"],
        "negatives": (np.concatenate(offsets), np.concatenate(negatives)),
        "source_rows": joined["source"],
        "prompt_lengths": joined["prompt"] if any(s.prompt_lengths is not None for s in stores) else None,
    }
    return arguments, sampled_starts[:-1].astype(np.int64)
