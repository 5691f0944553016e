"""InfoNCE (NT-Xent) over labelled positive pairs, with the pool or only the mined tuples as negatives.

For a positive pair ``(a, p)``, with logits ``x = -d / temperature`` (``d`` the distance, so for cosine
``x`` is the similarity over the temperature, shifted by a constant that cancels)::

    loss(a, p) = -log(exp(x_ap) / (exp(x_ap) + sum over a's negatives n of exp(x_an)))
               = softplus(logsumexp_n(x_an) - x_ap)

averaged over the positive pairs; the second form is the one computed, stable at any temperature.
This is pytorch-metric-learning's ``NTXentLoss``, SimCLR's NT-Xent with labels, and sentence-transformers'
``MultipleNegativesRankingLoss`` when every anchor has one positive.
"""

from __future__ import annotations

from typing import Final

import torch
import torch.nn.functional as F

from composer_dynsample.distances import distance_matrix
from composer_dynsample.distributed import all_gather_embeddings, get_world_size
from composer_dynsample.losses.call import LossCall, loss_forward
from composer_dynsample.losses.tuple_losses import TupleLoss
from composer_dynsample.mining.duplicates import duplicate_negatives
from composer_dynsample.validation import (
    check_bool,
    check_choice,
    check_float,
    check_labels,
    check_pool,
    describe,
)

__all__ = ["NEGATIVES", "InfoNCELoss", "info_nce_masks"]

NEGATIVES: Final[tuple[str, ...]] = ("pool", "mined", "passages")
_NAMES = ("embeddings", "labels", "ref_emb", "ref_labels")


class InfoNCELoss(TupleLoss):
    """InfoNCE / NT-Xent: each positive pair against its anchor's negatives, in a softmax at a temperature.

    Called like every loss here and in pytorch-metric-learning,
    ``loss(embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None, *, global_mean=False)``;
    anchors index ``embeddings``, positives and negatives index the pool (``ref_emb``, else ``embeddings``).

    Positives: the distinct ``(anchor, positive)`` pairs the ``indices_tuple`` names (triplets
    ``(a, p, n)`` or pairs ``(a1, p, a2, n)``; the miners leave out an anchor's own row in the pool),
    or, without a tuple, every same-label pair (without ``ref_emb`` the self-pairs left out; with it they
    stay, as in PML, so pass mined tuples when the pool holds the anchors).

    Negatives of an anchor: with ``negatives="pool"`` every pool row of another label (the batch, the
    other ranks' rows of a cross-rank pool, the cross-batch memory); with ``"mined"`` only the distinct
    rows the tuple names as that anchor's negatives (every other-label row when there is no tuple).
    With ``"passages"`` (pairs of a query and a passage, ``is_query=`` saying which row is which) only the
    queries are anchors, and their positives and negatives are the batch's passages alone: each query
    against its passage and every other passage, one direction, which is sentence-transformers'
    ``MultipleNegativesRankingLoss``; ``"pool"`` on such a batch is NT-Xent, where a query's negatives
    include the other queries and the passages are anchors too.
    A positive pair whose anchor has no negative costs zero and still counts in the mean, as in PML.

    **Duplicates.** ``duplicate_ids=`` (``(B,)``, e.g. the ``text_hash`` of text batches) and, with
    ``ref_emb``, ``ref_duplicate_ids=`` (``(M,)``) mark the same sample under different labels (the same
    passage answering two queries). A row of another label is then no negative of an anchor when the
    batch or pool holds the row's id under the anchor's label or the anchor's id under the row's: it
    repeats the anchor or one of its positives, or the anchor repeats one of its positives (see
    :mod:`composer_dynsample.mining.duplicates`). Without that, a passage's copy under another label
    sits in the softmax beside the positive it repeats and the pair costs at least ``log 2``. Negative
    ids match nothing. The relation is symmetric, so the reverse direction uses the same mask, column
    by column, and with ``global_mean`` each rank masks its own anchors' rows. Without ids the loss is
    unchanged.
    :class:`~composer_dynsample.EmbeddingModel` passes them from
    ``HardNegativeMining(duplicate_key=...)``.

    ``symmetric=True`` adds the reverse direction, as CLIP and sentence-transformers'
    ``MultipleNegativesSymmetricRankingLoss`` do, and averages the two: for a pair ``(a, p)`` the
    positive ``p`` picks ``a`` among the *anchors* (the rows of ``embeddings``; with ``global_mean``
    every rank's anchors), its negatives the anchors ``a'`` of another label (``"pool"``) or those
    for which ``(a', p)`` was mined as a negative pair (``"mined"``); with ``"passages"`` each passage picks
    its query among the batch's queries, which is ``MultipleNegativesSymmetricRankingLoss`` exactly (tested,
    with its gradient). This changes the loss only when rows and columns differ: a separate pool (other
    ranks, a memory), mined tuples, or queries against passages. With the batch as
    its own pool and every pair, the similarity matrix and the masks are symmetric and the reverse
    direction is the forward one again. With ``global_mean`` every rank must pass the same pool (the
    cross-rank pool of :class:`~composer_dynsample.HardNegativeMining` is), and one autograd all-gather
    of the per-column log-sum-exp joins the ranks' anchors.

    Equals PML's ``NTXentLoss(temperature)`` on the same embeddings and labels (with or without
    ``ref_emb``), and with ``negatives="mined"`` on the same ``indices_tuple`` when it holds no repeated
    pair (PML counts a repeated pair or negative again; this loss takes sets). fp16 and bf16 inputs are
    computed in float32. ``global_mean`` divides by the positive pairs of every rank, so DDP's gradient
    average equals one process's gradient on the concatenated batch (cross-rank mining with
    ``gather="autograd"``).

    Args:
        temperature (float): Divides the similarities; small values sharpen the softmax. Default: ``0.07``.
        symmetric (bool): Average with the reverse direction (see above). Default: ``False``.
        negatives (str): ``"pool"``, ``"mined"`` or ``"passages"`` (see above). Default: ``"pool"``.
        distance (str): ``"cosine"`` (similarity ``cos``), ``"euclidean"`` or ``"squared_euclidean"``
            (similarity ``-d``). Default: ``"cosine"``.

    Example:
        >>> emb = torch.nn.functional.normalize(torch.randn(6, 4, generator=torch.Generator().manual_seed(0)))
        >>> labels = torch.tensor([0, 0, 1, 1, 2, 2])
        >>> loss = InfoNCELoss(temperature=0.1)(emb, labels)
        >>> bool(loss > 0), loss.dtype
        (True, torch.float32)
        >>> bool(InfoNCELoss(symmetric=True)(emb, labels).isclose(InfoNCELoss()(emb, labels)))
        True
    """

    def __init__(
        self,
        temperature: float = 0.07,
        *,
        symmetric: bool = False,
        negatives: str = "pool",
        distance: str = "cosine",
    ) -> None:
        super().__init__(distance)
        self.temperature = check_float("temperature", temperature, minimum=0.0, strict_minimum=True)
        self.symmetric = check_bool("symmetric", symmetric)
        self.negatives = check_choice("negatives", negatives, NEGATIVES)

    @loss_forward("global_mean", "duplicate_ids", "ref_duplicate_ids", "is_query", "values_checked")
    def forward(self, call: LossCall) -> torch.Tensor:
        """The loss; ``duplicate_ids``/``ref_duplicate_ids`` as in the class docstring, ``is_query`` (``(B,)``
        bool, which rows are queries) with ``negatives="passages"``. Default: none."""
        return self._reduced(call)

    def _loss(self, call: LossCall) -> torch.Tensor:
        """The loss before the attached zero: the masks of :func:`info_nce_masks`, restricted to queries
        against passages (``negatives="passages"``, the rows ``is_query`` flags), then the softmax terms."""
        embeddings, labels, indices_tuple, ref_emb, ref_labels, keywords = call
        query_rows = _check_query_rows(self.negatives, keywords["is_query"], labels, ref_emb)
        global_mean = keywords["global_mean"]
        checked = check_pool((embeddings, labels), (ref_emb, ref_labels), _NAMES, finite=False)
        pool, pool_labels = (embeddings, labels) if checked is None else checked
        if self.symmetric and global_mean and ref_emb is None:
            raise ValueError(
                "InfoNCELoss(symmetric=True) with global_mean=True needs the pool every rank shares as ref_emb "
                "(cross-rank mining passes it); without it the ranks' columns are different samples."
            )
        positive, negative = info_nce_masks(
            labels,
            None if ref_emb is None else pool_labels,
            indices_tuple,
            self.negatives,
            duplicate_ids=keywords["duplicate_ids"],
            ref_duplicate_ids=keywords["ref_duplicate_ids"],
        )
        if query_rows is not None:  # queries against passages only (see the class docstring)
            queries_to_passages = query_rows[:, None] & ~query_rows[None, :]
            positive, negative = positive & queries_to_passages, negative & queries_to_passages
        checked = keywords["values_checked"]
        logits = (
            distance_matrix(embeddings, pool, self.distance, values_checked=checked).neg() / self.temperature
        )
        floor = torch.finfo(logits.dtype).min  # finite: a row without negatives gives 0, never NaN
        masked = logits.masked_fill(~negative, floor)
        values = F.softplus(torch.logsumexp(masked, dim=1, keepdim=True) - logits)
        if self.symmetric:
            column = torch.logsumexp(masked, dim=0)
            if global_mean:
                column = _logsumexp_over_ranks(column)
            values = (values + F.softplus(column[None, :] - logits)) / 2
        return self._weighted_mean(values, positive.to(values.dtype), global_mean)


def _check_query_rows(
    negatives: str, is_query: torch.Tensor | None, labels: torch.Tensor, ref_emb: torch.Tensor | None
) -> torch.Tensor | None:
    """``is_query`` as a bool tensor when ``negatives="passages"`` (``None`` otherwise), checked."""
    if negatives != "passages":
        return None
    if ref_emb is not None:
        raise ValueError(
            "InfoNCELoss(negatives='passages') scores the batch's queries against its passages; a pool beyond "
            "the batch (cross-rank mining, a cross-batch memory) has no query flags: use negatives='pool'."
        )
    if not isinstance(is_query, torch.Tensor) or is_query.shape != labels.shape:
        raise ValueError(
            "InfoNCELoss(negatives='passages') needs is_query=, a (B,) bool tensor of which rows are queries "
            "(the text batches' features['is_query'], which EmbeddingModel passes), got "
            f"{'none' if is_query is None else describe(is_query)}."
        )
    return is_query.to(device=labels.device, dtype=torch.bool)


def info_nce_masks(
    labels: torch.Tensor,
    ref_labels: torch.Tensor | None,
    indices_tuple: tuple[torch.Tensor, ...] | None,
    negatives: str = "pool",
    *,
    duplicate_ids: torch.Tensor | None = None,
    ref_duplicate_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(B, M)`` boolean masks of positive pairs and of negatives that :class:`InfoNCELoss` uses.

    Args:
        labels (torch.Tensor): ``(B,)`` anchor labels.
        ref_labels (torch.Tensor, optional): ``(M,)`` pool labels; ``None`` when the pool is the batch
            (self-pairs are then left out).
        indices_tuple (tuple[torch.Tensor, ...], optional): Triplets ``(a, p, n)`` or pairs
            ``(a1, p, a2, n)``; ``None`` for every pair.
        negatives (str): ``"pool"`` (every other-label row) or ``"mined"`` (the tuple's negatives).
            Default: ``"pool"``.
        duplicate_ids (torch.Tensor, optional): ``(B,)`` the anchors' duplicate ids; rows repeating an
            anchor or one of its positives (see :func:`~composer_dynsample.mining.duplicates.duplicate_negatives`)
            are then no negatives of it. Default: none.
        ref_duplicate_ids (torch.Tensor, optional): ``(M,)`` the pool's, needed with ``duplicate_ids``
            and ``ref_labels``. Default: none.

    Returns:
        ``(positive, negative)``: repeated pairs in the tuple count once.

    Example:
        >>> labels = torch.tensor([0, 0, 1])
        >>> positive, negative = info_nce_masks(labels, None, None)
        >>> positive.int().tolist(), negative.int().tolist()
        ([[0, 1, 0], [1, 0, 0], [0, 0, 0]], [[0, 0, 1], [0, 0, 1], [1, 1, 0]])
        >>> tuples = (torch.tensor([0, 0]), torch.tensor([1, 1]), torch.tensor([2, 2]))
        >>> [m.int().tolist() for m in info_nce_masks(labels, None, tuples, "mined")]
        [[[0, 1, 0], [0, 0, 0], [0, 0, 0]], [[0, 0, 1], [0, 0, 0], [0, 0, 0]]]
        >>> info_nce_masks(labels, None, None, duplicate_ids=torch.tensor([5, 6, 6]))[1].int().tolist()
        [[0, 0, 0], [0, 0, 0], [0, 0, 0]]
    """
    check_choice("negatives", negatives, NEGATIVES)
    ref = labels if ref_labels is None else ref_labels
    different = labels[:, None] != ref[None, :]
    if indices_tuple is None:
        positive = ~different
        if ref_labels is None:
            positive.fill_diagonal_(False)
        negative = different
    else:
        anchors, positives, negative_anchors, negative_rows = _split_tuple(indices_tuple)
        positive = torch.zeros_like(different)  # values made on the device: no copy of a host scalar
        positive.index_put_((anchors, positives), positive.new_ones(anchors.shape))
        negative = different
        if negatives == "mined":
            negative = torch.zeros_like(different)
            negative.index_put_((negative_anchors, negative_rows), negative.new_ones(negative_anchors.shape))
    ids = _pool_duplicate_ids(labels, ref_labels, duplicate_ids, ref_duplicate_ids)
    if ids is None:
        return positive, negative
    return positive, negative & ~duplicate_negatives(labels, ids[0], ref, ids[1])


def _pool_duplicate_ids(
    labels: torch.Tensor,
    ref_labels: torch.Tensor | None,
    duplicate_ids: torch.Tensor | None,
    ref_duplicate_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The anchors' and the pool's duplicate ids, checked, or ``None`` when none were given."""
    if duplicate_ids is None:
        if ref_duplicate_ids is not None:
            raise ValueError("ref_duplicate_ids was given without duplicate_ids; pass both or neither.")
        return None
    duplicate_ids = check_labels("duplicate_ids", duplicate_ids, labels.shape[0], "labels")
    if ref_labels is None:
        if ref_duplicate_ids is not None:
            raise ValueError(
                "ref_duplicate_ids was given without ref_emb: the pool is then the batch, whose ids are "
                "duplicate_ids; pass ref_duplicate_ids only with ref_emb."
            )
        return duplicate_ids, duplicate_ids
    if ref_duplicate_ids is None:
        raise ValueError(
            "duplicate_ids with ref_emb needs ref_duplicate_ids, the pool rows' ids (-1 for a row without one)."
        )
    return duplicate_ids, check_labels(
        "ref_duplicate_ids", ref_duplicate_ids, ref_labels.shape[0], "ref_labels"
    )


def _split_tuple(indices_tuple: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """``(a1, p, a2, n)`` from triplets or pairs, each checked to be a 1-D integer tensor of matching length."""
    if not isinstance(indices_tuple, (tuple, list)) or len(indices_tuple) not in (3, 4):
        count = (
            len(indices_tuple) if isinstance(indices_tuple, (tuple, list)) else type(indices_tuple).__name__
        )
        raise ValueError(
            "InfoNCELoss needs an indices_tuple of triplets (anchors, positives, negatives) or pairs "
            f"(a1, p, a2, n), got {count} tensors."
        )
    names = ("anchors", "positives", "negatives") if len(indices_tuple) == 3 else ("a1", "p", "a2", "n")
    for name, index in zip(names, indices_tuple):
        check_labels(f"indices_tuple's {name}", index)
    parts = tuple(indices_tuple)
    if len(parts) == 3:
        parts = (parts[0], parts[1], parts[0], parts[2])
    for first, second, kind in ((0, 1, "positive"), (2, 3, "negative")):
        if parts[first].numel() != parts[second].numel():
            raise ValueError(
                f"indices_tuple's {kind} pairs have {parts[first].numel()} anchors but "
                f"{parts[second].numel()} partners; they must match."
            )
    return parts


def _logsumexp_over_ranks(column: torch.Tensor) -> torch.Tensor:
    """Combine each rank's per-column log-sum-exp into the one over every rank's anchors, differentiably.

    Gathered with gradient as an ``(M, 1)`` column, so each rank's share of the gradient flows back to
    the rank (and the anchors) it came from.
    """
    rows = column.shape[0]
    gathered, _, _ = all_gather_embeddings(
        column[:, None], torch.zeros(rows, dtype=torch.long, device=column.device), with_grad=True
    )
    world = get_world_size()
    if gathered.shape[0] != rows * world:
        raise ValueError(
            f"InfoNCELoss(symmetric=True) with global_mean=True needs the same pool on every rank; this rank's "
            f"has {rows} rows but the ranks hold {gathered.shape[0]} together over {world} ranks."
        )
    return torch.logsumexp(gathered.view(world, rows), dim=0)
