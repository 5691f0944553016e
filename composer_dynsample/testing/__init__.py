"""What a user's own test suite imports: the harnesses this package's suite proves its promises with.

- :func:`reverted_batch_sampler_fix` (a ``with`` block) and :func:`reverted_batch_sampler_fix_fixture` (a
  pytest fixture): Composer's batch-sampler epoch fix undone for a block, to show that a run without
  :class:`~composer_dynsample.SetSamplerEpoch` repeats epoch 0 and that the callback repairs it
  (:mod:`.composer_epoch_fix`; the regression test to copy is in docs/api.md);
- :class:`HostReadCounter` and the :class:`HostReadsPerStep` callback: every read of a tensor's value on the
  host (``.item()``, ``.tolist()``, ``bool(tensor)``...), by who asked, per training step
  (:mod:`.host_reads`);
- :class:`SyncOpCounter` and the :class:`SyncOpsPerStep` callback: the operators that make a CUDA device wait,
  per step, counted on the CPU (:mod:`.device_syncs`).

None of them is a callback to train with; they patch torch or Composer for the block they run in.
"""

from composer_dynsample.testing.composer_epoch_fix import (
    reverted_batch_sampler_fix,
    reverted_batch_sampler_fix_fixture,
)
from composer_dynsample.testing.device_syncs import SYNCING_OPS, SyncOpCounter, SyncOpsPerStep, syncs_on_cuda
from composer_dynsample.testing.host_reads import HOST_READS, HostReadCounter, HostReadsPerStep

__all__ = [
    "HOST_READS",
    "SYNCING_OPS",
    "HostReadCounter",
    "HostReadsPerStep",
    "SyncOpCounter",
    "SyncOpsPerStep",
    "reverted_batch_sampler_fix",
    "reverted_batch_sampler_fix_fixture",
    "syncs_on_cuda",
]
