"""Index-only datasets, a gathering collate function and dataset loaders.

``Dataset.__getitem__`` returns ``(index, label)`` and nothing else; the ``collate_fn`` gathers the
whole batch from a preloaded :class:`TensorStore` in one indexing operation::

    from torch.utils.data import DataLoader
    from composer_dynsample.data import GatherCollate, IndexDataset, load_mnist1d

    splits = load_mnist1d()  # train (4000, 40), test (1000, 40), 10 classes; cached after the first call
    loader = DataLoader(
        IndexDataset(splits.train.labels),
        batch_sampler=batch_sampler,  # e.g. a P x K sampler built from the same labels
        collate_fn=GatherCollate(splits.train),
    )
    # each batch: {"index": int64 (B,), "features": float32 (B, 40), "labels": int64 (B,)}

Loaders (:func:`load_mnist1d`, :func:`load_digits`, :func:`load_glyphs`, :func:`load_file`,
:func:`load_image_folder`) return a :class:`DatasetSplits`; the file formats are described in
:mod:`composer_dynsample.data.files`; splits.py holds :class:`DatasetSplits` and :func:`stratified_split`.

Texts take the same path with a :class:`TextStore` (token ids in memory-mapped files) and
:class:`TextCollate`, whose batches are ``{"index", "features": {"input_ids", "attention_mask",
"is_query"}, "labels", "text_hash"}``; Composer sizes them through :func:`text_data_spec`. The text
loaders return :class:`TextSplits`: :func:`load_pairs` (anchor/positive/negative pairs),
:func:`load_texts` (labelled texts) and :func:`load_code_search` (docstring -> code pairs of the
Python installed here); they live in :mod:`composer_dynsample.data.text`. Every name is imported on first
use (PEP 562): a run loads the loader of its own data only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from composer_dynsample._lazy import lazy_exports

# Each defining module and the public names it provides: a text recipe never loads the image and glyph
# loaders, nor an array recipe the text loaders.
_MODULES: dict[str, str] = {
    "composer_dynsample.data.digits": "load_digits",
    "composer_dynsample.data.files": "load_file",
    "composer_dynsample.data.glyphs": "GlyphCacheError GlyphInfo GlyphSplits load_glyphs",
    "composer_dynsample.data.images": "load_image_folder",
    "composer_dynsample.data.mnist1d": "load_mnist1d",
    "composer_dynsample.data.splits": "DatasetSplits default_cache_dir stratified_split",
    "composer_dynsample.data.store": "GatherCollate IndexDataset TensorStore Unsqueeze",
    "composer_dynsample.data.text": "TextCollate TextInfo TextSplits TextStore load_code_search load_pairs "
    "load_texts text_data_spec",
}

__all__ = [
    "DatasetSplits",
    "GatherCollate",
    "GlyphCacheError",
    "GlyphInfo",
    "GlyphSplits",
    "IndexDataset",
    "TensorStore",
    "TextCollate",
    "TextInfo",
    "TextSplits",
    "TextStore",
    "Unsqueeze",
    "default_cache_dir",
    "load_code_search",
    "load_digits",
    "load_file",
    "load_glyphs",
    "load_image_folder",
    "load_mnist1d",
    "load_pairs",
    "load_texts",
    "stratified_split",
    "text_data_spec",
]

if TYPE_CHECKING:
    from composer_dynsample.data.digits import load_digits
    from composer_dynsample.data.files import load_file
    from composer_dynsample.data.glyphs import GlyphCacheError, GlyphInfo, GlyphSplits, load_glyphs
    from composer_dynsample.data.images import load_image_folder
    from composer_dynsample.data.mnist1d import load_mnist1d
    from composer_dynsample.data.splits import DatasetSplits, default_cache_dir, stratified_split
    from composer_dynsample.data.store import GatherCollate, IndexDataset, TensorStore, Unsqueeze
    from composer_dynsample.data.text import (
        TextCollate,
        TextInfo,
        TextSplits,
        TextStore,
        load_code_search,
        load_pairs,
        load_texts,
        text_data_spec,
    )

__getattr__, __dir__ = lazy_exports(__name__, _MODULES, globals())
