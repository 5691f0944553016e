"""reverted_batch_sampler_fix: it patches Composer's trainer for the block only, and refuses a Composer without
the function it replaces."""

from __future__ import annotations

import composer
import composer.trainer.trainer as trainer_module
import pytest
import torch

from composer_dynsample import PKBatchSampler, build_dataloader
from composer_dynsample.testing import reverted_batch_sampler_fix, reverted_batch_sampler_fix_fixture
from composer_dynsample.testing.composer_epoch_fix import _pre_fix_get_distributed_sampler
from tests.common import index_dataset

LABELS = torch.arange(24) % 4

composer_before_the_fix = reverted_batch_sampler_fix_fixture()


def pk_loader():
    return build_dataloader(index_dataset(LABELS), PKBatchSampler(LABELS, 2, 3, num_replicas=1, rank=0))


def test_the_block_patches_the_trainer_and_restores_it():
    installed = trainer_module._get_distributed_sampler
    loader = pk_loader()
    assert installed(loader) is loader.batch_sampler  # the installed Composer has the fix
    with reverted_batch_sampler_fix():
        assert trainer_module._get_distributed_sampler is _pre_fix_get_distributed_sampler
        assert trainer_module._get_distributed_sampler(loader) is None  # the batch sampler is not found
    assert trainer_module._get_distributed_sampler is installed


def test_the_trainer_is_restored_when_the_block_raises():
    installed = trainer_module._get_distributed_sampler
    with pytest.raises(KeyError, match="inside"), reverted_batch_sampler_fix():
        raise KeyError("inside")
    assert trainer_module._get_distributed_sampler is installed


def test_nested_blocks_restore_the_installed_trainer():
    installed = trainer_module._get_distributed_sampler
    with reverted_batch_sampler_fix():
        with reverted_batch_sampler_fix():
            assert trainer_module._get_distributed_sampler is _pre_fix_get_distributed_sampler
        assert trainer_module._get_distributed_sampler is _pre_fix_get_distributed_sampler
    assert trainer_module._get_distributed_sampler is installed


def test_the_pre_fix_function_still_finds_a_plain_distributed_sampler():
    data = index_dataset(LABELS)
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0)
    loader = torch.utils.data.DataLoader(data, sampler=sampler, batch_size=4)
    assert _pre_fix_get_distributed_sampler(loader) is sampler


def test_a_composer_without_the_private_function_is_refused_in_one_line(monkeypatch):
    monkeypatch.delattr(trainer_module, "_get_distributed_sampler")
    with pytest.raises(RuntimeError) as caught, reverted_batch_sampler_fix():
        pytest.fail("the block ran")
    message = str(caught.value)
    assert "\n" not in message
    assert f"installed Composer {composer.__version__} has no" in message
    assert "composer.trainer.trainer._get_distributed_sampler" in message
    assert not hasattr(trainer_module, "_get_distributed_sampler")  # nothing was patched


def test_the_fixture_runs_the_test_inside_the_block(composer_before_the_fix):
    assert trainer_module._get_distributed_sampler is _pre_fix_get_distributed_sampler


def test_the_fixture_is_undone_after_its_test():
    assert trainer_module._get_distributed_sampler is not _pre_fix_get_distributed_sampler
