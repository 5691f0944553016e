"""A loss call: pytorch-metric-learning's five arguments and the keywords, the one signature every loss here takes.

Every loss is called as ``loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)`` plus the keywords
its ``forward`` takes by name (of :data:`KEYWORDS`: ``global_mean``, ``duplicate_ids``, ``ref_duplicate_ids``,
``is_query``, ``source``): :class:`LossCall` holds such a call once, for a loss to compute from
(:class:`~composer_dynsample.losses.tuple_losses.TupleLoss`) or to pass on to an inner loss
(:class:`~composer_dynsample.losses.wrapper.LossWrapper`), :func:`loss_forward` makes the ``forward`` of
both that takes the call, and :func:`forward_takes` says which keywords a loss of any library takes.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from torch import nn

from composer_dynsample.validation import check_keywords

__all__ = ["KEYWORDS", "LossCall", "forward_takes", "loss_forward", "passed_on"]


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


def _every_keyword(
    *,
    global_mean: bool = False,
    duplicate_ids: torch.Tensor | None = None,
    ref_duplicate_ids: torch.Tensor | None = None,
    is_query: torch.Tensor | None = None,
    source: str | None = None,
    values_checked: bool = False,
) -> None:
    """The keywords of :data:`KEYWORDS`, written once as the parameters a ``forward`` shows."""


#: Every keyword a loss here may take by name after the five arguments, in the order of its ``forward``,
#: with its annotation and default: the mean over every rank's tuples, the ids of repeated texts in the
#: batch and in ``ref_emb``, which rows are queries, the batch's source of a mix of data sets, and whether the
#: caller has checked the embeddings' values on the device (a training step's mined batch, unit rows): then
#: the loss reads none on the host (:func:`~composer_dynsample.distances.working_dtype`).
KEYWORDS: Mapping[str, inspect.Parameter] = inspect.signature(_every_keyword).parameters


def loss_forward(
    *keywords: str,
) -> Callable[[Callable[[Any, LossCall], torch.Tensor]], Callable[..., torch.Tensor]]:
    """Make ``method(self, call)`` a loss's ``forward``, called with the five arguments and ``keywords`` (of
    :data:`KEYWORDS`) by name, which hands ``method`` the :class:`LossCall`.

    The ``forward`` has ``method``'s name and docstring, and the signature of that call (what
    :func:`forward_takes` reads): the five arguments, then ``keywords``, keyword-only, with their defaults.
    A keyword it does not take raises the ``TypeError`` Python raises for one, naming the close keyword
    (:func:`~composer_dynsample.validation.check_keywords`).

    Example:
        >>> class Norm(nn.Module):
        ...     @loss_forward("global_mean")
        ...     def forward(self, call: LossCall) -> torch.Tensor:
        ...         return call.embeddings.norm() * (2 if call.keywords["global_mean"] else 1)
        >>> float(Norm()(torch.ones(1, 4), torch.zeros(1), global_mean=True)), forward_takes(Norm(), "source")
        (4.0, False)
        >>> list(inspect.signature(Norm.forward).parameters)[-2:]
        ['ref_labels', 'global_mean']
    """
    taken = [KEYWORDS[name] for name in keywords]

    def decorate(method: Callable[[Any, LossCall], torch.Tensor]) -> Callable[..., torch.Tensor]:
        def forward(
            self,
            embeddings: torch.Tensor,
            labels: torch.Tensor,
            indices_tuple: tuple[torch.Tensor, ...] | None = None,
            ref_emb: torch.Tensor | None = None,
            ref_labels: torch.Tensor | None = None,
            **given: Any,
        ) -> torch.Tensor:
            check_keywords(forward.__qualname__, given, keywords)
            values = {key.name: given.get(key.name, key.default) for key in taken}
            return method(self, LossCall(embeddings, labels, indices_tuple, ref_emb, ref_labels, values))

        own = inspect.signature(forward)
        *five, _ = own.parameters.values()
        functools.update_wrapper(forward, method)
        forward.__signature__ = own.replace(parameters=[*five, *taken])  # type: ignore[attr-defined]
        return forward

    return decorate
