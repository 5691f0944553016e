"""The miners by name: the names YAML and :class:`~composer_dynsample.HardNegativeMining` use.

:data:`MINERS` maps each name to its class, :data:`STRATEGIES` to its functional form;
:func:`build_miner` builds one from a name and its options with errors that name the option, and
:func:`mine` runs one by name.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

import torch

from composer_dynsample.mining.base import BaseMiner
from composer_dynsample.mining.batch_hard import BatchHardMiner, batch_hard
from composer_dynsample.mining.distance_weighted import DistanceWeightedMiner, distance_weighted
from composer_dynsample.mining.hard_topk import HardTopKMiner, hard_topk
from composer_dynsample.mining.multi_similarity import MultiSimilarityMiner, multi_similarity
from composer_dynsample.mining.random_triplets import RandomTripletsMiner, random_triplets
from composer_dynsample.mining.semi_hard import SemiHardMiner, semi_hard
from composer_dynsample.validation import did_you_mean

__all__ = ["MINERS", "STRATEGIES", "build_miner", "check_strategy", "mine"]

#: Each strategy name and the miner class it builds.
MINERS: Final[dict[str, type[BaseMiner]]] = {
    "batch_hard": BatchHardMiner,
    "semi_hard": SemiHardMiner,
    "hard_topk": HardTopKMiner,
    "distance_weighted": DistanceWeightedMiner,
    "multi_similarity": MultiSimilarityMiner,
    "random_triplets": RandomTripletsMiner,
}

#: Each strategy name and its functional form (``STRATEGIES["semi_hard"] is semi_hard``).
STRATEGIES: Final[dict[str, Callable[..., tuple[torch.Tensor, ...]]]] = {
    "batch_hard": batch_hard,
    "semi_hard": semi_hard,
    "hard_topk": hard_topk,
    "distance_weighted": distance_weighted,
    "multi_similarity": multi_similarity,
    "random_triplets": random_triplets,
}


def check_strategy(name: object, strategies: Collection[str] = MINERS, where: str = "strategy") -> str:
    """Return ``name`` if it is one of ``strategies``, else raise a ``ValueError`` with the closest name.

    Example:
        >>> check_strategy("semihard", ["batch_hard", "semi_hard"])
        Traceback (most recent call last):
            ...
        ValueError: strategy must be one of ['batch_hard', 'semi_hard'], got 'semihard'. Did you mean 'semi_hard'?
    """
    if not isinstance(name, str) or name not in strategies:
        raise ValueError(
            f"{where} must be one of {sorted(strategies)}, got {name!r}.{did_you_mean(name, strategies)}"
        )
    return name


def build_miner(
    name: str, options: Mapping[str, Any] | None = None, *, distance: str = "cosine", where: str = "options"
) -> BaseMiner:
    """The miner ``name`` built with ``options`` and ``distance``, its options checked now.

    Args:
        name (str): A key of :data:`MINERS`.
        options (Mapping[str, Any], optional): The miner's own options (``margin``, ``k``, ...); the
            distance is given apart, so ``options`` may not hold it.
        distance (str): The distance. Default: ``"cosine"``.
        where (str): What ``options`` are called in error messages. Default: ``"options"``.

    Raises:
        ValueError: On an unknown name, unknown option keys (listing those the miner takes) or a bad value.

    Example:
        >>> build_miner("semi_hard", {"margin": 0.3})
        SemiHardMiner(margin=0.3, fallback='hardest', distance='cosine', chunk_size=None)
        >>> build_miner("hard_topk", {"k": 0}, where="miner_kwargs['hard_topk']")
        Traceback (most recent call last):
            ...
        ValueError: miner_kwargs['hard_topk']: k must be an integer >= 1, got 0.
    """
    miner_class = MINERS[check_strategy(name)]
    options = dict(options or {})
    taken = [option for option in miner_class.option_names() if option != "distance"]
    unknown = sorted(set(options) - set(taken))
    if unknown:
        raise ValueError(f"{where} has unknown keys {unknown}; {name} takes {taken}.")
    try:
        return miner_class(distance=distance, **options)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None


def mine(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    strategy: str = "semi_hard",
    *,
    ref_embeddings: torch.Tensor | None = None,
    ref_labels: torch.Tensor | None = None,
    self_offset: int | None = None,
    distance: str = "cosine",
    **miner_kwargs: Any,
) -> tuple[torch.Tensor, ...]:
    """Run the miner named ``strategy`` under ``no_grad`` and return PML-style index tuples.

    Args:
        embeddings (torch.Tensor): ``(B, D)`` anchors.
        labels (torch.Tensor): ``(B,)`` integer labels.
        strategy (str): One of :data:`MINERS`. Default: ``"semi_hard"``.
        ref_embeddings (torch.Tensor, optional): ``(M, D)`` reference pool; positives and negatives
            index it. Default: the batch itself.
        ref_labels (torch.Tensor, optional): The pool's labels.
        self_offset (int, optional): When the pool contains the anchors themselves (a cross-rank pool or
            the batch followed by a memory), anchor ``i`` sits at pool row ``self_offset + i``, and the
            miner never pairs an anchor with its own row. Default: ``None``.
        distance (str): ``"cosine"``, ``"euclidean"`` or ``"squared_euclidean"``. Default: ``"cosine"``.
        **miner_kwargs: The miner's options (``margin`` for ``semi_hard``, ``k`` for ``hard_topk``, ...).

    Returns:
        Triplets ``(anchors, positives, negatives)`` or pairs ``(a1, p, a2, n)``.

    Example:
        >>> emb = torch.nn.functional.normalize(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))
        >>> anchors, positives, negatives = mine(emb, torch.arange(8) % 4, "batch_hard")
        >>> anchors.tolist()
        [0, 1, 2, 3, 4, 5, 6, 7]
    """
    miner = MINERS[check_strategy(strategy)](distance=distance, **miner_kwargs)
    if ref_embeddings is None:
        self_offset = None  # the batch is the pool: the miners skip each anchor's own row already
    return miner(embeddings, labels, ref_embeddings, ref_labels, self_offset=self_offset)
