"""Hard-negative mining at ``Event.AFTER_FORWARD``, on the embeddings the forward pass produced.

See the method card, ``README.md`` in this folder.
"""

from composer_dynsample.algorithms.hard_negative_mining.hard_negative_mining import HardNegativeMining
from composer_dynsample.mining.memory import CrossBatchMemory

__all__ = ["CrossBatchMemory", "HardNegativeMining"]
