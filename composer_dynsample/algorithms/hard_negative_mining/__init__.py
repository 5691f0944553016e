"""Hard-negative mining at ``Event.AFTER_FORWARD``, on the embeddings the forward pass produced.

See the method card, ``README.md`` in this folder.
"""

from composer_dynsample.algorithms.hard_negative_mining.hard_negative_mining import HardNegativeMining, mine
from composer_dynsample.algorithms.hard_negative_mining.schedule import StrategySchedule
from composer_dynsample.mining.memory import CrossBatchMemory
from composer_dynsample.mining.registry import STRATEGIES

__all__ = ["STRATEGIES", "CrossBatchMemory", "HardNegativeMining", "StrategySchedule", "mine"]
