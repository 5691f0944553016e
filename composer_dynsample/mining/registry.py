"""The miners by name: the names YAML and :class:`~composer_dynsample.HardNegativeMining` use.

:data:`MINERS` maps each name to its class; :func:`build_miner` builds one from a name and its options
with errors that name the option.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final

from composer_dynsample.mining.base import BaseMiner
from composer_dynsample.mining.batch_hard import BatchHardMiner
from composer_dynsample.mining.distance_weighted import DistanceWeightedMiner
from composer_dynsample.mining.hard_topk import HardTopKMiner
from composer_dynsample.mining.multi_similarity import MultiSimilarityMiner
from composer_dynsample.mining.random_triplets import RandomTripletsMiner
from composer_dynsample.mining.semi_hard import SemiHardMiner
from composer_dynsample.validation import did_you_mean

__all__ = ["MINERS", "build_miner", "check_strategy"]

#: Each strategy name and the miner class it builds.
MINERS: Final[dict[str, type[BaseMiner]]] = {
    "batch_hard": BatchHardMiner,
    "semi_hard": SemiHardMiner,
    "hard_topk": HardTopKMiner,
    "distance_weighted": DistanceWeightedMiner,
    "multi_similarity": MultiSimilarityMiner,
    "random_triplets": RandomTripletsMiner,
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
