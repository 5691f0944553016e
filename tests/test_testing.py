"""``composer_dynsample.testing``, the harnesses a user's own test suite imports, and its old paths.

- ``reverted_batch_sampler_fix``: it patches Composer's trainer for the block only, and refuses a Composer
  without the function it replaces;
- ``SyncOpCounter``: the operations that make a CUDA device wait for the host, recognised on the CPU, named by
  the line that called them (``HostReadCounter`` has its own tests in tests/algorithms/test_host_reads.py);
- the old paths under ``composer_dynsample.callbacks`` still work for one release, each with a
  ``DeprecationWarning`` naming the new one (that importing the callbacks leaves this module unloaded is
  tests/test_package.py's).
"""

from __future__ import annotations

import importlib
import sys

import composer
import composer.trainer.trainer as trainer_module
import pytest
import torch

from composer_dynsample import PKBatchSampler, build_dataloader, testing
from composer_dynsample.testing import (
    HostReadCounter,
    SyncOpCounter,
    _pre_fix_get_distributed_sampler,
    reverted_batch_sampler_fix,
    reverted_batch_sampler_fix_fixture,
    syncs_on_cuda,
)
from tests.common import index_dataset

# reverted_batch_sampler_fix and its fixture.

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


# SyncOpCounter, beside HostReadCounter.


def _ops(counter: SyncOpCounter) -> list[str]:
    return sorted(op for (_, _, op), n in counter.sites.items() for _ in range(n))


def test_each_kind_of_syncing_operation_is_counted_and_the_rest_are_not():
    x = torch.arange(8.0)
    with SyncOpCounter() as counter:
        x.sum().item()  # a value read
        bool(x.any())
        x[x > 3]  # a boolean-mask index: the mask's count sizes the result
        x[x > 3] = 0.0  # and a boolean-mask write
        torch.nonzero(x)
        torch.where(x > 1)  # one argument: nonzero
        torch.masked_select(x, x > 1)
        torch.unique(x)
        torch.equal(x, x)
        torch.arange(3).repeat_interleave(torch.tensor([1, 2, 0]))
    assert _ops(counter) == sorted(
        ["_local_scalar_dense"] * 2
        + [
            "index",
            "index_put_",
            "nonzero",
            "nonzero",
            "masked_select",
            "_unique2",
            "equal",
            "repeat_interleave",
        ]
    )
    with (
        SyncOpCounter() as quiet
    ):  # what stays on the device: arithmetic, gathers by index, top-k, masked fills
        y = x * 2 + 1
        y[torch.tensor([0, 2])]
        y.topk(3)
        y.masked_fill(y > 4, 0.0)
        torch.where(y > 4, y, 0.0)
        torch.arange(3).repeat_interleave(torch.tensor([1, 2, 0]), output_size=3)
        y.sort()
    assert quiet.total() == 0


def test_a_sync_is_attributed_to_the_first_caller_outside_torch():
    with SyncOpCounter() as counter:
        torch.nn.functional.normalize(torch.ones(2, 2))  # inside torch: no sync
        torch.arange(4).nonzero()
    ((origin, site, op),) = counter.sites
    assert (origin, op) == ("other", "nonzero") and site.startswith("test_testing.py:")
    assert counter.total("other") == 1 and counter.total("composer_dynsample") == 0


def test_copies_between_the_host_and_cuda_sync_unless_non_blocking():
    cpu = torch.ones(2)
    copy = torch.ops.aten._to_copy.default
    assert not syncs_on_cuda(copy, (cpu,), {"dtype": torch.float64})
    assert syncs_on_cuda(copy, (cpu,), {"device": torch.device("cuda")})
    assert not syncs_on_cuda(copy, (cpu,), {"device": torch.device("cuda"), "non_blocking": True})


def test_it_counts_alongside_the_host_read_counter():
    with HostReadCounter() as reads, SyncOpCounter() as syncs:
        torch.ones(3).sum().item()
    assert reads.total() == 1 and syncs.total() == 1


@pytest.mark.parametrize("armed", [True, False])
def test_disarmed_it_counts_nothing(armed):
    with SyncOpCounter() as counter:
        counter.armed = armed
        torch.arange(3).nonzero()
    assert counter.total() == int(armed)


def test_a_python_scalar_written_by_indexing_counts_and_values_made_on_the_device_do_not():
    # On an H200 (benchmarks/_sync_probe.py) ``t[rows, cols] = 0.5`` made 2 syncs and ``= True`` 1: the scalar
    # is copied from the host; ``index_put_`` of ``t.new_full(rows.shape, 0.5)`` made none.
    values, flags, rows = torch.zeros(4, 4), torch.zeros(4, 4, dtype=torch.bool), torch.arange(3)
    with SyncOpCounter() as counter:
        values[rows, rows] = 0.5
        flags[rows, rows] = True
    assert _ops(counter) == ["index_put_", "index_put_"]
    with SyncOpCounter() as counter:
        values.index_put_((rows, rows), values.new_full(rows.shape, 0.5))
        flags.index_put_((rows, rows), flags.new_ones(rows.shape))
        values[rows, rows]  # a read by integer index: no wait
    assert _ops(counter) == []


@pytest.mark.parametrize("miner", ["batch_hard", "hard_topk"])
def test_the_masks_of_mining_and_infonce_copy_no_scalar_from_the_host(miner):
    from composer_dynsample.losses import InfoNCELoss
    from composer_dynsample.mining.registry import build_miner

    generator = torch.Generator().manual_seed(0)
    embeddings = torch.nn.functional.normalize(torch.randn(32, 8, generator=generator), dim=1)
    labels = torch.arange(32) // 2
    with SyncOpCounter() as counter:
        tuples = build_miner(miner)(embeddings, labels)
        InfoNCELoss(0.1, negatives="mined")(embeddings, labels, tuples)
    ours = {op for (origin, _, op) in counter.sites if origin == "composer_dynsample"}
    assert "nonzero" in ours  # the mined tuples' variable sizes
    assert "index_put_" not in ours, ours  # the masks' writes take values made on the device, no host scalar


# The old paths, for one release.

#: Each old module under composer_dynsample.callbacks and the public names it still re-exports.
OLD_MODULES = {
    "composer_epoch_fix": ["reverted_batch_sampler_fix", "reverted_batch_sampler_fix_fixture"],
    "host_reads": ["HOST_READS", "HostReadCounter", "HostReadsPerStep", "caller_of", "origin_of"],
    "device_syncs": ["SYNCING_OPS", "SyncOpCounter", "SyncOpsPerStep", "syncs_on_cuda"],
}
MOVED_NAMES = ["reverted_batch_sampler_fix", "reverted_batch_sampler_fix_fixture"]


@pytest.mark.parametrize("old", sorted(OLD_MODULES))
def test_an_old_module_still_imports_with_a_warning_naming_the_new_path(old, monkeypatch):
    path = f"composer_dynsample.callbacks.{old}"
    monkeypatch.delitem(sys.modules, path, raising=False)  # a fresh import runs the module, and its warning
    with pytest.warns(DeprecationWarning, match=rf"{path} moved to composer_dynsample\.testing") as caught:
        module = importlib.import_module(path)
    assert module.__all__ == OLD_MODULES[old]
    for name in module.__all__:
        assert getattr(module, name) is getattr(testing, name), name
    assert all(name in caught[0].message.args[0] for name in module.__all__)


def test_the_warning_points_at_the_line_that_imports_the_old_module(monkeypatch):
    monkeypatch.delitem(sys.modules, "composer_dynsample.callbacks.host_reads", raising=False)
    with pytest.warns(DeprecationWarning) as caught:
        exec(compile("import composer_dynsample.callbacks.host_reads", "users_test.py", "exec"), {})
    assert [w.filename for w in caught] == ["users_test.py"]


@pytest.mark.parametrize("name", MOVED_NAMES)
def test_an_old_name_of_the_callbacks_package_still_resolves_with_a_warning(name):
    import composer_dynsample.callbacks as callbacks

    with pytest.warns(DeprecationWarning, match=rf"composer_dynsample\.testing\.{name}\b"):
        value = getattr(callbacks, name)
    assert value is getattr(testing, name)
    scope: dict = {}
    with pytest.warns(DeprecationWarning, match="composer_dynsample.testing"):
        exec(f"from composer_dynsample.callbacks import {name}", scope)
    assert scope[name] is value
    assert name not in callbacks.__all__ and name not in dir(callbacks)


def test_a_name_the_callbacks_package_never_had_is_still_an_attribute_error():
    import composer_dynsample.callbacks as callbacks

    with pytest.raises(AttributeError, match="reverted_batch_sampler"):
        callbacks.reverted_batch_sampler  # noqa: B018
