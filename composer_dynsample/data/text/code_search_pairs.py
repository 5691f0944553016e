"""The code-search corpus as text pairs: :func:`load_code_search` builds it once and loads it like any pairs file.

:func:`~composer_dynsample.data.text.code_search.build_code_search` writes (or reads back from its cache) the
docstring -> code pairs of the Python installed here, split by package into ``train.jsonl`` and
``test.jsonl``; :func:`~composer_dynsample.data.text.pairs.load_pairs` then reads them as anchor (query) /
positive (code) pairs, the test packages never seen in training. The same recipe trains on a user's
own pairs with ``data: {name: pairs, path: my_pairs.jsonl}``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Unpack

from composer_dynsample.data.text._sources import PairTokenizeKeywords
from composer_dynsample.data.text.code_search import CorpusKeywords, build_code_search
from composer_dynsample.data.text.pairs import load_pairs
from composer_dynsample.data.text.store import TextSplits
from composer_dynsample.validation import check_keywords

__all__ = ["CodeSearchKeywords", "load_code_search", "token_cache_dir"]


def token_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path | None:
    """Where :func:`load_code_search` keeps its token stores: ``cache_dir/text`` (``None``: the text loaders'
    default)."""
    return Path(cache_dir).expanduser() / "text" if cache_dir is not None else None


class CodeSearchKeywords(CorpusKeywords, PairTokenizeKeywords, total=False):
    """The keywords of :func:`load_code_search` besides ``max_length`` and ``prompts``: what corpus
    :func:`~composer_dynsample.data.text.code_search.build_code_search` builds, and how
    :func:`~composer_dynsample.data.text.pairs.load_pairs` tokenizes it."""


def load_code_search(
    *,
    max_length: int = 128,
    prompts: Mapping[str, str] | None = None,
    **options: Unpack[CodeSearchKeywords],
) -> TextSplits:
    """Build (or read back) the code-search corpus and load it as pairs: queries (anchors) and code.

    Args:
        max_length (int): Truncate queries and code to this many tokens, special tokens included, at
            least 2. Default: ``128``.
        prompts (Mapping[str, str], optional): A prompt before the queries (``anchor``) and the code
            (``positive``), as :func:`~composer_dynsample.data.text.pairs.load_pairs` takes them.
        **options: Which corpus, as :func:`~composer_dynsample.data.text.code_search.build_code_search`
            takes it (``groups``, ``max_pairs_per_group``, ``test_fraction``, ``seed``, ``min_query_words``,
            ``min_code_lines``, ``constraints``, ``kind``, ``keep_repeats``, ``stdlib``, ``distributions``),
            and how it is tokenized, as :func:`~composer_dynsample.data.text.pairs.load_pairs` takes it (a
            tokenizer is trained on the training packages; ``passage_tokenizer`` tokenizes the code), with
            their defaults, but for two: ``cache_dir`` is the cache root, the corpus going to
            ``code_search/`` and the token stores to ``text/`` (default:
            :func:`~composer_dynsample.data.default_cache_dir`), and ``progress`` shows progress while
            reading sources as well as while tokenizing.

    Returns:
        TextSplits: The pairs of the training packages and of the test packages, named ``code_search``.

    Example:
        >>> splits = load_code_search(groups=["stdlib:json", "stdlib:csv"], max_pairs_per_group=20,
        ...                           test_fraction=0.5, vocab_size=256)  # doctest: +SKIP
        >>> splits.test_protocol  # doctest: +SKIP
        'queries_vs_passages'
    """
    check_keywords("load_code_search", options, CodeSearchKeywords)
    corpus = {key: value for key, value in options.items() if key in CorpusKeywords.__optional_keys__}
    tokenize = {key: value for key, value in options.items() if key not in corpus}
    cache_dir, progress = tokenize.get("cache_dir"), tokenize.get("progress")
    root = Path(cache_dir).expanduser() if cache_dir is not None else None
    built = build_code_search(
        root / "code_search" if root is not None else None, progress=progress is not False, **corpus
    )
    return load_pairs(
        built.train_path,
        test_path=built.test_path,
        max_length=max_length,
        name="code_search",
        prompts=prompts,
        **{**tokenize, "cache_dir": token_cache_dir(cache_dir)},
    )
