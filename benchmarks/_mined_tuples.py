"""Two runs of a miner compared: their index tuples as sorted sets, and which differences are near-ties.

Two devices (or an fp16 input and its float32 copy) compute the distance matrix with different rounding
(another matmul order, another reduction tree), so where two candidates lie within float32 rounding of
each other, or of a threshold of the miner's rule, the runs may choose differently: those are the ties
the package allows ("equal except at ties"). :func:`compare_tuples` finds the tuples only one run has;
:func:`unexplained_differences` keeps those that the float64 distances do not show to be such a near-tie.

The batch is its own pool (no ``ref_embeddings``), as in the GPU benchmark that uses these helpers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: Two float64 distances this close are a tie for float32 distance code (which rounds at about 1e-7).
TIE_TOLERANCE = 1e-5
#: distance_weighted: two draws are a rounding flip when the weight between them is below this share.
MASS_TOLERANCE = 1e-4
#: Beyond this many differing tuples the comparison stops looking for ties (and counts them all).
MAX_EXAMINED = 2_000

Tuples = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class TupleComparison:
    """Two index tuples as sorted sets of int64 keys (one key per tuple; pairs: positives, negatives).

    Attributes:
        counts: The number of tuples of each run.
        only_first: Keys of the tuples only the first run has, per part (1 for triplets, 2 for pairs).
        only_second: The same for the second run.
        equal: Whether the sorted keys are identical (the same tuples, each as often).
    """

    counts: tuple[int, int]
    only_first: tuple[torch.Tensor, ...]
    only_second: tuple[torch.Tensor, ...]
    equal: bool

    @property
    def differing(self) -> int:
        """How many tuples one run has and the other has not (both sides counted)."""
        return sum(int(keys.numel()) for keys in (*self.only_first, *self.only_second))


def tuple_keys(indices_tuple: Sequence[torch.Tensor], pool_size: int) -> list[torch.Tensor]:
    """Sorted int64 keys on the CPU: triplets ``(a, p, n)`` give one tensor, pairs ``(a1, p, a2, n)`` two.

    Example:
        >>> tuple_keys((torch.tensor([1, 0]), torch.tensor([0, 1]), torch.tensor([2, 2])), 3)
        [tensor([ 5, 11])]
    """
    if not isinstance(pool_size, int) or pool_size < 1:
        raise ValueError(f"pool_size must be an integer >= 1, got {pool_size!r}.")
    parts = [torch.as_tensor(t).detach().to("cpu", torch.int64).reshape(-1) for t in indices_tuple]
    if len(parts) == 3:
        anchors, positives, negatives = parts
        groups = [(anchors * pool_size + positives) * pool_size + negatives]
    elif len(parts) == 4:
        groups = [parts[0] * pool_size + parts[1], parts[2] * pool_size + parts[3]]
    else:
        raise ValueError(f"indices_tuple must hold 3 tensors (triplets) or 4 (pairs), got {len(parts)}.")
    return [keys.sort().values for keys in groups]


def decode_keys(keys: torch.Tensor, pool_size: int, width: int) -> tuple[torch.Tensor, ...]:
    """The indices behind :func:`tuple_keys`' keys: ``(a, p, n)`` for ``width=3``, ``(a, x)`` for ``2``."""
    if width == 3:
        return keys // (pool_size * pool_size), (keys // pool_size) % pool_size, keys % pool_size
    return keys // pool_size, keys % pool_size


def compare_tuples(
    first: Sequence[torch.Tensor], second: Sequence[torch.Tensor], pool_size: int
) -> TupleComparison:
    """Compare two miners' outputs as sorted sets of tuples, wherever their tensors live.

    Example:
        >>> a = (torch.tensor([0, 1]), torch.tensor([1, 0]), torch.tensor([2, 2]))
        >>> b = (torch.tensor([1, 0]), torch.tensor([0, 1]), torch.tensor([2, 3]))
        >>> result = compare_tuples(a, b, 4)
        >>> result.equal, result.differing
        (False, 2)
    """
    keys_first, keys_second = tuple_keys(first, pool_size), tuple_keys(second, pool_size)
    if len(keys_first) != len(keys_second):
        raise ValueError(
            f"cannot compare a tuple of {len(first)} tensors with one of {len(second)}: "
            "both must be triplets or both pairs."
        )
    only_first = tuple(a[~torch.isin(a, b)] for a, b in zip(keys_first, keys_second, strict=True))
    only_second = tuple(b[~torch.isin(b, a)] for a, b in zip(keys_first, keys_second, strict=True))
    equal = all(torch.equal(a, b) for a, b in zip(keys_first, keys_second, strict=True))
    counts = (sum(int(k.numel()) for k in keys_first), sum(int(k.numel()) for k in keys_second))
    return TupleComparison(counts, only_first, only_second, equal)


def cosine_distances(embeddings: torch.Tensor) -> torch.Tensor:
    """``1 - cos`` between every two rows, in float64 on the CPU (the reference the ties are judged by)."""
    x = embeddings.detach().to("cpu", torch.float64)
    x = x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return 1.0 - x @ x.T


def unexplained_differences(
    miner: str,
    comparison: TupleComparison,
    first: Sequence[torch.Tensor],
    second: Sequence[torch.Tensor],
    distances: torch.Tensor,
    labels: torch.Tensor,
    params: Mapping[str, Any],
) -> int:
    """How many of the differing tuples are not near-ties of ``miner``'s rule.

    Args:
        miner: The miner's name (``batch_hard``, ``hard_topk``, ``semi_hard``, ``multi_similarity`` or
            ``distance_weighted``); any other name explains nothing.
        comparison: :func:`compare_tuples` of ``first`` and ``second``.
        first: The first run's tuples.
        second: The second run's tuples.
        distances: ``(B, B)`` float64 cosine distances of the embeddings (:func:`cosine_distances`).
        labels: ``(B,)`` labels.
        params: The miner's arguments that the rule uses (``margin``, ``epsilon``, ``cutoff``,
            ``nonzero_loss_cutoff``, ``dim``).

    Returns:
        The number of differing tuples (both sides) left unexplained; all of them when there are more
        than :data:`MAX_EXAMINED`.
    """
    if comparison.equal:
        return 0
    rule = _RULES.get(miner)
    if rule is None or comparison.differing > MAX_EXAMINED:
        return comparison.differing
    labels = labels.detach().to("cpu", torch.int64)
    return rule(comparison, _Runs(_on_cpu(first), _on_cpu(second), distances, labels, params))


@dataclass(frozen=True)
class _Runs:
    """What a tie rule reads: both runs' tuples on the CPU, the float64 distances, labels and arguments."""

    first: Tuples
    second: Tuples
    distances: torch.Tensor
    labels: torch.Tensor
    params: Mapping[str, Any]


Rule = Callable[[TupleComparison, _Runs], int]


def _on_cpu(indices_tuple: Sequence[torch.Tensor]) -> Tuples:
    return tuple(t.detach().to("cpu", torch.int64) for t in indices_tuple)


def _close(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Two lists of distances that agree, sorted, within :data:`TIE_TOLERANCE`."""
    if x.numel() != y.numel():
        return False
    return x.numel() == 0 or float((x.sort().values - y.sort().values).abs().max()) <= TIE_TOLERANCE


def _differing_triplets(comparison: TupleComparison, pool_size: int) -> list[tuple[int, int, int]]:
    keys = torch.cat([*comparison.only_first, *comparison.only_second])
    return list(zip(*(t.tolist() for t in decode_keys(keys, pool_size, 3)), strict=True))


def _anchor_rule(comparison: TupleComparison, runs: _Runs) -> int:
    """batch_hard, hard_topk: per anchor, the chosen positives' and negatives' distances agree."""
    first, second, distances = runs.first, runs.second, runs.distances
    per_anchor = Counter(a for a, _, _ in _differing_triplets(comparison, distances.shape[1]))
    unexplained = 0
    for anchor, count in per_anchor.items():
        in_first, in_second = first[0] == anchor, second[0] == anchor
        row = distances[anchor]
        same_positives = _close(row[first[1][in_first]], row[second[1][in_second]])
        same_negatives = _close(row[first[2][in_first]], row[second[2][in_second]])
        if not (same_positives and same_negatives):
            unexplained += count
    return unexplained


def _negative_by_pair(triplets: Sequence[torch.Tensor]) -> dict[tuple[int, int], int]:
    anchors, positives, negatives = (t.tolist() for t in triplets)
    return dict(zip(zip(anchors, positives, strict=True), negatives, strict=True))


Explain = Callable[[dict[str, Any], int, int, "int | None", "int | None"], bool]


def _pair_rule(explain: Explain) -> Rule:
    """A rule for miners with one negative per (anchor, positive): ``explain(context, a, p, n_1, n_2)``."""

    def rule(comparison: TupleComparison, runs: _Runs) -> int:
        chosen_first, chosen_second = _negative_by_pair(runs.first), _negative_by_pair(runs.second)
        per_pair = Counter((a, p) for a, p, _ in _differing_triplets(comparison, runs.distances.shape[1]))
        context = {"distances": runs.distances, "labels": runs.labels, **runs.params}
        return sum(
            count
            for (a, p), count in per_pair.items()
            if not explain(context, a, p, chosen_first.get((a, p)), chosen_second.get((a, p)))
        )

    return rule


def _semi_hard_tie(
    context: dict[str, Any], a: int, p: int, n_first: int | None, n_second: int | None
) -> bool:
    """Two negatives at one distance, or a chosen one at ``d(a, p)`` or ``d(a, p) + margin``."""
    row = context["distances"][a]
    bounds = (float(row[p]), float(row[p]) + context.get("margin", 0.2))

    def at_bound(n: int | None) -> bool:
        return n is not None and any(abs(float(row[n]) - b) <= TIE_TOLERANCE for b in bounds)

    if at_bound(n_first) or at_bound(n_second):
        return True
    return n_first is not None and n_second is not None and _close(row[[n_first]], row[[n_second]])


def distance_weighted_weights(
    row: torch.Tensor, labels: torch.Tensor, anchor: int, params: Mapping[str, Any]
) -> torch.Tensor:
    """distance_weighted's sampling weights of one anchor over the pool, in float64, summing to one.

    ``row`` holds the anchor's cosine distances ``c = d^2 / 2``; same-label rows (the anchor too) and
    those at ``d >= nonzero_loss_cutoff`` weigh nothing.
    """
    dim = int(params["dim"])
    c_min = max(float(params.get("cutoff", 0.5)) ** 2 / 2.0, 1e-300)
    c_max = float(params.get("nonzero_loss_cutoff", 1.4)) ** 2 / 2.0
    excluded = (row >= c_max) | (labels == labels[anchor])
    clipped = row.clamp(min=c_min, max=2.0)
    log_w = -(dim - 3) / 2.0 * torch.log1p(-clipped / 2.0) - (dim - 2) / 2.0 * torch.log(2.0 * clipped)
    log_w = log_w.masked_fill(excluded | torch.isnan(log_w), -torch.inf)
    if bool(torch.isinf(log_w).all()):
        return torch.zeros_like(row)
    weights = (log_w - log_w.max()).exp()
    return weights / weights.sum()


def _distance_weighted_tie(
    context: dict[str, Any], a: int, p: int, n_first: int | None, n_second: int | None
) -> bool:
    """Draws on either side of one CDF step (no weight between them), or at the distance cutoff."""
    row = context["distances"][a]
    c_max = float(context.get("nonzero_loss_cutoff", 1.4)) ** 2 / 2.0
    if any(n is not None and abs(float(row[n]) - c_max) <= TIE_TOLERANCE for n in (n_first, n_second)):
        return True
    if n_first is None or n_second is None:
        return False
    weights = distance_weighted_weights(row, context["labels"], a, context)
    low, high = sorted((n_first, n_second))
    return float(weights[low + 1 : high].sum()) <= MASS_TOLERANCE


def _multi_similarity_rule(comparison: TupleComparison, runs: _Runs) -> int:
    """Positive pairs at ``d(a, p) + eps == min_n d(a, n)``, negative pairs at ``d(a, n) - eps == max_p``."""
    distances, labels = runs.distances, runs.labels
    epsilon = float(runs.params.get("epsilon", 0.1))
    same = labels[:, None] == labels[None, :]
    positive = same & ~torch.eye(len(labels), dtype=torch.bool)
    nearest_negative = distances.masked_fill(same, torch.inf).amin(dim=1)
    farthest_positive = distances.masked_fill(~positive, -torch.inf).amax(dim=1)
    pool_size = distances.shape[1]
    unexplained = 0
    for part, (bound, sign) in enumerate(((nearest_negative, 1.0), (farthest_positive, -1.0))):
        keys = torch.cat([comparison.only_first[part], comparison.only_second[part]])
        anchors, others = decode_keys(keys, pool_size, 2)
        gap = (distances[anchors, others] + sign * epsilon - bound[anchors]).abs()
        unexplained += int((~(gap <= TIE_TOLERANCE)).sum())
    return unexplained


_RULES: dict[str, Rule] = {
    "batch_hard": _anchor_rule,
    "hard_topk": _anchor_rule,
    "semi_hard": _pair_rule(_semi_hard_tie),
    "distance_weighted": _pair_rule(_distance_weighted_tie),
    "multi_similarity": _multi_similarity_rule,
}
