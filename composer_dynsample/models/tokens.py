"""What the text encoders share: the ``[text]`` extra's imports, checked token ids, masked pooling.

* :func:`import_text_extra`: import a module of the ``[text]`` extra, or say in one line how to install it.
* :func:`token_inputs`: ``(input_ids, attention_mask)`` from the text collate's features, checked
  against the encoder's ``vocab_size``.
* :func:`masked_mean_pool` and :func:`masked_max_pool`: pooling over the positions a mask keeps.

The encoders of :mod:`~composer_dynsample.models.text` and :mod:`~composer_dynsample.models.transformer`
also share the optional output projection and the positive-integer check of their sizes.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from composer_dynsample.validation import InputTypeError, check_int, describe

__all__ = [
    "import_text_extra",
    "length_groups",
    "masked_max_pool",
    "masked_mean_pool",
    "range_checked_after",
    "token_inputs",
]


def import_text_extra(module: str, needed_by: str) -> Any:
    """Import ``module`` of the ``[text]`` extra, or raise a one-line ``ImportError`` saying how to install it.

    Example:
        >>> import_text_extra("tokenizers", "a test").__name__
        'tokenizers'
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"{needed_by} needs {module.split('.')[0]}, part of the [text] extra: "
            "pip install 'composer-dynsample[text]'."
        ) from None


def range_checked_after(ids: torch.Tensor) -> bool:
    """Whether an encoder that has checked ``ids`` may skip the check of the next batches: on an accelerator,
    where each check reads the device (the ids come from one tokenizer, and an embedding lookup out of range
    still fails there); never on the CPU, where it reads nothing.

    Example:
        >>> range_checked_after(torch.tensor([[1, 2]]))
        False
    """
    return ids.device.type != "cpu"


def token_inputs(
    features: Any, owner: str, vocab_size: int, *, check_range: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check and return ``(input_ids, attention_mask)`` from text features.

    Args:
        features: A mapping with ``input_ids`` and (optionally) ``attention_mask``, or a ``(B, L)`` tensor
            of ids (then every position is a token).
        owner (str): The encoder's name, for the error messages.
        vocab_size (int): Ids must lie in ``[0, vocab_size)``.
        check_range (bool): Check that they do. Ids in host memory are checked there (numpy: no device
            read); ids on an accelerator are read from it, so an encoder checks only the first batch it
            sees there (:func:`range_checked_after`). Default: ``True``.

    Returns:
        The ``(B, L)`` ids and the ``(B, L)`` mask, as given (the mask is all ones when absent).

    Raises:
        InputTypeError: If the ids or the mask are not integer (or bool) tensors of one shape.
        ValueError: If an id lies outside ``[0, vocab_size)``.

    Example:
        >>> ids, mask = token_inputs({"input_ids": torch.tensor([[2, 5, 0]])}, "Encoder", 10)
        >>> mask.tolist()
        [[1, 1, 1]]
        >>> token_inputs(torch.tensor([[2, 12]]), "Encoder", 10)
        Traceback (most recent call last):
            ...
        ValueError: Encoder: input_ids hold token id 12 but vocab_size is 10; build the encoder with the tokenizer's vocab_size (the data's).
    """
    if isinstance(features, Mapping):
        if "input_ids" not in features:
            raise InputTypeError(f"{owner}: the features have keys {sorted(features)}, missing 'input_ids'.")
        ids, mask = features["input_ids"], features.get("attention_mask")
    else:
        ids, mask = features, None
    if not _integer_tensor(ids) or ids.ndim != 2:
        raise InputTypeError(f"{owner}: input_ids must be a (B, L) integer tensor, got {describe(ids)}.")
    if mask is None:
        mask = torch.ones_like(ids)
    elif not (_integer_tensor(mask) or mask.dtype == torch.bool) or mask.shape != ids.shape:
        raise InputTypeError(
            f"{owner}: attention_mask must be an integer or bool tensor of the ids' shape "
            f"{tuple(ids.shape)}, got {describe(mask)}."
        )
    if ids.numel() and check_range:
        if ids.device.type == "cpu":
            host = ids.numpy()
            low, high = int(host.min()), int(host.max())
        else:
            low, high = (int(v) for v in torch.aminmax(ids))
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{owner}: input_ids hold token id {low if low < 0 else high} but vocab_size is {vocab_size}; "
                "build the encoder with the tokenizer's vocab_size (the data's)."
            )
    return ids, mask


def _integer_tensor(value: object) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and not value.is_floating_point()
        and not value.is_complex()
        and value.dtype != torch.bool
    )


def length_groups(mask: torch.Tensor, min_saving: float = 0.25) -> list[tuple[torch.Tensor, int]] | None:
    """Two groups of rows, shorter and longer, that pad to fewer positions than the batch as a whole.

    A batch of short queries and long passages padded to its longest row spends most of a transformer's
    work on the queries' padding. Sorted by length, the rows are cut where the two groups, each padded to
    its own longest row, hold the fewest positions; the cut is made when it saves at least ``min_saving``
    of the batch's positions. Only right-padded masks are grouped (each row's ones come first).

    The cut is a shape, so it is decided on the host: a mask in host memory is read there (numpy), a mask
    on an accelerator in one transfer of its row lengths at the start of the forward, where the queue holds
    little (the batch's copy and the last optimizer step); ``trim_padding=False`` reads nothing.

    Args:
        mask (torch.Tensor): ``(B, L)`` attention mask.
        min_saving (float): The least share of positions a cut must save. Default: ``0.25``.

    Returns:
        list[tuple[torch.Tensor, int]] | None: The row indices of the shorter and of the longer group (each
        sorted by length) with the group's longest row, or ``None`` when one group is as good.

    Example:
        >>> mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])
        >>> [(rows.tolist(), longest) for rows, longest in length_groups(mask)]
        [([2, 0], 2), ([1], 6)]
    """
    if mask.dim() != 2 or mask.shape[0] < 2:
        return None
    lengths = mask.sum(dim=1)
    positions = torch.arange(mask.shape[1], device=mask.device)
    right_padded = (mask.bool() == (positions[None, :] < lengths[:, None])).all()
    flagged = torch.cat([right_padded.reshape(1).to(lengths.dtype), lengths])
    host = flagged.numpy() if flagged.device.type == "cpu" else flagged.cpu().numpy()  # the one read
    if not host[0]:
        return None  # left padding or holes: the rows cannot be cut to a common width
    order = np.argsort(host[1:], kind="stable")
    ordered = host[1:][order]
    count, widest = len(ordered), int(ordered[-1])
    cuts = np.arange(1, count)
    cost = cuts * ordered[:-1] + (count - cuts) * widest  # rows before the cut padded to the cut's row
    best = int(np.argmin(cost))
    if float(cost[best]) > (1 - min_saving) * count * widest:
        return None
    cut = int(cuts[best])
    rows = torch.from_numpy(order).to(mask.device)
    return [(rows[:cut], int(ordered[cut - 1])), (rows[cut:], widest)]


def masked_mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` ``(B, L, D)`` over the positions where ``mask`` ``(B, L)`` is non-zero.

    Computed as sentence-transformers' ``Pooling(pooling_mode="mean")`` does, so an exported model embeds
    the same; a row without tokens gives zeros.

    Example:
        >>> hidden = torch.tensor([[[1.0], [3.0], [100.0]]])
        >>> masked_mean_pool(hidden, torch.tensor([[1, 1, 0]])).tolist()
        [[2.0]]
    """
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def masked_max_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Maximum of ``hidden`` ``(B, L, D)`` over the positions where ``mask`` is non-zero (zeros for none).

    Example:
        >>> hidden = torch.tensor([[[1.0], [3.0], [100.0]]])
        >>> masked_max_pool(hidden, torch.tensor([[1, 1, 0]])).tolist()
        [[3.0]]
    """
    present = mask.bool().unsqueeze(-1)
    pooled = hidden.masked_fill(~present, float("-inf")).amax(1)
    return torch.where(present.any(1), pooled, torch.zeros_like(pooled))


def _projection(in_features: int, embedding_dim: int | None) -> tuple[nn.Linear | None, int]:
    """The optional ``Linear(in_features, embedding_dim)`` and the encoder's output dimension."""
    if embedding_dim is None:
        return None, in_features
    dim = check_int("embedding_dim", embedding_dim, minimum=1)
    return nn.Linear(in_features, dim), dim  # type: ignore[arg-type]


def _positive(name: str, value: object) -> int:
    return check_int(name, value, minimum=1)  # type: ignore[return-value]
