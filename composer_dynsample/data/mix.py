"""Several data sets in one run: their splits side by side, their training rows as one store.

``data: {name: mix, sources: {NAME: {<a data section>, weight: W, sampler: {...}}, ...}}`` loads each
source as its own data section would (pairs, labelled texts, code search, streaming shards), then
:func:`mix_text_splits` joins them: the training rows of every source in one
:class:`MixedTextStore` (source after source; each source's labels shifted past the previous sources', so
labels never collide), which :class:`~composer_dynsample.samplers.mixed.MixedBatchSampler` draws batches of
one source from, and each source's own splits kept under :attr:`MixedSplits.sources`, which the evaluation
scores one by one. The sources share the model, so they share its tokenizer; each keeps its own
``max_length`` and prompts (its texts are tokenized into its own token store).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from composer_dynsample.data.text.concat import concat_text_stores
from composer_dynsample.data.text.store import TextInfo, TextSplits, TextStore

__all__ = ["MixedSplits", "MixedTextStore", "mix_text_splits"]


class MixedTextStore(TextStore):
    """The rows of several sources' text stores as one store.

    Sampled rows first, source after source, then the sources' given negatives (see
    :func:`~composer_dynsample.data.text.concat.concat_text_stores`).

    Args:
        stores (Mapping[str, TextStore]): Each source's store, by name, in order.
        label_offsets (Sequence[int]): What each source's labels are shifted by.

    Attributes:
        source_names (tuple[str, ...]): The sources, in order.
        source_stores (tuple[TextStore, ...]): Their own stores.
        row_starts (np.ndarray): Each source's first sampled row here; source ``s``'s sampled row ``i`` is
            row ``row_starts[s] + i``.
        label_offsets (np.ndarray): Each source's label shift.
        source_of_row (np.ndarray): ``(num_sampled,)`` each sampled row's source.
        row_sources (np.ndarray): ``(num_rows,)`` each row's source, the given negatives' too:
            :class:`~composer_dynsample.data.text.store.TextCollate` puts a batch's source name in its
            ``"source"`` when all its rows share one.
    """

    def __init__(self, stores: Mapping[str, TextStore], label_offsets: Sequence[int]) -> None:
        self.source_names = tuple(stores)
        self.source_stores = tuple(stores.values())
        arguments, self.row_starts = concat_text_stores(self.source_stores, self.source_names, label_offsets)
        super().__init__(**arguments)
        self.label_offsets = np.asarray(label_offsets, dtype=np.int64)
        sizes = [len(store) for store in self.source_stores]
        self.source_of_row = np.repeat(np.arange(len(sizes)), sizes)
        given = [store.num_rows - len(store) for store in self.source_stores]
        # every row's source, the given negatives' too: the collate names a batch's source (PerSourceLoss)
        self.row_sources = np.concatenate([self.source_of_row, np.repeat(np.arange(len(given)), given)])


@dataclasses.dataclass(frozen=True)
class MixedSplits(TextSplits):
    """The splits of a mix: the joined training rows (``train``), and each source's own splits.

    ``test`` joins the test splits the same way (each label the source's shifted one): what a
    checkpoint's data identity and the tokens read count; the evaluation scores each source's own test
    split (:attr:`sources`), never one source's queries against another's gallery.

    Attributes:
        sources (dict[str, TextSplits]): Each source's splits as its data section loads them, by name.
        sampling (str): How batches are drawn from the sources (``MixedBatchSampler``'s ``sampling``).
        weights (tuple[float, ...] | None): Each source's ``weight``, or ``None`` when no source gives one.
        batches_per_draw (int): Consecutive batches of one source (``MixedBatchSampler``).
    """

    sources: dict[str, TextSplits] = dataclasses.field(default_factory=dict, kw_only=True)
    sampling: str = dataclasses.field(default="proportional", kw_only=True)
    weights: tuple[float, ...] | None = dataclasses.field(default=None, kw_only=True)
    batches_per_draw: int = dataclasses.field(default=1, kw_only=True)


def mix_text_splits(
    sources: Mapping[str, TextSplits],
    *,
    sampling: str = "proportional",
    weights: Sequence[float] | None = None,
    batches_per_draw: int = 1,
) -> MixedSplits:
    """Join the sources' splits (see the module docstring).

    Raises:
        ValueError: If a source is not text data, or the sources were tokenized by different tokenizers.
    """
    names = list(sources)
    for name, splits in sources.items():
        if not isinstance(splits, TextSplits):
            raise ValueError(
                f"source {name!r} holds {type(splits.train).__name__} rows; a mix takes text sources (pairs, "
                "texts, code_search, streaming shards of texts)."
            )
    first = sources[names[0]].info
    for name in names[1:]:
        info = sources[name].info
        if info.tokenizer_sha256 != first.tokenizer_sha256:
            raise ValueError(
                f"source {name!r} is tokenized by {info.tokenizer} and source {names[0]!r} by "
                f"{first.tokenizer}: one model reads every source, so they take one tokenizer; leave "
                "tokenizer unset in every source (the model folder's) or give each the same one."
            )
    label_offsets = np.concatenate([[0], np.cumsum([s.num_classes for s in sources.values()])])[:-1]
    train = MixedTextStore({name: s.train for name, s in sources.items()}, label_offsets)
    test = MixedTextStore({name: s.test for name, s in sources.items()}, label_offsets)
    return MixedSplits(
        train,
        test,
        num_classes=int(sum(s.num_classes for s in sources.values())),
        name="mix(" + ", ".join(names) + ")",
        info=_joined_info([s.info for s in sources.values()]),
        test_protocol="mix",
        sources=dict(sources),
        sampling=sampling,
        weights=None if weights is None else tuple(float(w) for w in weights),
        batches_per_draw=batches_per_draw,
    )


def _joined_info(infos: Sequence[TextInfo]) -> TextInfo:
    """One :class:`TextInfo` of the sources': the shared tokenizer, every file and cache, the counts summed."""
    first = infos[0]
    summed: dict[str, Any] = {
        "max_length": max(info.max_length for info in infos),
        "split": ",".join(dict.fromkeys(info.split for info in infos)),
        "num_truncated": sum(info.num_truncated for info in infos),
        "cache_dirs": tuple(path for info in infos for path in info.cache_dirs),
        "from_cache": tuple(flag for info in infos for flag in info.from_cache),
        "num_negatives": tuple(sum(info.num_negatives[i] for info in infos) for i in (0, 1)),
        "num_missing_negatives": sum(info.num_missing_negatives for info in infos),
        "files": {path: digest for info in infos for path, digest in info.files.items()},
        "label_names": None,
        "num_train_classes": 0,
        "columns": {},
        # the sources' prompts where they agree (an exported model puts them before its texts), else none
        "prompts": dict(first.prompts) if all(info.prompts == first.prompts for info in infos) else {},
    }
    return dataclasses.replace(first, **summed)
