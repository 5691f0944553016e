"""Texts encoded truncated to ``max_length`` tokens, a long text cut to a character budget first.

A tokenizer encodes a whole text before it truncates it (a 50 MB line takes a minute and gigabytes),
so a longer text is first cut to a character budget: ``max_length`` times the characters one token
can cover (its longest vocabulary entry, at least 16) times 4 (:func:`char_budget`). Every text so cut
counts as truncated. The cut is kept when the cut text's encoding overflows ``max_length`` and every
token kept lies in a word before the cut text's last one, the only word a cut can change (words as the
tokenizer's pre-tokenizer splits them): then the tokens kept are exactly the whole text's. Otherwise
(long whitespace runs, characters the normaliser drops, one word running from the kept tokens past the
cut) the text is encoded again with 4 times the budget, up to 64 times, and cut there regardless. So
a text that fits in ``max_length`` tokens is never cut, unless it is longer than 64 budgets; a text
gets other ids than the whole text would only if its first 64 budgets hold fewer than ``max_length``
tokens or a word that long. (A tokenizer without a pre-tokenizer keeps any cut that overflows.)
:func:`~composer_dynsample.data.text.text_identity.text_hash` still hashes the whole text.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["TruncatingEncoder", "char_budget", "encode_chunk"]

_CHARS_PER_TOKEN = 16  # the fewest characters a token is assumed to cover when budgeting a text
_BUDGET_SAFETY = 4  # the budget's margin over max_length tokens of the longest vocabulary entry
_BUDGET_GROWTH = 4  # a cut text that did not overflow is encoded again with this many times the budget
_BUDGET_RETRIES = 3  # ... at most this many times: up to 4**3 = 64 budgets


def char_budget(tokenizer: Any, max_length: int) -> int:
    """The characters a text is cut to before it is encoded: ``max_length`` times the longest vocabulary
    entry (at least 16 characters) times 4; see the module docstring for why nothing that fits is lost.

    Example:
        >>> from composer_dynsample.data.text.tokenizer import train_tokenizer
        >>> char_budget(train_tokenizer(["a b c", "a b"], vocab_size=64), max_length=8)
        512
    """
    longest = max(map(len, tokenizer.get_vocab(with_added_tokens=True)), default=0)
    return int(max_length) * max(_CHARS_PER_TOKEN, longest) * _BUDGET_SAFETY


@dataclasses.dataclass(frozen=True)
class TruncatingEncoder:
    """A truncating ``tokenizers.Tokenizer`` and the character budget of the texts it is given.

    Attributes:
        tokenizer (tokenizers.Tokenizer): Truncates to ``max_length`` tokens, pads nothing.
        budget (int): The characters a text is cut to before it is encoded (:func:`char_budget`).
    """

    tokenizer: Any
    budget: int

    @classmethod
    def of(cls, tokenizer: Any, max_length: int) -> TruncatingEncoder:
        """A copy of ``tokenizer`` that truncates to ``max_length`` tokens; ``tokenizer`` is left unchanged."""
        from tokenizers import Tokenizer

        encoder = Tokenizer.from_str(tokenizer.to_str())
        encoder.no_padding()
        encoder.enable_truncation(max_length)
        return cls(encoder, char_budget(encoder, max_length))


def encode_chunk(encoder: TruncatingEncoder, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """Encode one chunk of texts; a text longer than the encoder's budget is cut first (:func:`_encode_cut`).

    Args:
        encoder (TruncatingEncoder): The tokenizer and the budget.
        texts (Sequence[str]): The texts.

    Returns:
        tuple[np.ndarray, np.ndarray, int]: The ``int64`` ids of all texts, concatenated; each text's
        number of ids; and how many texts were truncated (overflowing ``max_length``, or cut).
    """
    tokenizer, budget = encoder.tokenizer, encoder.budget
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # no offsets: faster
    encodings: list[Any] = [None] * len(texts)
    whole = [i for i, text in enumerate(texts) if len(text) <= budget]
    for i, encoding in zip(whole, encode([texts[i] for i in whole]), strict=True):
        encodings[i] = encoding
    cut = _encode_cut(
        tokenizer, texts, [i for i, text in enumerate(texts) if len(text) > budget], budget, encodings
    )
    id_lists = [encoding.ids for encoding in encodings]
    lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    ids = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int64, count=int(lengths.sum()))
    truncated = sum(1 for i, encoding in enumerate(encodings) if encoding.overflowing or i in cut)
    return ids, lengths, truncated


def _encode_cut(
    tokenizer: Any, texts: Sequence[str], pending: list[int], budget: int, encodings: list[Any]
) -> set[int]:
    """Encode texts ``pending`` cut to ``budget`` characters into ``encodings``; return those still cut.

    A cut is kept when the encoding is what the whole text's would be (:func:`_cut_is_exact`); otherwise
    the text is encoded again with 4 times the budget, 3 times at most, and the last cut is kept.
    """
    split = tokenizer.pre_tokenizer is not None  # without a pre-tokenizer, the whole text is one word
    cut: set[int] = set()
    for attempt in range(_BUDGET_RETRIES + 1):
        if not pending:
            break
        again = []
        for i, encoding in zip(
            pending, tokenizer.encode_batch([texts[i][:budget] for i in pending]), strict=True
        ):
            encodings[i] = encoding
            if len(texts[i]) <= budget:
                continue  # encoded whole
            if attempt == _BUDGET_RETRIES or _cut_is_exact(encoding, split):
                cut.add(i)
            else:
                again.append(i)
        pending, budget = again, budget * _BUDGET_GROWTH
    return cut


def _cut_is_exact(encoding: Any, split: bool) -> bool:
    """Whether the tokens kept of a cut text's encoding are the whole text's: it overflows, and the
    tokens kept all lie in words before its last one, the only word the cut can have changed."""
    if not encoding.overflowing:
        return False  # the whole text might fit: more of it is needed to tell
    if not split:
        return True
    kept = [word for word in encoding.word_ids if word is not None]
    rest = [word for part in encoding.overflowing for word in part.word_ids if word is not None]
    return bool(kept and rest) and max(kept) < max(rest)
