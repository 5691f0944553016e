"""The one way to read a tensor out of a Composer batch or outputs, as the ``*_key`` options describe it.

The source is a Composer ``State`` (its ``batch`` is read) or the batch or outputs themselves: a dict, a
list or tuple, a tensor, or anything Composer's ``batch_get`` indexes. A key is what
``State.batch_get_item`` takes (a dict key, an index, an attribute name, a getter). Without one, the
defaults apply: ``dict_key`` in a dict, ``index`` in a list or tuple, and, when the caller gives neither,
the source itself (outputs that are the embeddings tensor). A tensor batch has no default place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from composer.core import State
from composer.utils.batch_helpers import batch_get

from composer_dynsample.validation import describe

__all__ = ["batch_rows", "batch_tensor", "find_in_batch"]

_MISSING = object()


def _container(source: Any) -> Any:
    return source.batch if isinstance(source, State) else source


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _lookup(source: Any, key: Any, dict_key: str | None, index: int | None) -> tuple[Any, Any, Any]:
    """``(container, the value or _MISSING, the key looked at)``."""
    container = _container(source)
    if key is None:
        if dict_key is None and index is None:
            return container, container, None
        key = dict_key if isinstance(container, Mapping) else index if _is_sequence(container) else None
        if key is None:
            return container, _MISSING, None
    try:
        return container, batch_get(container, key), key
    except (KeyError, IndexError, TypeError, AttributeError):  # batch_get tries attributes last
        return container, _MISSING, key


def batch_tensor(
    source: Any, key: Any, dict_key: str | None = None, index: int | None = None
) -> tuple[torch.Tensor | None, Any]:
    """The tensor at ``key`` (see the module's docstring), or ``None`` when there is none, and the key looked at.

    Example:
        >>> batch_tensor((torch.zeros(2, 3), torch.tensor([4, 5])), None, "labels", 1)
        (tensor([4, 5]), 1)
        >>> batch_tensor({"features": torch.zeros(2, 3)}, None, "labels", 1)
        (None, 'labels')
    """
    _, value, key = _lookup(source, key, dict_key, index)
    return (value if isinstance(value, torch.Tensor) else None), key


def find_in_batch(
    source: Any,
    key: Any,
    dict_key: str | None = None,
    index: int | None = None,
    *,
    owner: str,
    what: str,
    advice: str,
    where: str = "state.batch",
    tensor: bool = True,
) -> Any:
    """The tensor (any value, with ``tensor=False``) at ``key``, else a ``ValueError`` saying what was looked for.

    Args:
        source: A ``State`` or the batch or outputs themselves.
        key: Where the value is; ``None`` for the defaults.
        dict_key (str, optional): The default key of a dict. Default: none.
        index (int, optional): The default index of a list or tuple. Default: none.
        owner (str): Who looks, e.g. ``"HardNegativeMining"``.
        what (str): What is looked for, e.g. ``"the labels"``.
        advice (str): The message's last sentence: how to point the key at it.
        where (str): What to call the source in the message. Default: ``"state.batch"``.
        tensor (bool): Require a tensor; ``False`` takes any value there is (features may be a mapping).
            Default: ``True``.

    Example:
        >>> find_in_batch({"labels": torch.tensor([1])}, "label", owner="HardNegativeMining",
        ...               what="the labels", advice="Set labels_key to where it is.")
        Traceback (most recent call last):
            ...
        ValueError: HardNegativeMining looked for the labels at state.batch['label'] and found nothing; state.batch is a dict with keys ['labels']. Set labels_key to where it is.
    """
    container, value, key = _lookup(source, key, dict_key, index)
    if value is not _MISSING and (isinstance(value, torch.Tensor) or not tensor):
        return value
    place = where if key is None else f"{where}[{key!r}]"
    found = "nothing" if value is _MISSING else describe(value)
    if isinstance(container, Mapping):
        shape = f"a dict with keys {sorted(map(str, container))}"
    elif _is_sequence(container):
        shape = f"a {type(container).__name__} of {len(container)} items"
    else:
        shape = describe(container)
    raise ValueError(f"{owner} looked for {what} at {place} and found {found}; {where} is {shape}. {advice}")


def batch_rows(source: Any) -> int | None:
    """The rows of the first tensor with a batch dimension: the source itself, or the first such value of a
    dict or item of a list or tuple (a ``State``'s batch for a ``State``); ``None`` when there is none.

    Example:
        >>> batch_rows({"index": torch.tensor(0), "labels": torch.tensor([1, 2])}), batch_rows(None)
        (2, None)
    """
    batch = _container(source)
    values = batch.values() if isinstance(batch, Mapping) else batch if _is_sequence(batch) else (batch,)
    return next((int(v.shape[0]) for v in values if isinstance(v, torch.Tensor) and v.ndim > 0), None)
