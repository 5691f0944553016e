"""The code-search corpus as text pairs: :func:`load_code_search` builds it once and loads it like any pairs file.

:func:`~composer_dynsample.data.text.code_search.build_code_search` writes (or reads back from its cache) the
docstring -> code pairs of the Python installed here, split by package into ``train.jsonl`` and
``test.jsonl``; :func:`~composer_dynsample.data.text.pairs.load_pairs` then reads them as anchor (query) /
positive (code) pairs, the test packages never seen in training. The same recipe trains on a user's
own pairs with ``data: {name: pairs, path: my_pairs.jsonl}``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from composer_dynsample.data.text.code_search import build_code_search
from composer_dynsample.data.text.pairs import load_pairs
from composer_dynsample.data.text.store import TextSplits

__all__ = ["load_code_search", "token_cache_dir"]


def token_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path | None:
    """Where :func:`load_code_search` keeps its token stores: ``cache_dir/text`` (``None``: the text loaders'
    default)."""
    return Path(cache_dir).expanduser() / "text" if cache_dir is not None else None


def load_code_search(
    *,
    groups: Sequence[str] | None = None,
    max_pairs_per_group: int | None = None,
    test_fraction: float = 0.1,
    seed: int = 0,
    min_query_words: int = 3,
    min_code_lines: int = 3,
    constraints: str | os.PathLike[str] | None = None,
    max_length: int = 128,
    tokenizer: str | os.PathLike[str] | None = None,
    tokenizer_model: str = "wordpiece",
    vocab_size: int = 8192,
    lowercase: bool = True,
    save_tokenizer: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
    prompts: Mapping[str, str] | None = None,
    passage_tokenizer: str | os.PathLike[str] | None = None,
) -> TextSplits:
    """Build (or read back) the code-search corpus and load it as pairs: queries (anchors) and code.

    Args:
        groups (Sequence[str], optional): Read only these packages (``stdlib:json``, ``numpy``): for tests
            and quick looks. Default: all.
        max_pairs_per_group (int, optional): Keep at most this many pairs of each package. Default: all.
        test_fraction (float): The share of pairs in the test packages, at most. Default: ``0.1``.
        seed (int): Seed of the package split. Default: ``0``.
        min_query_words (int): Shortest query kept, in words. Default: ``3``.
        min_code_lines (int): Shortest code kept, in lines. Default: ``3``.
        constraints (str | os.PathLike, optional): The ``constraints.txt`` whose pinned distributions are
            read besides the standard library. Default: the source checkout's, else every installed one.
        max_length, tokenizer, tokenizer_model, vocab_size, lowercase, save_tokenizer: How queries and code
            are tokenized, and their defaults, as
            :class:`~composer_dynsample.data.text._sources.TokenizeOptions` documents them (a tokenizer is
            trained on the training packages).
        cache_dir (str | os.PathLike, optional): The cache root: the corpus goes to ``code_search/``, the
            token stores to ``text/``. Default: :func:`~composer_dynsample.data.default_cache_dir`.
        progress (bool, optional): Progress while reading sources and tokenizing; ``None`` shows it on a
            terminal only.
        prompts (Mapping[str, str], optional): A prompt before the queries (``anchor``) and the code
            (``positive``), as :func:`~composer_dynsample.data.text.pairs.load_pairs` takes them.
        passage_tokenizer (str | os.PathLike, optional): A second tokenizer for the code, as
            :func:`~composer_dynsample.data.text.pairs.load_pairs` takes it.

    Returns:
        TextSplits: The pairs of the training packages and of the test packages, named ``code_search``.

    Example:
        >>> splits = load_code_search(groups=["stdlib:json", "stdlib:csv"], max_pairs_per_group=20,
        ...                           test_fraction=0.5, vocab_size=256)  # doctest: +SKIP
        >>> splits.test_protocol  # doctest: +SKIP
        'queries_vs_passages'
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else None
    corpus = build_code_search(
        root / "code_search" if root is not None else None,
        constraints=constraints,
        test_fraction=test_fraction,
        seed=seed,
        min_query_words=min_query_words,
        min_code_lines=min_code_lines,
        groups=groups,
        max_pairs_per_group=max_pairs_per_group,
        progress=progress is not False,
    )
    return load_pairs(
        corpus.train_path,
        test_path=corpus.test_path,
        max_length=max_length,
        tokenizer=tokenizer,
        tokenizer_model=tokenizer_model,
        vocab_size=vocab_size,
        lowercase=lowercase,
        save_tokenizer=save_tokenizer,
        cache_dir=token_cache_dir(cache_dir),
        progress=progress,
        name="code_search",
        prompts=prompts,
        passage_tokenizer=passage_tokenizer,
    )
