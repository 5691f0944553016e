"""The base of a loss around other losses (Matryoshka's truncations, a loss per source of a mix of data sets).

Such a loss is called as the losses it wraps are (pytorch-metric-learning's ``embeddings, labels,
indices_tuple, ref_emb, ref_labels``, and the keywords :class:`~composer_dynsample.EmbeddingModel` hands a
loss that takes them); :class:`LossWrapper` takes that call once and hands :meth:`LossWrapper.wrapped` a
:class:`~composer_dynsample.losses.call.LossCall`, which a subclass passes on to an inner loss
(:meth:`LossCall.to`), its embeddings replaced where it transforms them.
"""

from __future__ import annotations

import torch
from torch import nn

from composer_dynsample.losses.call import LossCall, passed_on
from composer_dynsample.losses.mined_loss import reject_mined_batch

__all__ = ["LossCall", "LossWrapper", "passed_on"]


class LossWrapper(nn.Module):
    """A loss around inner losses; subclasses implement :meth:`wrapped`."""

    def forward(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor,
        indices_tuple: tuple[torch.Tensor, ...] | None = None,
        ref_emb: torch.Tensor | None = None,
        ref_labels: torch.Tensor | None = None,
        *,
        global_mean: bool = False,
        duplicate_ids: torch.Tensor | None = None,
        ref_duplicate_ids: torch.Tensor | None = None,
        is_query: torch.Tensor | None = None,
        source: str | None = None,
    ) -> torch.Tensor:
        """The loss of the inner losses; ``source`` is the batch's source of a mix of data sets (its
        collate's ``"source"``), the other keywords as :class:`~composer_dynsample.InfoNCELoss` takes them."""
        reject_mined_batch(type(self).__name__, embeddings)
        keywords = {
            "global_mean": global_mean,
            "duplicate_ids": duplicate_ids,
            "ref_duplicate_ids": ref_duplicate_ids,
            "is_query": is_query,
            "source": source,
        }
        return self.wrapped(LossCall(embeddings, labels, indices_tuple, ref_emb, ref_labels, keywords))

    def wrapped(self, call: LossCall) -> torch.Tensor:
        """The loss of the call (see :class:`LossCall`)."""
        raise NotImplementedError
