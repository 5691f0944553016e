"""``composer_dynsample.testing.device_syncs``: the operations that make a CUDA device wait for the host,
recognised on the CPU, named by the line that called them."""

from __future__ import annotations

import pytest
import torch

from composer_dynsample.testing.device_syncs import SyncOpCounter, syncs_on_cuda
from composer_dynsample.testing.host_reads import HostReadCounter


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
    assert (origin, op) == ("other", "nonzero") and site.startswith("test_device_syncs.py:")
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
