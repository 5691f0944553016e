"""Losses that consume mined tuples, with pytorch-metric-learning's call signature.

Every loss is called as ``loss(embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None)``
(a :class:`~composer_dynsample.losses.call.LossCall`, which :meth:`TupleLoss._loss` computes from):
anchors index ``embeddings``, positives and negatives index ``ref_emb`` (or ``embeddings`` when it is
``None``). Without ``indices_tuple`` the loss uses every valid tuple of the batch, as PML does.

Reductions are plain means over the tuples (PML's ``MeanReducer``), so that with ``global_mean=True``
the mean can run over the tuples of every rank: each rank divides its sum by the global count over the
world size, and DDP's gradient average then equals one process's gradient on the concatenated batch.
Every loss stays attached to the graph of ``embeddings`` and ``ref_emb`` even when there is no tuple,
so a step that mined nothing gives a zero loss and DDP (or a gradient-carrying gather) does not hang.

Distances come from :func:`~composer_dynsample.distances.distance_matrix`, in the dtype the miners use:
float32 for fp16 and bf16 embeddings, float64 for float32 embeddings whose squared norms would overflow
(entries near 1e18 and above). Such a loss is returned in float64, equal to the loss on the embeddings
cast to float64, and its gradient reaches the embeddings finite, in their own dtype.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from composer_dynsample.distances import check_distance, distance_matrix
from composer_dynsample.distributed import all_reduce_sum, get_world_size
from composer_dynsample.losses.call import LossCall, forward_takes, loss_forward
from composer_dynsample.losses.mined_loss import reject_mined_batch
from composer_dynsample.validation import check_float

__all__ = [
    "ContrastiveLoss",
    "MultiSimilarityLoss",
    "TripletMarginLoss",
    "all_pairs",
    "all_triplets",
    "forward_takes",
]


def all_pairs(labels: torch.Tensor, ref_labels: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Every positive and negative pair ``(a1, p, a2, n)``; without a reference pool, self-pairs are left out.

    Example:
        >>> [t.tolist() for t in all_pairs(torch.tensor([0, 0, 1]))]
        [[0, 1], [1, 0], [0, 1, 2, 2], [2, 2, 0, 1]]
    """
    ref = labels if ref_labels is None else ref_labels
    same = labels[:, None] == ref[None, :]
    if ref_labels is None:
        same.fill_diagonal_(False)
        different = labels[:, None] != ref[None, :]
    else:
        different = ~same
    a1, p = same.nonzero(as_tuple=True)
    a2, n = different.nonzero(as_tuple=True)
    return a1, p, a2, n


def all_triplets(labels: torch.Tensor, ref_labels: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Every triplet ``(a, p, n)``: ``O(B x M^2)`` memory, meant for small batches.

    Example:
        >>> [t.tolist() for t in all_triplets(torch.tensor([0, 0, 1]))]
        [[0, 1], [1, 0], [2, 2]]
    """
    a1, p, a2, n = all_pairs(labels, ref_labels)
    ref_size = labels.numel() if ref_labels is None else ref_labels.numel()
    pos = torch.zeros(labels.numel(), ref_size, dtype=torch.bool, device=labels.device)
    neg = torch.zeros_like(pos)
    pos[a1, p] = True
    neg[a2, n] = True
    anchor, positive, negative = (pos[:, :, None] & neg[:, None, :]).nonzero(as_tuple=True)
    return anchor, positive, negative


class TupleLoss(nn.Module):
    """Shared validation and reduction; subclasses implement :meth:`compute` (or :meth:`_loss`)."""

    tuple_size: int

    def __init__(self, distance: str = "cosine") -> None:
        super().__init__()
        check_distance(distance)
        self.distance = distance

    def __call__(self, embeddings: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """``forward``, after refusing a :class:`~composer_dynsample.MinedBatch` (or any non-tensor) given as
        the embeddings, in one line naming the call to write."""
        reject_mined_batch(type(self).__name__, embeddings)
        return super().__call__(embeddings, *args, **kwargs)

    @loss_forward("global_mean", "values_checked")
    def forward(self, call: LossCall) -> torch.Tensor:
        return self._reduced(call)

    def _reduced(self, call: LossCall) -> torch.Tensor:
        """:meth:`_loss` of a call (``ref_emb`` and ``ref_labels`` given together), plus a zero attached to
        its embeddings and ``ref_emb``."""
        if (call.ref_emb is None) != (call.ref_labels is None):
            raise ValueError("ref_emb and ref_labels must be given together.")
        return self._loss(call) + self._attached_zero(call.embeddings, call.ref_emb)

    def _loss(self, call: LossCall) -> torch.Tensor:
        """The loss before the attached zero: every tuple by default, its size checked, then :meth:`compute`."""
        embeddings, labels, indices_tuple, ref_emb, ref_labels, keywords = call
        if indices_tuple is None:
            indices_tuple = (
                all_triplets(labels, ref_labels) if self.tuple_size == 3 else all_pairs(labels, ref_labels)
            )
        if len(indices_tuple) != self.tuple_size:
            kind = (
                "triplets (anchors, positives, negatives)" if self.tuple_size == 3 else "pairs (a1, p, a2, n)"
            )
            raise ValueError(
                f"{type(self).__name__} needs {kind}: an indices_tuple of {self.tuple_size} tensors, got "
                f"{len(indices_tuple)}. Use a miner that returns {kind}."
            )
        pool = embeddings if ref_emb is None else ref_emb
        checked = keywords.get("values_checked", False)
        return self.compute(embeddings, pool, indices_tuple, keywords["global_mean"], values_checked=checked)

    @staticmethod
    def _attached_zero(embeddings: torch.Tensor, ref_emb: torch.Tensor | None) -> torch.Tensor:
        """A zero that still depends on every input, so the backward pass reaches all of them."""
        # One entry per input, zeroed before the sum: a sum of the entries overflows (an fp16 sum past
        # 65504, a float32 one near 1e38), and inf * 0 is NaN.
        total = (embeddings.reshape(-1)[:1] * 0.0).sum(dtype=torch.float32)
        return total if ref_emb is None else total + (ref_emb.reshape(-1)[:1] * 0.0).sum(dtype=torch.float32)

    def compute(
        self,
        embeddings: torch.Tensor,
        pool: torch.Tensor,
        indices_tuple: tuple[torch.Tensor, ...],
        global_mean: bool,
        *,
        values_checked: bool = False,
    ) -> torch.Tensor:
        """The loss of ``indices_tuple`` against ``pool``; ``values_checked``: its distances read nothing on the
        host (:func:`~composer_dynsample.distances.distance_matrix`)."""
        raise NotImplementedError

    @classmethod
    def _weighted_mean(cls, values: torch.Tensor, counts: torch.Tensor, global_mean: bool) -> torch.Tensor:
        """``sum(values * counts) / sum(counts)``: the mean over pairs given as a dense count matrix."""
        total = counts.sum()
        if not global_mean:
            return (values * counts).sum() / total.clamp_min(1.0)
        # In float32 on every rank: a rank whose distances needed float64 must not all-reduce another dtype.
        count = all_reduce_sum(total.to(torch.float32))
        return (values * counts).sum() * get_world_size() / count.clamp_min(1.0)

    @staticmethod
    def _mean(values: torch.Tensor, global_mean: bool) -> torch.Tensor:
        """Mean over this rank's values, or over every rank's when ``global_mean`` (one small all-reduce)."""
        if not global_mean:
            return values.mean() if values.numel() else values.sum()
        count = all_reduce_sum(torch.tensor(float(values.numel()), device=values.device))
        return values.sum() * get_world_size() / count.clamp_min(1.0)


class TripletMarginLoss(TupleLoss):
    """``mean(relu(d(a, p) - d(a, n) + margin))`` over the triplets.

    Equals PML's ``TripletMarginLoss(margin, reducer=MeanReducer())`` with the matching distance (cosine
    distance ``1 - s`` against PML's ``CosineSimilarity``).

    Args:
        margin (float): The margin, at least 0 (a negative one would accept positives farther than
            negatives). Default: ``0.2``.
        distance (str): ``"cosine"``, ``"euclidean"`` or ``"squared_euclidean"``. Default: ``"cosine"``.

    Example:
        >>> emb = torch.nn.functional.normalize(torch.randn(6, 4, generator=torch.Generator().manual_seed(0)))
        >>> loss = TripletMarginLoss(margin=0.2)(emb, torch.tensor([0, 0, 1, 1, 2, 2]))
        >>> bool(loss >= 0)
        True
    """

    tuple_size = 3

    def __init__(self, margin: float = 0.2, distance: str = "cosine") -> None:
        super().__init__(distance)
        self.margin = check_float("margin", margin, minimum=0.0)

    def compute(self, embeddings, pool, indices_tuple, global_mean, *, values_checked=False):
        anchors, positives, negatives = indices_tuple
        distances = distance_matrix(embeddings, pool, self.distance, values_checked=values_checked)
        ap, an = distances[anchors, positives], distances[anchors, negatives]
        return self._mean(torch.relu(ap - an + self.margin), global_mean)


class ContrastiveLoss(TupleLoss):
    """``mean(relu(d_pos - pos_margin)) + mean(relu(neg_margin - d_neg))`` over positive and negative pairs.

    Equals PML's ``ContrastiveLoss(pos_margin, neg_margin, reducer=MeanReducer())`` with the matching
    distance (PML reduces its positive and negative terms separately and adds them).

    Args:
        pos_margin (float): Positive pairs closer than this cost nothing; at least 0. Default: ``0.0``.
        neg_margin (float): Negative pairs farther than this cost nothing; at least 0 (distances are never
            negative, so a negative margin would ignore every negative pair). Default: ``0.5``.
        distance (str): ``"cosine"``, ``"euclidean"`` or ``"squared_euclidean"``. Default: ``"cosine"``.

    Example:
        >>> emb = torch.nn.functional.normalize(torch.randn(6, 4, generator=torch.Generator().manual_seed(0)))
        >>> bool(ContrastiveLoss()(emb, torch.tensor([0, 0, 1, 1, 2, 2])) >= 0)
        True
    """

    tuple_size = 4

    def __init__(self, pos_margin: float = 0.0, neg_margin: float = 0.5, distance: str = "cosine") -> None:
        super().__init__(distance)
        self.pos_margin = check_float("pos_margin", pos_margin, minimum=0.0)
        self.neg_margin = check_float("neg_margin", neg_margin, minimum=0.0)

    def compute(self, embeddings, pool, indices_tuple, global_mean, *, values_checked=False):
        a1, p, a2, n = indices_tuple
        distances = distance_matrix(embeddings, pool, self.distance, values_checked=values_checked)
        positive, negative = _pair_counts(a1, p, distances), _pair_counts(a2, n, distances)
        pos_loss = self._weighted_mean(torch.relu(distances - self.pos_margin), positive, global_mean)
        neg_loss = self._weighted_mean(torch.relu(self.neg_margin - distances), negative, global_mean)
        return pos_loss + neg_loss


class MultiSimilarityLoss(TupleLoss):
    """Multi-similarity loss (Wang et al. 2019) on cosine similarity, over mined pairs.

    Per anchor:
    ``1/alpha * log(1 + sum_p exp(-alpha (s_ap - base))) + 1/beta * log(1 + sum_n exp(beta (s_an - base)))``,
    averaged over all anchors (an anchor without pairs contributes zero), as PML's ``MultiSimilarityLoss``
    does. Computed with grouped log-sum-exp, stable for large ``beta``.

    Args:
        alpha (float): Positive scale. Default: ``2.0``.
        beta (float): Negative scale. Default: ``50.0``.
        base (float): The similarity offset. Default: ``0.5``.

    Example:
        >>> emb = torch.nn.functional.normalize(torch.randn(6, 4, generator=torch.Generator().manual_seed(0)))
        >>> bool(MultiSimilarityLoss()(emb, torch.tensor([0, 0, 1, 1, 2, 2])) > 0)
        True
    """

    tuple_size = 4

    def __init__(self, alpha: float = 2.0, beta: float = 50.0, base: float = 0.5) -> None:
        super().__init__("cosine")
        self.alpha = check_float("alpha", alpha, minimum=0.0, strict_minimum=True)
        self.beta = check_float("beta", beta, minimum=0.0, strict_minimum=True)
        self.base = check_float("base", base)

    def compute(self, embeddings, pool, indices_tuple, global_mean, *, values_checked=False):
        a1, p, a2, n = indices_tuple
        similarity = 1.0 - distance_matrix(embeddings, pool, "cosine", values_checked=values_checked)
        # 0/1 masks, as PML builds them: a pair listed twice in a hand-made tuple counts once.
        positive = _pair_counts(a1, p, similarity).clamp_(max=1.0)
        negative = _pair_counts(a2, n, similarity).clamp_(max=1.0)
        pos_term = _log1p_weighted_sum_exp(-self.alpha * (similarity - self.base), positive) / self.alpha
        neg_term = _log1p_weighted_sum_exp(self.beta * (similarity - self.base), negative) / self.beta
        return self._mean(pos_term + neg_term, global_mean)


def _pair_counts(rows: torch.Tensor, cols: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """How often each (row, col) pair occurs, as a dense matrix shaped like ``like`` (no gradient).

    Pair losses weight the dense distance matrix with these counts: with tens of thousands of pairs,
    dense elementwise work beats indexing the matrix per pair and scattering the gradient back.
    """
    num_rows, num_cols = like.shape
    flat = torch.bincount(rows * num_cols + cols, minlength=num_rows * num_cols)
    return flat.view(num_rows, num_cols).to(like.dtype)


def _log1p_weighted_sum_exp(values: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Per row, ``log(1 + sum_j counts_ij exp(values_ij))`` without overflow; ``0`` for rows without pairs."""
    masked = values.masked_fill(counts == 0, torch.finfo(values.dtype).min)
    peak = masked.detach().amax(dim=1).clamp_min(0.0)  # at least 0: the "1 +" term
    total = (counts * torch.exp(masked - peak[:, None])).sum(dim=1)
    return peak + torch.log(torch.exp(-peak) + total)
