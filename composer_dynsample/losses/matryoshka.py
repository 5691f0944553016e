"""Matryoshka embeddings: one loss at several truncations of the embedding, so that its first dimensions
embed nearly as well as all of them (Kusupati et al. 2022, "Matryoshka Representation Learning").

A model trained so can be served at 64 or 128 dimensions, a fraction of the index and of the search, for
little loss of quality. :class:`MatryoshkaLoss` wraps any loss of this package (or of
pytorch-metric-learning, called as they are) and computes it on the first ``d`` dimensions of the
embeddings for each ``d`` of ``matryoshka_dims``, each truncation L2-normalised again, and returns the
weighted sum: sentence-transformers' ``MatryoshkaLoss`` with its default ``n_dims_per_step=-1`` (every
dimension at every step). The weights are not renormalised (four dimensions of weight 1 give four times
the loss, as there), and sentence-transformers' random subset of the dimensions per step
(``n_dims_per_step > 0``) is not offered: every step trains every dimension.

Mining is not repeated per dimension: the ``indices_tuple`` of the miners (mined on the full embeddings
at ``AFTER_FORWARD``, or implied by the mined-negatives samplers' batches) is used at every truncation,
and a pool beyond the batch (``ref_emb``: the other ranks' rows, a cross-batch memory) is truncated as the
embeddings are. :class:`~composer_dynsample.EmbeddingModel` calls the wrapper as it calls the loss it
wraps (``global_mean``, duplicate ids and query flags reach the inner loss when it takes them), and with
``forward_chunk_size`` (GradCache) the wrapper sees the whole batch's embeddings as any loss does.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, Final

import torch
import torch.nn.functional as F
from torch import nn

from composer_dynsample.losses.tuple_losses import forward_takes
from composer_dynsample.losses.wrapper import LossCall, LossWrapper
from composer_dynsample.validation import InputTypeError, check_bool, is_int

__all__ = ["MatryoshkaLoss", "check_matryoshka_dims", "check_matryoshka_weights", "truncated"]

#: The keyword arguments :class:`~composer_dynsample.EmbeddingModel` may pass, forwarded when the inner
#: loss's ``forward`` takes them.
_PASSED_ON: Final[tuple[str, ...]] = (
    "global_mean", "duplicate_ids", "ref_duplicate_ids", "is_query", "values_checked",
)  # fmt: skip


def check_matryoshka_dims(dims: Any, name: str = "matryoshka_dims") -> tuple[int, ...]:
    """``dims`` as a tuple of positive integers in strictly descending order, else a one-line ValueError.

    Example:
        >>> check_matryoshka_dims([384, 128, 64])
        (384, 128, 64)
        >>> check_matryoshka_dims([64, 128])
        Traceback (most recent call last):
            ...
        ValueError: matryoshka_dims must be strictly descending (the full width first), got [64, 128].
    """
    if not isinstance(dims, (list, tuple)) or not dims:
        raise ValueError(
            f"{name} must be a non-empty list of dimensions such as [384, 256, 128, 64], got {dims!r}."
        )
    if not all(is_int(dim) and dim >= 1 for dim in dims):
        raise ValueError(f"{name} must hold integers >= 1, got {list(dims)!r}.")
    checked = tuple(int(dim) for dim in dims)
    if any(first <= second for first, second in itertools.pairwise(checked)):
        raise ValueError(f"{name} must be strictly descending (the full width first), got {list(checked)!r}.")
    return checked


def check_matryoshka_weights(weights: Any, dims: Sequence[int]) -> tuple[float, ...]:
    """The weights of ``dims``: ``1.0`` each for ``None``, else finite numbers > 0, one per dimension.

    Example:
        >>> check_matryoshka_weights(None, (256, 64))
        (1.0, 1.0)
        >>> check_matryoshka_weights([1, 2, 3], (256, 64))
        Traceback (most recent call last):
            ...
        ValueError: matryoshka_weights must hold one weight per dimension of matryoshka_dims (2), got [1, 2, 3].
    """
    if weights is None:
        return (1.0,) * len(dims)
    if not isinstance(weights, (list, tuple)) or len(weights) != len(dims):
        raise ValueError(
            f"matryoshka_weights must hold one weight per dimension of matryoshka_dims ({len(dims)}), "
            f"got {weights!r}."
        )
    valid = all(
        isinstance(weight, (int, float))
        and not isinstance(weight, bool)
        and math.isfinite(weight)
        and weight > 0
        for weight in weights
    )
    if not valid:
        raise ValueError(f"matryoshka_weights must be finite numbers > 0, got {list(weights)!r}.")
    return tuple(float(weight) for weight in weights)


def truncated(embeddings: torch.Tensor, dim: int, normalize: bool = True) -> torch.Tensor:
    """The first ``dim`` dimensions of ``embeddings`` (the last axis), L2-normalised again when ``normalize``:
    sentence-transformers' ``shrink``.

    Example:
        >>> truncated(torch.tensor([[3.0, 4.0, 12.0]]), 2).tolist()
        [[0.6000000238418579, 0.800000011920929]]
    """
    kept = embeddings[..., :dim]
    return F.normalize(kept, dim=-1) if normalize else kept


class MatryoshkaLoss(LossWrapper):
    """The weighted sum of ``loss`` on the embeddings truncated to each of ``matryoshka_dims``.

    ``loss(truncated(embeddings, d), labels, indices_tuple, truncated(ref_emb, d), ref_labels)`` for each
    ``d``, times its weight, summed (see the module docstring); with ``normalize`` (the default, as
    sentence-transformers) each truncation, the full width's too, is L2-normalised again, which cosine
    losses do anyway. The dimensions must be strictly descending; the first may be the full width (it
    should be: without it the full embedding is not trained as a whole). A dimension wider than the
    embeddings is refused at the first call.

    Args:
        loss (torch.nn.Module): The loss at each dimension, called like the losses of
            :mod:`composer_dynsample.losses`.
        matryoshka_dims (Sequence[int]): The dimensions, e.g. ``[384, 256, 128, 64]``.
        matryoshka_weights (Sequence[float], optional): One weight > 0 per dimension. Default: ``1`` each.
        normalize (bool): L2-normalise each truncation. Default: ``True``.

    Example:
        >>> from composer_dynsample.losses import InfoNCELoss
        >>> emb = torch.nn.functional.normalize(torch.randn(6, 8, generator=torch.Generator().manual_seed(0)))
        >>> labels = torch.tensor([0, 0, 1, 1, 2, 2])
        >>> inner = InfoNCELoss(temperature=0.1)
        >>> loss = MatryoshkaLoss(inner, [8, 4], matryoshka_weights=[1.0, 0.5])
        >>> expected = inner(emb, labels) + 0.5 * inner(truncated(emb, 4), labels)
        >>> bool(torch.isclose(loss(emb, labels), expected))
        True
    """

    def __init__(
        self,
        loss: nn.Module,
        matryoshka_dims: Sequence[int],
        matryoshka_weights: Sequence[float] | None = None,
        *,
        normalize: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(loss, nn.Module):
            raise InputTypeError(f"loss must be a torch.nn.Module, got {type(loss).__name__}.")
        self.loss = loss
        self.matryoshka_dims = check_matryoshka_dims(matryoshka_dims)
        self.matryoshka_weights = check_matryoshka_weights(matryoshka_weights, self.matryoshka_dims)
        self.normalize = check_bool("normalize", normalize)
        self._passed_on = tuple(key for key in _PASSED_ON if forward_takes(loss, key))

    @property
    def negatives(self) -> str | None:
        """The inner loss's ``negatives`` (:class:`~composer_dynsample.InfoNCELoss`), for the model's query flags."""
        return getattr(self.loss, "negatives", None)

    def wrapped(self, call: LossCall) -> torch.Tensor:
        """The weighted sum over the dimensions; the keyword arguments reach the inner loss when its
        ``forward`` takes them (as :class:`~composer_dynsample.EmbeddingModel` passes them to a loss)."""
        for name, value in (("embeddings", call.embeddings), ("ref_emb", call.ref_emb)):
            if (
                isinstance(value, torch.Tensor)
                and value.ndim == 2
                and value.shape[1] < self.matryoshka_dims[0]
            ):
                raise ValueError(
                    f"matryoshka_dims: {self.matryoshka_dims[0]} is wider than the {value.shape[1]} dimensions "
                    f"of {name}; use dimensions of at most {value.shape[1]}."
                )
        keywords = {key: call.keywords[key] for key in self._passed_on}
        total: torch.Tensor | None = None
        for dim, weight in zip(self.matryoshka_dims, self.matryoshka_weights):
            ref = None if call.ref_emb is None else truncated(call.ref_emb, dim, self.normalize)
            value = call.to(
                self.loss,
                embeddings=truncated(call.embeddings, dim, self.normalize),
                ref_emb=ref,
                keywords=keywords,
            )
            total = weight * value if total is None else total + weight * value
        return total  # type: ignore[return-value]

    def extra_repr(self) -> str:
        return f"matryoshka_dims={list(self.matryoshka_dims)}, matryoshka_weights={list(self.matryoshka_weights)}"
