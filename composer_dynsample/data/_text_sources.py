"""What the text loaders share: a table's distinct texts, tokenized into a cached token store.

:func:`~composer_dynsample.data.pairs.load_pairs` and :func:`~composer_dynsample.data.texts.load_texts`
each describe the texts of a table as a :class:`TextSource` (a :class:`~composer_dynsample.data.pairs.
PairTable` is one); :func:`tokenize_sources` keys each store by the table's bytes, the tokenizer and the
layout, as :func:`~composer_dynsample.data.tokenized.tokenize_texts` documents.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from composer_dynsample.data.tokenized import TokenStore, tokenize_texts

if TYPE_CHECKING:
    from composer_dynsample.data.text_table import TextTable
    from composer_dynsample.data.text_tokenizer import TextTokenizer

__all__ = ["TextSource", "tokenize_sources"]


class TextSource(Protocol):
    """The distinct texts of one table, as a text loader tokenizes them.

    Attributes:
        table (TextTable): The table they were read from: its bytes' SHA-256 keys the cache, its path
            names it in messages.
        texts (Sequence[str]): The distinct texts; text ``i`` is row ``i`` of the token store.
        layout (str): Which columns made ``texts``, and how (part of the cache key).
    """

    @property
    def table(self) -> TextTable: ...

    @property
    def texts(self) -> Sequence[str]: ...

    @property
    def layout(self) -> str: ...

    def locate(self, text_id: int) -> str:
        """Where text ``text_id`` first appears in the table, for an error about it."""
        ...


def tokenize_sources(
    sources: Sequence[TextSource],
    tokenizer: TextTokenizer,
    *,
    max_length: int,
    cache_dir: str | os.PathLike[str],
    progress: bool | None,
) -> list[TokenStore]:
    """One cached :class:`~composer_dynsample.data.tokenized.TokenStore` per source, in order.

    Args:
        sources (Sequence[TextSource]): The tables' texts.
        tokenizer (TextTokenizer): The tokenizer (its JSON's SHA-256 keys the cache).
        max_length (int): Truncate every text to this many tokens, special tokens included.
        cache_dir (str | os.PathLike): Where the store folders go.
        progress (bool, optional): Show a progress bar; ``None`` shows one only on a terminal.

    Returns:
        list[TokenStore]: The stores, read back from the cache where they were there.
    """
    # The loaders call this directly: the stacklevel of tokenize_texts's truncation warning counts on it.
    return [
        tokenize_texts(
            source.texts,
            tokenizer.tokenizer,
            max_length=max_length,
            cache_dir=cache_dir,
            data_sha256=source.table.sha256,
            tokenizer_sha256=tokenizer.sha256,
            layout=source.layout,
            source=str(source.table.path),
            locate=source.locate,
            progress=progress,
        )
        for source in sources
    ]
