"""The tokenizer an export saves: any tokenizer the project trains with, as a ``transformers`` one.

The tokenizer may be a ``tokenizers.Tokenizer``, the path of its ``tokenizer.json``, or a ``transformers``
tokenizer (:func:`pretrained_tokenizer`); its special tokens (``[PAD]``, ``[CLS]``, ...) are found in its
vocabulary unless given. Two towers of two tokenizers save the passage tower's with the passage tower
(:func:`tower_tokenizer`). ``transformers`` and ``tokenizers`` are imported when a function runs.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from composer_dynsample.models.text import import_text_extra
from composer_dynsample.validation import InputTypeError, check_int, is_int

__all__ = ["pretrained_tokenizer", "tower_tokenizer"]

# Each special token's role and the spellings looked up in the vocabulary (BERT's, then RoBERTa's).
_SPECIAL_TOKENS = {
    "unk_token": ("[UNK]", "<unk>"),
    "pad_token": ("[PAD]", "<pad>"),
    "cls_token": ("[CLS]", "<s>"),
    "sep_token": ("[SEP]", "</s>"),
    "mask_token": ("[MASK]", "<mask>"),
}


def pretrained_tokenizer(
    tokenizer: Any, *, special_tokens: Mapping[str, str] | None = None, model_max_length: int | None = None
) -> Any:
    """A ``transformers`` fast tokenizer for ``tokenizer``, ready for ``save_pretrained``.

    Args:
        tokenizer: A ``tokenizers.Tokenizer``; an object holding one as ``.tokenizer`` and its padding id
            as ``.pad_id`` (the text loaders' tokenizer); the path of a ``tokenizer.json``; or a
            ``transformers`` tokenizer (returned as it is, or as a copy with ``model_max_length``).
        special_tokens (Mapping[str, str], optional): Roles (``unk_token``, ``pad_token``, ``cls_token``,
            ``sep_token``, ``mask_token``) to tokens, over those found in the vocabulary (BERT's ``[PAD]``
            ... or RoBERTa's ``<pad>`` ...; the token the tokenizer pads with comes first).
            Default: ``None``.
        model_max_length (int, optional): The longest input in tokens (longer ones are truncated).
            Default: the tokenizer's truncation length, if any.

    Returns:
        A ``PreTrainedTokenizerFast`` sharing ``tokenizer``'s vocabulary, normalizer and post-processor.

    Raises:
        InputTypeError: If ``tokenizer`` is none of the above.
        ValueError: If a path does not exist, or a special token is not in the vocabulary.
    """
    transformers = import_text_extra("transformers", "pretrained_tokenizer")
    if model_max_length is not None:
        model_max_length = check_int("model_max_length", model_max_length, minimum=1)
    if isinstance(tokenizer, transformers.PreTrainedTokenizerBase):
        if model_max_length is None:
            return tokenizer
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.model_max_length = model_max_length
        return tokenizer
    backend, pad_id = _backend_tokenizer(tokenizer)
    roles = _found_special_tokens(backend, pad_id)
    for role, token in (special_tokens or {}).items():
        if role not in _SPECIAL_TOKENS:
            raise ValueError(f"special_tokens has the role {role!r}; valid roles: {sorted(_SPECIAL_TOKENS)}.")
        if backend.token_to_id(token) is None:
            raise ValueError(
                f"special_tokens[{role!r}] is {token!r}, which is not in the tokenizer's vocabulary."
            )
        roles[role] = token
    if model_max_length is None and backend.truncation is not None:
        model_max_length = backend.truncation["max_length"]
    extra = {} if model_max_length is None else {"model_max_length": int(model_max_length)}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **roles, **extra)


def _backend_tokenizer(tokenizer: Any) -> tuple[Any, int | None]:
    """The ``tokenizers.Tokenizer`` and the padding id, if the wrapper names one."""
    tokenizer_class = import_text_extra("tokenizers", "export").Tokenizer
    if isinstance(tokenizer, tokenizer_class):
        return tokenizer, None
    if isinstance(getattr(tokenizer, "tokenizer", None), tokenizer_class):
        pad_id = getattr(tokenizer, "pad_id", None)
        return tokenizer.tokenizer, pad_id if is_int(pad_id) else None
    if isinstance(tokenizer, (str, os.PathLike)):
        path = Path(tokenizer).expanduser()
        if not path.is_file():
            raise ValueError(f"tokenizer: {str(tokenizer)!r} is not a tokenizer.json file.")
        return tokenizer_class.from_file(str(path)), None
    raise InputTypeError(
        "tokenizer must be a tokenizers.Tokenizer, the path of a tokenizer.json or a transformers tokenizer, "
        f"got {type(tokenizer).__name__}."
    )


def _found_special_tokens(backend: Any, pad_id: int | None) -> dict[str, str]:
    roles = {
        role: next(token for token in spellings if backend.token_to_id(token) is not None)
        for role, spellings in _SPECIAL_TOKENS.items()
        if any(backend.token_to_id(token) is not None for token in spellings)
    }
    if backend.padding is not None:
        roles["pad_token"] = backend.padding["pad_token"]
    if pad_id is not None and backend.id_to_token(pad_id) is not None:
        roles["pad_token"] = backend.id_to_token(pad_id)
    return roles


def tower_tokenizer(name: str, tokenizer: Any, passage_tokenizer: Any) -> Any:
    """The tokenizer a tower (or route) is written with: ``passage_tokenizer``, when given, for the passage
    tower (``passage``, or the ``document`` route), else ``tokenizer``.

    Example:
        >>> tower_tokenizer("document", "shared", "passages"), tower_tokenizer("query", "shared", "passages")
        ('passages', 'shared')
    """
    passage = name in ("passage", "document") and passage_tokenizer is not None
    return passage_tokenizer if passage else tokenizer
