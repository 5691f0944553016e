"""``RandomTripletsMiner``: the baseline that mines nothing, one random positive and negative per anchor."""

from __future__ import annotations

import torch

from composer_dynsample.mining._common import MiningInputs, Triplets
from composer_dynsample.mining.base import BaseMiner
from composer_dynsample.validation import check_generator

__all__ = ["RandomTripletsMiner"]


class RandomTripletsMiner(BaseMiner):
    """For every anchor, one positive and one negative drawn uniformly at random from the pool.

    The baseline against which mining strategies are compared: the embeddings are not looked at
    (``distance`` is accepted for a uniform interface). Anchors without a positive or a negative are
    left out; without a reference pool an anchor never pairs with itself. Called as
    :meth:`~composer_dynsample.mining.BaseMiner.__call__` says; returns triplets.

    Args:
        generator (torch.Generator, optional): The random source. Default: torch's global generator
            (which Composer seeds and checkpoints).
        distance (str): Validated, otherwise unused. Default: ``"cosine"``.

    Example:
        >>> emb = torch.randn(6, 3)
        >>> labels = torch.tensor([0, 0, 1, 1, 2, 2])
        >>> a, p, n = RandomTripletsMiner(generator=torch.Generator().manual_seed(0))(emb, labels)
        >>> a.tolist(), bool((labels[p] == labels[a]).all()), bool((labels[n] != labels[a]).all())
        ([0, 1, 2, 3, 4, 5], True, True)
    """

    uses_label_index = False

    def __init__(self, *, generator: torch.Generator | None = None, distance: str = "cosine") -> None:
        self.generator = check_generator("generator", generator)
        super().__init__(distance=distance)

    def mine(self, inputs: MiningInputs, index: None) -> Triplets:  # type: ignore[override]
        positive = inputs.labels[:, None] == inputs.ref_labels[None, :]
        negative = ~positive
        if inputs.self_offset is not None:
            rows = torch.arange(positive.shape[0], device=inputs.device)
            positive[rows, rows + inputs.self_offset] = False
        valid = positive.any(1) & negative.any(1)
        anchors = valid.nonzero(as_tuple=True)[0]
        if anchors.numel() == 0:
            return self.empty(inputs.device)  # type: ignore[return-value]
        # The candidate with the largest uniform key is a uniform draw among the candidates: one pass,
        # where torch.multinomial row by row is far slower.
        keys = torch.rand(positive[anchors].shape, generator=self.generator, device=inputs.device)
        positives = keys.masked_fill(~positive[anchors], -1.0).argmax(dim=1)
        negatives = keys.masked_fill(~negative[anchors], -1.0).argmax(dim=1)
        return anchors, positives, negatives
