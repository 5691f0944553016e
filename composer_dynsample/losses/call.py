"""A loss call: pytorch-metric-learning's five arguments and the keywords, the one signature every loss here takes.

Every loss is called as ``loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)`` plus the keywords
its ``forward`` takes by name (``global_mean``, ``duplicate_ids``, ``ref_duplicate_ids``, ``is_query``,
``source``): :class:`LossCall` holds such a call once, for a loss to compute from
(:class:`~composer_dynsample.losses.tuple_losses.TupleLoss`) or to pass on to an inner loss
(:class:`~composer_dynsample.losses.wrapper.LossWrapper`), and :func:`forward_takes` says which keywords a
loss of any library takes.
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import torch
from torch import nn

__all__ = ["LossCall", "forward_takes", "passed_on"]


def forward_takes(loss: nn.Module, keyword: str) -> bool:
    """Whether ``loss.forward`` takes ``keyword`` by name (``global_mean``, ``duplicate_ids`` and ``is_query``
    as :class:`~composer_dynsample.InfoNCELoss` does): what a caller may pass a loss of any library."""
    try:
        return keyword in inspect.signature(loss.forward).parameters
    except (TypeError, ValueError):
        return False


def passed_on(loss: nn.Module, keywords: dict[str, Any]) -> dict[str, Any]:
    """The ``keywords`` ``loss.forward`` takes by name (``None`` values left out)."""
    return {key: value for key, value in keywords.items() if value is not None and forward_takes(loss, key)}


class LossCall(NamedTuple):
    """The arguments a loss was called with: pytorch-metric-learning's five and the keywords."""

    embeddings: torch.Tensor
    labels: torch.Tensor
    indices_tuple: tuple[torch.Tensor, ...] | None
    ref_emb: torch.Tensor | None
    ref_labels: torch.Tensor | None
    keywords: dict[str, Any]

    def to(self, loss: nn.Module, **replaced: Any) -> torch.Tensor:
        """``loss`` called with these arguments (``replaced`` ones changed: ``embeddings``, ``ref_emb``,
        ``keywords``), the keywords it takes passed on by name."""
        call = self._replace(**replaced)
        return loss(
            call.embeddings, call.labels, call.indices_tuple, call.ref_emb, call.ref_labels,
            **passed_on(loss, call.keywords),
        )  # fmt: skip
