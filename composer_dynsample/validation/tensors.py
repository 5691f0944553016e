"""The checks of tensors: embeddings, labels (:func:`as_labels` of any 1-D integer input), and a reference
pool beside a batch. See :mod:`composer_dynsample.validation`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from composer_dynsample.validation.values import InputTypeError, check_choice, describe

if TYPE_CHECKING:
    import torch

__all__ = ["LABEL_MESSAGES", "as_labels", "check_embeddings", "check_labels", "check_pool"]


def check_embeddings(name: str, value: object, *, finite: bool = True) -> torch.Tensor:
    """Return ``value`` if it is a ``(N, D)`` floating-point tensor with ``D >= 1`` (finite if asked).

    A non-tensor or non-float tensor raises :class:`InputTypeError`; a wrong shape or NaN/inf a
    ``ValueError``.

    Example:
        >>> import torch
        >>> check_embeddings("embeddings", torch.zeros(3, 2)).shape
        torch.Size([3, 2])
        >>> check_embeddings("embeddings", torch.zeros(3))
        Traceback (most recent call last):
            ...
        ValueError: embeddings must be a 2-D floating-point tensor (num_items, dim), got a tensor of shape (3,) and dtype torch.float32.
    """
    import torch

    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        raise InputTypeError(
            f"{name} must be a 2-D floating-point tensor (num_items, dim), got {describe(value)}."
        )
    if value.ndim != 2 or value.shape[1] == 0:
        raise ValueError(
            f"{name} must be a 2-D floating-point tensor (num_items, dim), got {describe(value)}."
        )
    # min and max propagate NaN and expose +-inf: one fused reduction instead of an isfinite pass (a host read;
    # a training step checks finiteness on the device instead and passes finite=False).
    if finite and value.numel() > 0 and not _all_finite(value):
        raise ValueError(f"{name} contain NaN or inf.")
    return value


def _all_finite(value: torch.Tensor) -> bool:
    import torch

    return bool(torch.isfinite(torch.stack(torch.aminmax(value))).all())


_LENGTH_MESSAGE = "{name} has {count} entries but {items_name} has {num_items} rows; they must match."

#: The messages of :func:`as_labels`, by the check that failed; a caller may word any of them its own way.
LABEL_MESSAGES = {
    "dtype": "{name} must hold integers, got {got}.",
    "ndim": "{name} must be 1-D, got shape {shape}.",
    "length": _LENGTH_MESSAGE,
}


def _is_integer_dtype(dtype: object) -> bool:
    """Whether a numpy or torch dtype holds integers (``bool`` does not)."""
    if isinstance(dtype, np.dtype):
        return bool(np.issubdtype(dtype, np.integer))
    return not (dtype.is_floating_point or dtype.is_complex or str(dtype) == "torch.bool")  # type: ignore[attr-defined]


def check_labels(
    name: str, value: object, num_items: int | None = None, items_name: str = ""
) -> torch.Tensor:
    """Return ``value`` if it is a 1-D integer tensor (of ``num_items`` entries when given).

    For labels that are tensors already, e.g. in a training step: the tensor is returned as it is, on its
    device, and nothing is copied or synchronised. Labels a user hands over as a list, a numpy array or a
    tensor, to be stored, go through :func:`as_labels`.

    A non-tensor or a tensor of another dtype raises :class:`InputTypeError`; another shape or length a
    ``ValueError``.

    Example:
        >>> import torch
        >>> check_labels("labels", torch.tensor([0, 1]), 3, "embeddings")
        Traceback (most recent call last):
            ...
        ValueError: labels has 2 entries but embeddings has 3 rows; they must match.
    """
    import torch

    if not isinstance(value, torch.Tensor) or not _is_integer_dtype(value.dtype):
        raise InputTypeError(f"{name} must be a 1-D integer tensor, got {describe(value)}.")
    if value.ndim != 1:
        raise ValueError(f"{name} must be a 1-D integer tensor, got {describe(value)}.")
    if num_items is not None and value.shape[0] != num_items:
        count = value.shape[0]
        raise ValueError(
            _LENGTH_MESSAGE.format(name=name, count=count, num_items=num_items, items_name=items_name)
        )
    return value


def as_labels(
    name: str,
    value: object,
    num_items: int | None = None,
    items_name: str = "",
    *,
    to: str = "numpy",
    messages: Mapping[str, str] | None = None,
) -> np.ndarray | torch.Tensor:
    """Convert 1-D integer labels (a list, a numpy array or a tensor on any device) to int64 on the CPU.

    For labels (or indices) a user hands over to be stored, by a sampler, a dataset or a file loader;
    tensors a training step holds are checked by :func:`check_labels`. An empty sequence counts as integers.
    A wrong dtype, shape or length (``num_items`` entries, those of ``items_name``) raises ``ValueError``.

    Args:
        to (str): ``"numpy"`` (an array) or ``"torch"`` (a contiguous tensor). A list or an array is
            converted first, so that a wrong dtype is named as that type names it. Default: ``"numpy"``.
        messages (Mapping[str, str], optional): Replaces some of :data:`LABEL_MESSAGES`, format strings
            over ``name``, ``got`` (``"dtype float64"``, ``"a tensor of dtype torch.float32"``, ``"an
            array of Python objects"``), ``dtype`` (the input's own), ``shape``, ``count``, ``num_items``
            and ``items_name``. Default: none.

    Example:
        >>> as_labels("labels", [3, 1, 3])
        array([3, 1, 3])
        >>> as_labels("labels", [0.0, 1.0], to="torch")
        Traceback (most recent call last):
            ...
        ValueError: labels must hold integers, got dtype torch.float64.
    """
    import torch

    check_choice("to", to, ("numpy", "torch"))
    if isinstance(value, torch.Tensor):
        labels: np.ndarray | torch.Tensor = value.detach().cpu().to_dense()
        dtype, got = value.dtype, f"a tensor of dtype {value.dtype}"
    else:
        labels = np.asarray(value)
        if labels.size == 0:
            labels = labels.astype(np.int64)  # np.asarray([]) is float64
        dtype = labels.dtype
        if to == "torch" and dtype.kind in "biufc":  # numbers: named, and checked, as torch names them
            labels = torch.from_numpy(labels.copy())
        got = "an array of Python objects" if dtype.kind == "O" else f"dtype {labels.dtype}"
    wording = {**LABEL_MESSAGES, **(messages or {})}
    fields = {"name": name, "got": got, "dtype": dtype, "shape": tuple(labels.shape)}
    if not _is_integer_dtype(labels.dtype):
        raise ValueError(wording["dtype"].format(**fields))
    if labels.ndim != 1:
        raise ValueError(wording["ndim"].format(**fields))
    if num_items is not None and labels.shape[0] != num_items:
        count = labels.shape[0]
        raise ValueError(
            wording["length"].format(**fields, count=count, num_items=num_items, items_name=items_name)
        )
    if to == "torch":
        return torch.as_tensor(labels).to(torch.int64).contiguous()
    array = labels.numpy() if isinstance(labels, torch.Tensor) else labels
    return array.astype(np.int64, copy=False)


def check_pool(
    batch: tuple[object, object],
    pool: tuple[object, object],
    names: tuple[str, str, str, str],
    *,
    finite: bool = True,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Check a batch ``(embeddings, labels)`` and its optional pool of reference rows ``(embeddings, labels)``.

    Both halves of the pool are given or neither; each half is checked like the batch, and the pool
    has the batch's dimension. ``names`` are the four arguments' names, as the caller spells them.

    Returns:
        The checked pool, or ``None`` when neither half is given.

    Example:
        >>> import torch
        >>> names = ("embeddings", "labels", "ref_emb", "ref_labels")
        >>> batch = (torch.zeros(3, 2), torch.tensor([0, 0, 1]))
        >>> check_pool(batch, (None, None), names) is None
        True
        >>> check_pool(batch, (torch.zeros(4, 5), torch.zeros(4, dtype=torch.long)), names)
        Traceback (most recent call last):
            ...
        ValueError: ref_emb has dimension 5 but embeddings 2; they must match.
    """
    emb_name, labels_name, ref_name, ref_labels_name = names
    embeddings = check_embeddings(emb_name, batch[0], finite=finite)
    check_labels(labels_name, batch[1], embeddings.shape[0], emb_name)
    ref_embeddings, ref_labels = pool
    if (ref_embeddings is None) != (ref_labels is None):
        given, missing = (ref_name, ref_labels_name) if ref_labels is None else (ref_labels_name, ref_name)
        raise ValueError(
            f"{ref_name} and {ref_labels_name} must be given together: {given} was given without {missing}."
        )
    if ref_embeddings is None:
        return None
    ref_embeddings = check_embeddings(ref_name, ref_embeddings, finite=finite)
    ref_labels = check_labels(ref_labels_name, ref_labels, ref_embeddings.shape[0], ref_name)
    if ref_embeddings.shape[1] != embeddings.shape[1]:
        raise ValueError(
            f"{ref_name} has dimension {ref_embeddings.shape[1]} but {emb_name} {embeddings.shape[1]}; "
            "they must match."
        )
    return ref_embeddings, ref_labels
