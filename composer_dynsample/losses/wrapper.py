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

from composer_dynsample.losses.call import KEYWORDS, LossCall, loss_forward, passed_on
from composer_dynsample.losses.mined_loss import reject_mined_batch

__all__ = ["LossCall", "LossWrapper", "passed_on"]


class LossWrapper(nn.Module):
    """A loss around inner losses; subclasses implement :meth:`wrapped`."""

    @loss_forward(*KEYWORDS)
    def forward(self, call: LossCall) -> torch.Tensor:
        """The loss of the inner losses; ``source`` is the batch's source of a mix of data sets (its
        collate's ``"source"``), the other keywords as :class:`~composer_dynsample.InfoNCELoss` takes them."""
        reject_mined_batch(type(self).__name__, call.embeddings)
        return self.wrapped(call)

    def wrapped(self, call: LossCall) -> torch.Tensor:
        """The loss of the call (see :class:`LossCall`)."""
        raise NotImplementedError
