"""Which texts are the same text: their normalised form, its hash, and the numbering of distinct texts.

Two texts are one when :func:`normalise_text` makes them equal (NFKC, case-folded, whitespace collapsed);
:func:`text_hash` is a 63-bit hash of that form, what a batch's ``text_hash`` holds so that duplicates are
found without the texts; :class:`TextInterner` numbers the distinct texts of a table, so a text repeated
in the data is tokenized once (:mod:`~composer_dynsample.data.text.tokenized`).
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterator, Sequence

import numpy as np

__all__ = ["TextInterner", "normalise_text", "text_hash"]


def normalise_text(text: str) -> str:
    """The form two texts must share to count as identical: NFKC, case-folded, whitespace collapsed.

    Example:
        >>> normalise_text("  Hello\\n  WORLD ") == normalise_text("hello world")
        True
    """
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def text_hash(text: str) -> int:
    """A 63-bit hash (a non-negative int64) of :func:`normalise_text` of ``text``: BLAKE2b, 8 bytes.

    Example:
        >>> text_hash("Hello  world") == text_hash("hello world") != text_hash("hello")
        True
        >>> 0 <= text_hash("x") < 2**63
        True
    """
    digest = hashlib.blake2b(digest_size=8)
    for part in _normalised_parts(text):
        digest.update(part.encode("utf-8", "surrogatepass"))
    return int.from_bytes(digest.digest(), "little") >> 1


_HASH_CHUNK = 1 << 20  # characters normalised at a time by text_hash: bounds the memory a long text takes


def _normalised_parts(text: str, chunk: int = _HASH_CHUNK) -> Iterator[str]:
    """:func:`normalise_text` of ``text`` in pieces whose concatenation is the whole, a chunk at a time.

    A text is cut only just before an ASCII space: NFKC composes no character with a space and case
    folding has no context, so each piece normalises as it would within the whole, and no word spans two
    pieces. A text without such a space is normalised whole.
    """
    start, joined = 0, False
    while start < len(text):
        end = len(text) if len(text) - start <= chunk else text.find(" ", start + chunk)
        end = len(text) if end < 0 else end
        piece = normalise_text(text[start:end])
        if piece:
            yield (" " + piece) if joined else piece
            joined = True
        start = end


class TextInterner:
    """Number distinct texts in order of first appearance, so a text repeated in the data is tokenized once.

    Example:
        >>> interner = TextInterner()
        >>> [interner.add(text) for text in ("a", "b", "a")], interner.texts
        ([0, 1, 0], ['a', 'b'])
    """

    def __init__(self) -> None:
        self.texts: list[str] = []
        self._ids: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.texts)

    def add(self, text: str) -> int:
        """The id of ``text``, a new one if it was not seen before."""
        found = self._ids.get(text)
        if found is None:
            found = self._ids[text] = len(self.texts)
            self.texts.append(text)
        return found

    def add_all(self, texts: Sequence[str]) -> np.ndarray:
        """The ids of ``texts``, as ``int64``."""
        return np.fromiter(map(self.add, texts), dtype=np.int64, count=len(texts))
