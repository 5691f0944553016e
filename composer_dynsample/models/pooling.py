"""Token states to one vector per text, in every mode of sentence-transformers' ``Pooling``.

A sentence-transformers folder names its pooling in ``1_Pooling/config.json``; a model that pools
otherwise than its folder embeds otherwise than ``SentenceTransformer(folder).encode``, so
:class:`~composer_dynsample.models.transformer.TransformerEncoder` pools in each of those modes, computed
as sentence-transformers computes them (tested against its ``Pooling`` to 1e-6):

* ``cls``: the first attended position's state (the ``[CLS]`` token of a right-padded row);
* ``max`` and ``mean``: the maximum and the mean over the attended positions;
* ``mean_sqrt_len_tokens``: their sum over the square root of their number;
* ``weightedmean``: the mean weighted by position, 1 for the first attended token, 2 for the next...;
* ``lasttoken``: the last attended position's state, found from the mask, so that right and left
  padding both give the text's last token (decoder embedding models pool so).

Several modes joined by ``+`` (``"mean+max"``) are concatenated in the order named, as
sentence-transformers concatenates a ``pooling_mode`` list (its ``pooling_mode_*`` flags, of older
folders, name them in :data:`POOLING_MODES`' order).

A prompt at the start of each text (an instruction such as ``"query: "``) can be left out of the
pooling, as sentence-transformers' ``include_prompt=False`` leaves it: ``prompt_length`` counts, per row,
the positions from the row's first attended one that the prompt fills, the leading special token
(``[CLS]``, ``<s>``) included, and those positions are masked before pooling; ``cls`` then takes the first
token after the prompt and ``weightedmean`` keeps the other tokens' weights. The count is
sentence-transformers' own: the prompt tokenized alone, less its trailing special token (``[SEP]``).

The mask-based modes reuse :func:`~composer_dynsample.models.tokens.masked_mean_pool` and
:func:`~composer_dynsample.models.tokens.masked_max_pool`; a row with no attended position pools to
zeros, except ``cls`` (the first position's state, as sentence-transformers) and ``max`` (zeros where
sentence-transformers gives ``-inf``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from composer_dynsample.models.sentence_folder import POOLING_FLAGS
from composer_dynsample.models.tokens import masked_max_pool, masked_mean_pool
from composer_dynsample.validation import InputTypeError, describe

__all__ = [
    "POOLING_MODES",
    "exclude_prompt",
    "pool_tokens",
    "pooling_modes",
    "prompt_lengths",
]

# sentence-transformers' modes, in the order of its pooling_mode_* flags.
POOLING_MODES: tuple[str, ...] = tuple(POOLING_FLAGS.values())


def pooling_modes(pooling: object, key: str = "pooling") -> tuple[str, ...]:
    """The modes of ``pooling``: one of :data:`POOLING_MODES`, or several joined by ``+``.

    Args:
        pooling (object): A mode (``"mean"``), several (``"mean+max"``), or a sequence of modes (a
            ``pooling_mode`` list of sentence-transformers).
        key (str): The name the error gives ``pooling`` (``"model.encoder.pooling"`` in a config).
            Default: ``"pooling"``.

    Returns:
        tuple[str, ...]: The modes, in the order named.

    Raises:
        ValueError: If ``pooling`` names no mode or one that is not in :data:`POOLING_MODES`.

    Example:
        >>> pooling_modes("mean+max")
        ('mean', 'max')
        >>> pooling_modes("avg")
        Traceback (most recent call last):
            ...
        ValueError: pooling must be one of ('cls', 'max', 'mean', 'mean_sqrt_len_tokens', 'weightedmean', 'lasttoken') or several joined by '+' (such as 'mean+max'), got 'avg'.
    """
    if isinstance(pooling, str):
        modes = tuple(pooling.split("+"))
    elif isinstance(pooling, Sequence) and all(isinstance(mode, str) for mode in pooling):
        modes = tuple(pooling)
    else:
        modes = ()
    if not modes or any(mode not in POOLING_MODES for mode in modes):
        raise ValueError(
            f"{key} must be one of {POOLING_MODES} or several joined by '+' (such as 'mean+max'), "
            f"got {pooling!r}."
        )
    return modes


def prompt_lengths(features: Any, rows: int, owner: str) -> torch.Tensor | None:
    """The ``prompt_length`` of text features, checked: a ``(B,)`` integer tensor, or ``None`` when absent.

    Only the dtype and the shape are checked (nothing is read from the device).

    Args:
        features (Any): The encoder's features (a mapping; anything else holds no prompt lengths).
        rows (int): The batch size ``B``.
        owner (str): The encoder's name, for the error message.

    Returns:
        torch.Tensor | None: ``features["prompt_length"]``, or ``None`` when the key is absent or ``None``.

    Raises:
        InputTypeError: If ``prompt_length`` is not a ``(B,)`` integer tensor.

    Example:
        >>> prompt_lengths({"prompt_length": torch.tensor([3, 0])}, 2, "Encoder").tolist()
        [3, 0]
        >>> prompt_lengths({}, 2, "Encoder") is None
        True
    """
    value = features.get("prompt_length") if isinstance(features, Mapping) else None
    if value is None:
        return None
    if (
        not isinstance(value, torch.Tensor)
        or value.is_floating_point()
        or value.is_complex()
        or value.dtype == torch.bool
        or tuple(value.shape) != (rows,)
    ):
        raise InputTypeError(
            f"{owner}: prompt_length must be a ({rows},) integer tensor (each row's prompt tokens), "
            f"got {describe(value)}."
        )
    return value


def _first_attended(mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` index of each row's first attended position (0 for a row with none), as
    sentence-transformers finds it: the padding before it is a left-padded row's."""
    return mask.to(torch.int32).argmax(dim=1)


def exclude_prompt(mask: torch.Tensor, prompt_length: torch.Tensor) -> torch.Tensor:
    """``mask`` with each row's prompt positions set to 0: ``prompt_length`` positions from its first
    attended one, after any left padding (sentence-transformers' ``include_prompt=False``).

    Args:
        mask (torch.Tensor): ``(B, T)`` attention mask, right- or left-padded.
        prompt_length (torch.Tensor): ``(B,)`` integer count of each row's prompt positions (0: none).

    Returns:
        torch.Tensor: A new mask of ``mask``'s dtype; ``mask`` is left as it is.

    Example:
        >>> exclude_prompt(torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]]), torch.tensor([2, 1])).tolist()
        [[0, 0, 1, 0], [0, 0, 1, 1]]
    """
    positions = torch.arange(mask.shape[1], device=mask.device)
    start = _first_attended(mask) + prompt_length.to(mask.device)
    return mask.masked_fill(positions[None, :] < start[:, None], 0)


def _at(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``hidden[b, index[b]]`` for each row ``b``: ``(B, H)``."""
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), index]


def _last_token(hidden: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """The state at each row's last attended position (zeros for a row with none)."""
    positions = torch.arange(kept.shape[1], device=kept.device)
    last = torch.where(kept.bool(), positions[None, :], -1).amax(dim=1)
    pooled = _at(hidden, last.clamp(min=0))
    return pooled * (last >= 0).unsqueeze(1).to(pooled.dtype)


def _mode(mode: str, hidden: torch.Tensor, mask: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """One mode's ``(B, H)`` pooling of ``hidden`` over ``kept`` (``mask`` less the prompt)."""
    if mode == "cls":
        return _at(hidden, _first_attended(kept))
    if mode == "max":
        return masked_max_pool(hidden, kept)
    if mode == "mean":
        return masked_mean_pool(hidden, kept)
    if mode == "mean_sqrt_len_tokens":  # the sum over sqrt(count): the mean times sqrt(count)
        count = kept.sum(dim=1, keepdim=True).to(hidden.dtype).clamp(min=1e-9)
        return masked_mean_pool(hidden, kept) * count.sqrt()
    if mode == "weightedmean":  # weights 1, 2, ... from the first attended token, the prompt's included
        positions = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=hidden.dtype)
        weights = positions[None, :] - _first_attended(mask)[:, None].to(hidden.dtype)
        return masked_mean_pool(hidden, weights * kept.to(hidden.dtype))
    return _last_token(hidden, kept)


def pool_tokens(
    hidden: torch.Tensor,
    mask: torch.Tensor,
    pooling: str | Sequence[str] = "mean",
    *,
    prompt_length: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pool last hidden states to one vector per row, as sentence-transformers' ``Pooling`` does.

    Args:
        hidden (torch.Tensor): ``(B, T, H)`` last hidden states.
        mask (torch.Tensor): ``(B, T)`` attention mask (1 or ``True`` at a token), right- or left-padded.
        pooling (str | Sequence[str]): A mode of :data:`POOLING_MODES`, several joined by ``+``
            (concatenated in that order), or a sequence of modes. Default: ``"mean"``.
        prompt_length (torch.Tensor, optional): ``(B,)`` integer count of each row's prompt positions,
            left out of the pooling (see the module docstring). Default: ``None``, every token pooled.

    Returns:
        torch.Tensor: ``(B, H * number of modes)``.

    Raises:
        ValueError: If ``pooling`` names an unknown mode.

    Example:
        >>> hidden = torch.tensor([[[1.0], [3.0], [100.0]], [[0.0], [2.0], [4.0]]])
        >>> mask = torch.tensor([[1, 1, 0], [0, 1, 1]])  # right- and left-padded
        >>> pool_tokens(hidden, mask, "cls+mean+lasttoken").tolist()
        [[1.0, 2.0, 3.0], [2.0, 3.0, 4.0]]
        >>> pool_tokens(hidden, mask, "mean", prompt_length=torch.tensor([1, 1])).tolist()
        [[3.0], [4.0]]
    """
    modes = pooling_modes(pooling)
    kept = mask if prompt_length is None else exclude_prompt(mask, prompt_length)
    pooled = [_mode(mode, hidden, mask, kept) for mode in modes]
    return pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=-1)
