"""Reading a tensor out of ``state.batch``, as the algorithms' ``*_key`` options describe it."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from composer.core import State


def batch_tensor(
    state: State, key: str | int | None, dict_key: str, index: int
) -> tuple[torch.Tensor | None, str | int]:
    """The tensor at ``key`` of the batch (``dict_key`` of a dict batch, ``index`` of a sequence, when
    ``key`` is ``None``), or ``None`` when there is none, and the key looked at."""
    if key is None:
        key = dict_key if isinstance(state.batch, Mapping) else index
    try:
        value = state.batch_get_item(key)
    except (KeyError, IndexError, TypeError):
        value = None
    return (value if isinstance(value, torch.Tensor) else None), key
