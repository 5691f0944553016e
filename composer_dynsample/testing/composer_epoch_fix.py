"""Undo Composer's batch-sampler epoch fix for a block: the harness of a regression test for it.

Composer before v0.21.2 called ``set_epoch`` only on the train dataloader's ``sampler``, never on its
``batch_sampler`` (Composer issue #3123). A P x K batch sampler such as
:class:`~composer_dynsample.PKBatchSampler` is the ``batch_sampler``, so every epoch trained on epoch 0's
order again; :class:`~composer_dynsample.SetSamplerEpoch` sets the epoch itself and repairs that.
:func:`reverted_batch_sampler_fix` puts the old behaviour back into the installed Composer for the length
of a ``with`` block, so a test can show both halves: that a run without the callback repeats epoch 0, and
that the callback gives each epoch its own order, whatever Composer does.

It replaces ``composer.trainer.trainer._get_distributed_sampler``, a private function of Composer that the
trainer calls at every epoch start and on resume. Being private, it may move in a later Composer; the
block then refuses to start with a ``RuntimeError`` that names the installed Composer version, rather than
patching nothing and letting the test pass for the wrong reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler

__all__ = ["reverted_batch_sampler_fix", "reverted_batch_sampler_fix_fixture"]

#: The private function of ``composer.trainer.trainer`` that finds the sampler whose epoch the trainer sets.
PATCHED_NAME = "_get_distributed_sampler"


def _pre_fix_get_distributed_sampler(dataloader: DataLoader) -> DistributedSampler | None:
    """Composer's behaviour before v0.21.2 (issue #3123): only ``dataloader.sampler`` got its epoch set."""
    return dataloader.sampler if isinstance(dataloader.sampler, DistributedSampler) else None


def _trainer_module() -> Any:
    """``composer.trainer.trainer``, checked to hold the function this harness replaces."""
    import composer
    import composer.trainer.trainer as trainer_module

    if not callable(getattr(trainer_module, PATCHED_NAME, None)):
        version = getattr(composer, "__version__", "(version unknown)")
        raise RuntimeError(
            f"reverted_batch_sampler_fix: the installed Composer {version} has no "
            f"composer.trainer.trainer.{PATCHED_NAME}, the private function it replaces, so it cannot "
            "simulate the trainer before Composer's batch-sampler epoch fix (v0.21.2) on this version."
        )
    return trainer_module


@contextlib.contextmanager
def reverted_batch_sampler_fix() -> Iterator[None]:
    """Run the block with Composer's batch-sampler epoch fix (v0.21.2) undone, as on an older Composer.

    Inside the block the trainer sets the epoch of the train dataloader's ``sampler`` only, never of its
    ``batch_sampler``: without :class:`~composer_dynsample.SetSamplerEpoch` a batch sampler then yields
    epoch 0's batches every epoch. Build and fit the ``Trainer`` inside the block. The installed Composer
    is restored when the block ends, also when it raises. Blocks may nest. The patch is process-wide:
    run no other training in another thread meanwhile.

    Returns:
        A context manager; it yields ``None``.

    Raises:
        RuntimeError: The installed Composer has no ``composer.trainer.trainer._get_distributed_sampler``
            (the message names its version); nothing is patched.

    Example::

        import torch
        from composer import Trainer

        from composer_dynsample import PKBatchSampler, SetSamplerEpoch, build_dataloader
        from composer_dynsample.testing import reverted_batch_sampler_fix

        labels = torch.arange(96) % 8
        sampler = PKBatchSampler(labels, classes_per_batch=4, samples_per_class=3)
        with reverted_batch_sampler_fix():
            trainer = Trainer(
                model=my_model,  # your ComposerModel, taking (features, label) batches
                train_dataloader=build_dataloader(my_dataset, sampler),
                max_duration="3ep",
                callbacks=[SetSamplerEpoch()],  # without it, all 3 epochs train epoch 0's batches
            )
            trainer.fit()
    """
    trainer_module = _trainer_module()
    original: Callable[[DataLoader], DistributedSampler | None] = getattr(trainer_module, PATCHED_NAME)
    setattr(trainer_module, PATCHED_NAME, _pre_fix_get_distributed_sampler)
    try:
        yield
    finally:
        setattr(trainer_module, PATCHED_NAME, original)


def reverted_batch_sampler_fix_fixture(name: str = "composer_before_the_fix") -> Callable[..., Any]:
    """A pytest fixture named ``name`` that runs each test using it inside :func:`reverted_batch_sampler_fix`.

    Assign it at the top level of a test module or a ``conftest.py``; pytest is imported only when this is
    called. Each call makes a new fixture, so several modules may each make their own.

    Args:
        name (str): The fixture's name, the argument a test asks for. Default: ``"composer_before_the_fix"``.

    Returns:
        The fixture function, registered with ``pytest.fixture(name=name)``.

    Example::

        from composer_dynsample.testing import reverted_batch_sampler_fix_fixture

        composer_before_the_fix = reverted_batch_sampler_fix_fixture()


        def test_each_epoch_has_its_own_order(composer_before_the_fix):
            ...  # build and fit the Trainer here, with SetSamplerEpoch()
    """
    import pytest

    def fixture() -> Iterator[None]:
        with reverted_batch_sampler_fix():
            yield

    fixture.__doc__ = "Composer's batch-sampler epoch fix (v0.21.2) undone for the test (composer_dynsample)."
    return pytest.fixture(name=name)(fixture)
