"""Texts on the index-only path: token ids in memory-mapped files, a padding collate and the text loaders.

- :class:`TextStore`, :class:`TextSplits`, :class:`TextInfo`, :class:`TextCollate` and
  :func:`text_data_spec` (:mod:`~composer_dynsample.data.text.store`): a split of texts and its batches
  ``{"index", "features": {"input_ids", "attention_mask", "is_query"}, "labels", "text_hash"}``;
- :func:`load_pairs` (anchor/positive/negative pairs) and :func:`load_texts` (labelled texts) read a
  user's file (:mod:`~composer_dynsample.data.text.table`) through one column mapping
  (:mod:`~composer_dynsample.data.text.columns`), with the tokenizer options they share
  (:class:`~composer_dynsample.data.text._sources.TokenizeOptions`);
- :func:`load_code_search`: docstring -> code pairs of the Python installed here;
- the token cache (:mod:`~composer_dynsample.data.text.tokenized`) and its folder
  (:mod:`~composer_dynsample.data.text.cache`), which texts are the same
  (:mod:`~composer_dynsample.data.text.text_identity`), the cut of a long text before it is encoded
  (:mod:`~composer_dynsample.data.text.truncation`) and the tokenizer a run uses
  (:mod:`~composer_dynsample.data.text.tokenizer`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from composer_dynsample._lazy import lazy_exports

# Each defining module and the public names it provides: a run that only batches texts (or none, as an
# array recipe's evaluation, which imports the store) does not load the file readers and the tokenizers.
_MODULES: dict[str, str] = {
    "composer_dynsample.data.text.code_search_pairs": "load_code_search",
    "composer_dynsample.data.text.pairs": "load_pairs",
    "composer_dynsample.data.text.data_spec": "text_data_spec",
    "composer_dynsample.data.text.store": "TextCollate TextInfo TextSplits TextStore",
    "composer_dynsample.data.text.texts": "load_texts",
}

__all__ = [
    "TextCollate",
    "TextInfo",
    "TextSplits",
    "TextStore",
    "load_code_search",
    "load_pairs",
    "load_texts",
    "text_data_spec",
]

if TYPE_CHECKING:
    from composer_dynsample.data.text.code_search_pairs import load_code_search
    from composer_dynsample.data.text.data_spec import text_data_spec
    from composer_dynsample.data.text.pairs import load_pairs
    from composer_dynsample.data.text.store import TextCollate, TextInfo, TextSplits, TextStore
    from composer_dynsample.data.text.texts import load_texts

__getattr__, __dir__ = lazy_exports(__name__, _MODULES, globals())
