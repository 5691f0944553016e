"""Hard-negative mining on tensors: miners as configured objects.

Each miner is a class built with its options, checked there, and called on
``(embeddings, labels[, ref_embeddings, ref_labels])`` to return an ``indices_tuple`` in
pytorch-metric-learning's format, so its output can be passed to any PML loss:

* :class:`BatchHardMiner`: per anchor the farthest positive and nearest negative (triplets).
* :class:`HardTopKMiner`: per anchor the ``k`` nearest negatives with its farthest positive (triplets).
* :class:`SemiHardMiner`: per anchor-positive pair the nearest semi-hard negative (triplets).
* :class:`DistanceWeightedMiner`: per anchor-positive pair a negative sampled by inverse distance density
  (triplets).
* :class:`MultiSimilarityMiner`: multi-similarity positive and negative pairs (``(a1, p, a2, n)``).
* :class:`RandomTripletsMiner`: the baseline, a random positive and negative per anchor (triplets).

:data:`MINERS` names them for YAML and :class:`~composer_dynsample.HardNegativeMining`, and
:func:`build_miner` builds one by name; a new miner subclasses :class:`BaseMiner` and writes its ``mine``.

Beside them, the pure steps around a miner in training: :func:`mining_step` runs one step (the pool, the
miner, duplicate negatives, the memory, the statistics) and returns the
:class:`~composer_dynsample.MinedBatch` the loss receives; :func:`assemble_pool` builds the :class:`Pool` a
batch is mined against (the batch, other ranks' rows, a :class:`CrossBatchMemory`),
:func:`mining_statistics` summarises the mined tuples for logging and :func:`drop_duplicate_negatives`
leaves out negatives that repeat the anchor's sample under another label (duplicate ids).

The miners run under ``torch.no_grad()``, are vectorised over anchors, and compute the distance matrix
in chunks of anchors so that memory stays ``O(chunk x M)``. No Composer import is needed here.

Example:
    >>> import torch
    >>> from composer_dynsample.mining import BatchHardMiner
    >>> emb = torch.nn.functional.normalize(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), dim=1)
    >>> anchors, positives, negatives = BatchHardMiner(distance="cosine")(emb, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
    >>> anchors.tolist()
    [0, 1, 2, 3, 4, 5, 6, 7]
"""

from composer_dynsample.mining.base import BaseMiner
from composer_dynsample.mining.batch_hard import BatchHardMiner
from composer_dynsample.mining.distance_weighted import DistanceWeightedMiner
from composer_dynsample.mining.duplicates import drop_duplicate_negatives
from composer_dynsample.mining.hard_topk import HardTopKMiner
from composer_dynsample.mining.memory import CrossBatchMemory
from composer_dynsample.mining.mined_batch import MinedBatch
from composer_dynsample.mining.multi_similarity import MultiSimilarityMiner
from composer_dynsample.mining.pool import Pool, assemble_pool
from composer_dynsample.mining.random_triplets import RandomTripletsMiner
from composer_dynsample.mining.registry import MINERS, build_miner
from composer_dynsample.mining.semi_hard import SemiHardMiner
from composer_dynsample.mining.statistics import mining_statistics
from composer_dynsample.mining.step import mining_step

__all__ = [
    "MINERS",
    "BaseMiner",
    "BatchHardMiner",
    "CrossBatchMemory",
    "DistanceWeightedMiner",
    "HardTopKMiner",
    "MinedBatch",
    "MultiSimilarityMiner",
    "Pool",
    "RandomTripletsMiner",
    "SemiHardMiner",
    "assemble_pool",
    "build_miner",
    "drop_duplicate_negatives",
    "mining_statistics",
    "mining_step",
]
