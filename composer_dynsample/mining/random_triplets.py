"""Random triplets: the baseline that mines nothing, one random positive and negative per anchor."""

from __future__ import annotations

import torch

from composer_dynsample.mining._common import empty_indices, validate_mining_inputs

__all__ = ["random_triplets"]


def random_triplets(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    ref_embeddings: torch.Tensor | None = None,
    ref_labels: torch.Tensor | None = None,
    *,
    distance: str = "cosine",
    generator: torch.Generator | None = None,
    self_offset: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For every anchor, one positive and one negative drawn uniformly at random from the pool.

    The baseline against which mining strategies are compared: the embeddings are not looked at
    (``distance`` is accepted for a uniform interface). Anchors without a positive or a negative are
    left out; without a reference pool an anchor never pairs with itself.

    Args:
        embeddings (torch.Tensor): ``(B, D)`` anchors.
        labels (torch.Tensor): ``(B,)`` integer labels.
        ref_embeddings (torch.Tensor, optional): ``(M, D)`` pool. Default: the batch.
        ref_labels (torch.Tensor, optional): The pool's labels.
        self_offset (int, optional): When the pool holds the anchors themselves, anchor ``i`` is pool
            entry ``self_offset + i`` and never pairs with it. Default: ``None``.
        distance (str): Validated, otherwise unused. Default: ``"cosine"``.
        generator (torch.Generator, optional): The random source. Default: torch's global generator
            (which Composer seeds and checkpoints).

    Returns:
        Triplets ``(anchors, positives, negatives)``.

    Example:
        >>> emb = torch.randn(6, 3)
        >>> labels = torch.tensor([0, 0, 1, 1, 2, 2])
        >>> a, p, n = random_triplets(emb, labels, generator=torch.Generator().manual_seed(0))
        >>> a.tolist(), bool((labels[p] == labels[a]).all()), bool((labels[n] != labels[a]).all())
        ([0, 1, 2, 3, 4, 5], True, True)
    """
    inputs = validate_mining_inputs(
        embeddings, labels, ref_embeddings, ref_labels, distance=distance, self_offset=self_offset
    )
    if inputs.is_empty:
        return empty_indices(3, inputs.device)  # type: ignore[return-value]
    with torch.no_grad():
        positive = inputs.labels[:, None] == inputs.ref_labels[None, :]
        negative = ~positive
        if inputs.self_offset is not None:
            rows = torch.arange(positive.shape[0], device=inputs.device)
            positive[rows, rows + inputs.self_offset] = False
        valid = positive.any(1) & negative.any(1)
        anchors = valid.nonzero(as_tuple=True)[0]
        if anchors.numel() == 0:
            return empty_indices(3, inputs.device)  # type: ignore[return-value]
        # The candidate with the largest uniform key is a uniform draw among the candidates: one pass,
        # where torch.multinomial row by row is far slower.
        keys = torch.rand(positive[anchors].shape, generator=generator, device=inputs.device)
        positives = keys.masked_fill(~positive[anchors], -1.0).argmax(dim=1)
        negatives = keys.masked_fill(~negative[anchors], -1.0).argmax(dim=1)
    return anchors, positives, negatives
