"""Which texts are the same text: their normalised form, its hash, and the numbering of distinct texts.

Two texts are one when :func:`normalise_text` makes them equal (NFKC, case-folded, whitespace collapsed);
:func:`text_hash` is a 63-bit hash of that form, what a batch's ``text_hash`` holds so that duplicates are
found without the texts; :class:`TextInterner` numbers the distinct texts of a table, so a text repeated
in the data is tokenized once (:mod:`~composer_dynsample.data.text.tokenized`).

:func:`text_groups` goes one step further for pairs: labels that share any text (one docstring over two
functions, one passage answering two queries) are one group, and so are labels linked through a chain of
shared texts. Every text of a group is a positive of the group's anchors, never a negative of them: a
batch's ``text_group`` holds the group of each row, which a loss or miner given it as duplicate ids masks
(:mod:`composer_dynsample.mining.duplicates`), in the batch, the cross-rank pool and the memory alike, since
the id itself carries the group.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterator, Sequence

import numpy as np

__all__ = ["TextInterner", "normalise_text", "text_groups", "text_hash"]


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


def text_groups(labels: np.ndarray, hashes: np.ndarray, num_labelled: int | None = None) -> np.ndarray:
    """Each row's group: the smallest text hash among the labels linked to its label by shared texts.

    The first ``num_labelled`` rows (default: all) are labelled rows; a label and every text hash it holds
    are one node each of a graph whose edges are those rows, and a group is a connected component of it.
    Its id is the smallest hash in it, so the same data gives the same ids on every rank and machine, and
    a group of one label with texts found nowhere else is simply that label's smallest hash. A row past
    ``num_labelled`` (a given negative, which no sampler draws) takes the group of its text when a labelled
    row holds that text, else its own hash.

    Example:
        >>> labels, hashes = np.array([0, 0, 1, 1, 2, 2]), np.array([10, 20, 10, 30, 40, 50])
        >>> text_groups(labels, hashes).tolist()  # labels 0 and 1 share text 10: one group
        [10, 10, 10, 10, 40, 40]
        >>> text_groups(np.array([0, 0, 7]), np.array([5, 6, 6]), num_labelled=2).tolist()
        [5, 5, 5]
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    labels, hashes = np.asarray(labels, np.int64), np.asarray(hashes, np.int64)
    count = len(labels) if num_labelled is None else num_labelled
    groups = hashes.copy()
    if count == 0:
        return groups
    label_ids = np.unique(labels[:count], return_inverse=True)[1].reshape(-1)
    text_values, text_ids = np.unique(hashes[:count], return_inverse=True)
    text_ids = text_ids.reshape(-1)
    num_labels = int(label_ids.max()) + 1
    nodes = num_labels + len(text_values)
    graph = coo_matrix((np.ones(count, np.int8), (label_ids, num_labels + text_ids)), shape=(nodes, nodes))
    _, component = connected_components(graph, directed=False)
    smallest = np.full(int(component.max()) + 1, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(smallest, component[num_labels:], text_values)
    groups[:count] = smallest[component[label_ids]]
    rest = hashes[count:]
    if len(rest):
        at = np.clip(np.searchsorted(text_values, rest), 0, len(text_values) - 1)
        known = text_values[at] == rest
        groups[count:] = np.where(known, smallest[component[num_labels + at]], rest)
    return groups
