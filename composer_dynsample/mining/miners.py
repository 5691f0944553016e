"""Old home of the miners, which now live one per module (:mod:`composer_dynsample.mining.semi_hard`, ...).

Importing a miner from here still works, with a ``DeprecationWarning`` naming its new module.
"""

from composer_dynsample._lazy import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "SEMI_HARD_FALLBACKS": "composer_dynsample.mining.semi_hard",
        "batch_hard": "composer_dynsample.mining.batch_hard",
        "distance_weighted": "composer_dynsample.mining.distance_weighted",
        "hard_topk": "composer_dynsample.mining.hard_topk",
        "multi_similarity": "composer_dynsample.mining.multi_similarity",
        "semi_hard": "composer_dynsample.mining.semi_hard",
    },
)
