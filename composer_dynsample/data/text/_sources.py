"""What the text loaders share: their tokenizer options, and a table's distinct texts tokenized into a
cached token store.

:func:`~composer_dynsample.data.text.pairs.load_pairs` and
:func:`~composer_dynsample.data.text.texts.load_texts` take the same tokenizer and cache arguments
(:class:`TokenizeOptions` documents them) and each describe the texts of a table as a
:class:`TextSource` (a :class:`~composer_dynsample.data.text.pairs.PairTable` is one);
:func:`tokenize_sources` keys each store by the table's bytes, the tokenizer and the layout, as
:func:`~composer_dynsample.data.text.tokenized.tokenize_texts` documents.

A tokenizer whose vocabulary does not fit the data (a folder's vocabulary file left behind, a vocabulary
of another language) encodes most words as its unknown token and trains a model that ranks at chance.
So the first source's store (the training table's) is checked once it is built or read back, cheaply,
on its ids: if more than half the tokens of a sample of 1000 of its texts (special tokens left out) are
the unknown token, the data is refused in one line. A tokenizer trained on the training split has
every character of it in its vocabulary, and a tokenizer made for text or code rarely maps more than a
few percent of it to the unknown token. A test table is not checked: on tiny data, a tokenizer trained
on the training split may well have never seen most characters of the test texts.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypedDict

import numpy as np

from composer_dynsample.data.text.cache import text_cache_dir
from composer_dynsample.data.text.tokenized import TokenStore, tokenize_texts
from composer_dynsample.data.text.tokenizer import TextTokenizer, resolve_tokenizer
from composer_dynsample.validation import check_float, check_int

if TYPE_CHECKING:
    from composer_dynsample.data.text.table import TextTable

__all__ = [
    "PairTokenizeKeywords",
    "TextSource",
    "TokenizeKeywords",
    "TokenizeOptions",
    "check_loader_options",
    "check_unknown_tokens",
    "tokenize_sources",
]

_UNKNOWN_SAMPLE = 1000  # texts sampled, evenly spaced, to count the unknown token in
_UNKNOWN_LIMIT = 0.5  # refuse a tokenizer that maps more than this fraction of their tokens to it


def check_loader_options(max_length: int, test_fraction: float | None, seed: int) -> None:
    """The options every text loader shares: ``max_length`` >= 2, ``seed`` >= 0, ``test_fraction`` in (0, 1)."""
    check_int("max_length", max_length, minimum=2)
    check_int("seed", seed, minimum=0)
    if test_fraction is not None:
        check_float(
            "test_fraction", test_fraction, minimum=0, maximum=1, strict_minimum=True, strict_maximum=True
        )


class TokenizeKeywords(TypedDict, total=False):
    """The keywords a text loader hands to :class:`TokenizeOptions` as they are (its ``**options:
    Unpack[TokenizeKeywords]``, PEP 692): their meaning and defaults are the attributes of the same names
    there. ``max_length``, which a loader checks and reports itself, stays a parameter of its own."""

    tokenizer: str | os.PathLike[str] | None
    tokenizer_model: str
    vocab_size: int
    lowercase: bool
    save_tokenizer: str | os.PathLike[str] | None
    cache_dir: str | os.PathLike[str] | None
    progress: bool | None


class PairTokenizeKeywords(TokenizeKeywords, total=False):
    """:class:`TokenizeKeywords` and ``passage_tokenizer``, the passage tower's own tokenizer, which the
    loaders of pairs take."""

    passage_tokenizer: str | os.PathLike[str] | None


@dataclasses.dataclass(frozen=True)
class TokenizeOptions:
    """How a text loader tokenizes its tables and where it caches them: the arguments of the same names
    that :func:`~composer_dynsample.data.text.pairs.load_pairs` and
    :func:`~composer_dynsample.data.text.texts.load_texts` share.

    Attributes:
        max_length (int): Truncate texts to this many tokens, special tokens included, at least 2
            (truncations are counted and reported once). Default: ``128``.
        tokenizer (str | os.PathLike, optional): A local ``tokenizer.json`` or model folder. Default:
            ``None``: train one on the training split
            (:func:`~composer_dynsample.data.text.tokenizer.train_tokenizer`).
        tokenizer_model (str): ``"wordpiece"`` or ``"bpe"``, when training. Default: ``"wordpiece"``.
        vocab_size (int): The trained vocabulary's size. Default: ``8192``.
        lowercase (bool): Lower-case texts in a trained tokenizer. Default: ``True``.
        save_tokenizer (str | os.PathLike, optional): Write the tokenizer's JSON here. Default: ``None``.
        cache_dir (str | os.PathLike, optional): Where token stores and trained tokenizers are cached.
            Default: ``default_cache_dir()/text``.
        progress (bool, optional): Progress bar while tokenizing; ``None`` shows one on a terminal only.
        passage_tokenizer (str | os.PathLike, optional): A second tokenizer (a ``tokenizer.json`` or model
            folder), the passage tower's when two towers tokenize otherwise: :meth:`tokenize_passages` tokenizes
            the same texts with it. Default: ``None``.
    """

    max_length: int = 128
    tokenizer: str | os.PathLike[str] | None = None
    tokenizer_model: str = "wordpiece"
    vocab_size: int = 8192
    lowercase: bool = True
    save_tokenizer: str | os.PathLike[str] | None = None
    cache_dir: str | os.PathLike[str] | None = None
    progress: bool | None = None
    passage_tokenizer: str | os.PathLike[str] | None = None

    def tokenize_passages(
        self, sources: Sequence[TextSource]
    ) -> tuple[TextTokenizer, list[TokenStore]] | None:
        """With ``passage_tokenizer``, it and each source's token store by it (cached as any store); else ``None``."""
        if self.passage_tokenizer is None:
            return None
        cache = text_cache_dir(self.cache_dir)
        passage = resolve_tokenizer(self.passage_tokenizer, [], cache_dir=cache, model=self.tokenizer_model)
        return passage, tokenize_sources(
            sources, passage, max_length=self.max_length, cache_dir=cache, progress=self.progress
        )

    def tokenize(
        self, sources: Sequence[TextSource], train_texts: Sequence[str]
    ) -> tuple[TextTokenizer, list[TokenStore]]:
        """The tokenizer (given, or trained on ``train_texts``) and each source's cached token store.

        Args:
            sources (Sequence[TextSource]): The tables' texts, the training table's first.
            train_texts (Sequence[str]): The training split's texts, used only to train a tokenizer.

        Returns:
            tuple[TextTokenizer, list[TokenStore]]: The tokenizer, and the stores in the order of ``sources``.

        Raises:
            FileNotFoundError: If ``tokenizer`` does not exist.
            ValueError: If the tokenizer is not usable or does not fit the data, or a text encodes to no
                tokens (:func:`tokenize_sources`).
            TokenCacheError: If ``cache_dir`` must be written and cannot be.
        """
        cache = text_cache_dir(self.cache_dir)
        text_tokenizer = resolve_tokenizer(
            self.tokenizer,
            train_texts,
            cache_dir=cache,
            model=self.tokenizer_model,
            vocab_size=self.vocab_size,
            lowercase=self.lowercase,
            save_path=self.save_tokenizer,
        )
        stores = tokenize_sources(
            sources, text_tokenizer, max_length=self.max_length, cache_dir=cache, progress=self.progress
        )
        return text_tokenizer, stores


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
    """One cached :class:`~composer_dynsample.data.text.tokenized.TokenStore` per source, in order.

    Args:
        sources (Sequence[TextSource]): The tables' texts, the training table's first.
        tokenizer (TextTokenizer): The tokenizer (its JSON's SHA-256 keys the cache).
        max_length (int): Truncate every text to this many tokens, special tokens included.
        cache_dir (str | os.PathLike): Where the store folders go.
        progress (bool, optional): Show a progress bar; ``None`` shows one only on a terminal.

    Returns:
        list[TokenStore]: The stores, read back from the cache where they were there.

    Raises:
        ValueError: If a text encodes to no tokens, or the tokenizer maps most tokens of the first
            source to its unknown token (:func:`check_unknown_tokens`).
        TokenCacheError: If a store must be built and ``cache_dir`` cannot be written, or a cached
            store is damaged.
    """
    # TokenizeOptions.tokenize calls this directly: the stacklevel of tokenize_texts's truncation warning
    # counts on it.
    stores = [
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
    if stores:
        check_unknown_tokens(stores[0], tokenizer, str(sources[0].table.path))
    return stores


def check_unknown_tokens(store: TokenStore, tokenizer: TextTokenizer, source: str) -> None:
    """Refuse ``tokenizer`` if it maps most tokens of a sample of ``store``'s texts to its unknown token.

    The sample is 1000 texts evenly spaced over the store; special tokens are not counted.

    Args:
        store (TokenStore): The texts of ``source``, tokenized by ``tokenizer``.
        tokenizer (TextTokenizer): The tokenizer.
        source (str): The data file, for the message.

    Raises:
        ValueError: If more than half the tokens of the sample are the unknown token.
    """
    unknown = tokenizer.unknown_token
    if unknown is None or not len(store):
        return
    unknown_id = tokenizer.tokenizer.token_to_id(unknown)
    rows = np.unique(np.linspace(0, len(store) - 1, num=min(len(store), _UNKNOWN_SAMPLE)).astype(np.int64))
    ids = np.concatenate([np.asarray(store.row(int(row))) for row in rows]).astype(np.int64)
    special = np.fromiter(tokenizer.special_ids - {unknown_id}, dtype=np.int64)
    ids = ids[~np.isin(ids, special)]
    fraction = float(np.mean(ids == unknown_id)) if ids.size else 0.0
    if fraction > _UNKNOWN_LIMIT:
        raise ValueError(
            f"tokenizer {tokenizer.source} maps {fraction:.0%} of the tokens of a sample of {len(rows)} "
            f"texts of {source} to {unknown}: its vocabulary does not fit this data. Give the tokenizer "
            "of the model meant for it (a folder needs its vocabulary file), or leave the tokenizer out "
            "to train one on the data."
        )
