"""Hard-negative mining at ``Event.AFTER_FORWARD``, on the embeddings the forward pass produced.

See the method card, ``README.md`` in this folder.
"""

from composer_dynsample.algorithms.hard_negative_mining.hard_negative_mining import (
    STRATEGIES,
    HardNegativeMining,
    mine,
)
from composer_dynsample.algorithms.hard_negative_mining.memory import CrossBatchMemory

__all__ = ["STRATEGIES", "CrossBatchMemory", "HardNegativeMining", "mine"]
