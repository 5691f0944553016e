"""CrossBatchMemory: FIFO order, wrap-around and checkpoint round trips, against a plain list reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from composer_dynsample import CrossBatchMemory


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.lists(st.integers(1, 9), min_size=1, max_size=8))
def test_fifo_matches_a_list_reference(size, batch_sizes):
    memory, reference, counter = CrossBatchMemory(size), [], 0
    for rows in batch_sizes:
        labels = torch.arange(counter, counter + rows)
        counter += rows
        memory.enqueue(labels[:, None].float().repeat(1, 3), labels)
        reference = (reference + labels.tolist())[-size:]
        assert memory.labels.tolist() == reference
        assert memory.embeddings[:, 0].tolist() == [float(v) for v in reference]
        assert len(memory) == len(reference)


def test_state_dict_round_trip_continues_identically():
    a, b = CrossBatchMemory(5), CrossBatchMemory(5)
    for step in range(3):
        a.enqueue(torch.randn(3, 2), torch.arange(3) + step)
    b.load_state_dict(a.state_dict())
    extra = torch.randn(2, 2), torch.tensor([7, 8])
    a.enqueue(*extra)
    b.enqueue(*extra)
    assert torch.equal(a.embeddings, b.embeddings) and torch.equal(a.labels, b.labels)


def test_a_state_dict_is_a_copy_both_ways():
    # Before, both held the live rows: a saved state changed with later steps, and two memories loaded
    # from one state wrote into each other.
    memory = CrossBatchMemory(4)
    memory.enqueue(torch.zeros(4, 2), torch.zeros(4, dtype=torch.int64))
    state = memory.state_dict()
    memory.enqueue(torch.ones(4, 2), torch.ones(4, dtype=torch.int64))
    assert bool((state["embeddings"] == 0).all()) and bool((state["labels"] == 0).all())
    first, second = CrossBatchMemory(4), CrossBatchMemory(4)
    first.load_state_dict(state)
    second.load_state_dict(state)
    first.enqueue(torch.full((2, 2), 5.0), torch.tensor([5, 5]))
    assert second.labels.tolist() == [0, 0, 0, 0] and bool((state["embeddings"] == 0).all())


def test_rows_are_detached_and_errors_are_clear():
    memory = CrossBatchMemory(4)
    memory.enqueue(torch.randn(2, 3, requires_grad=True), torch.tensor([0, 1]))
    assert not memory.embeddings.requires_grad
    with pytest.raises(ValueError, match="dimension 5 cannot join a memory of dimension 3"):
        memory.enqueue(torch.randn(1, 5), torch.tensor([0]))
    with pytest.raises(ValueError, match="memory size must be an integer >= 1"):
        CrossBatchMemory(0)
    with pytest.raises(ValueError, match="holds 4 rows, this one 6"):
        CrossBatchMemory(6).load_state_dict(memory.state_dict())


def test_memory_follows_the_device_of_the_rows_it_is_given():
    # A memory restored on the CPU must move to the embeddings' device; `meta` stands in for a GPU here.
    memory = CrossBatchMemory(4)
    memory.enqueue(torch.randn(2, 3), torch.tensor([0, 1]))
    memory.enqueue(torch.randn(2, 3, device="meta"), torch.tensor([2, 3], device="meta"))
    assert memory.embeddings.device.type == "meta" and memory.labels.device.type == "meta"
    other = CrossBatchMemory(4)
    other.enqueue(torch.randn(2, 3), torch.tensor([0, 1]))
    assert other.to(torch.device("meta")).embeddings.device.type == "meta"


def test_state_dict_round_trip_keeps_dtype_and_loads_onto_the_given_device():
    a = CrossBatchMemory(3)
    a.enqueue(torch.randn(2, 4, dtype=torch.bfloat16), torch.tensor([5, 6], dtype=torch.int32))
    b, c = CrossBatchMemory(3), CrossBatchMemory(3)
    b.load_state_dict(a.state_dict())
    c.load_state_dict(a.state_dict(), device=torch.device("meta"))
    assert b.embeddings.dtype == torch.bfloat16 and b.labels.dtype == torch.int32
    assert torch.equal(a.embeddings, b.embeddings) and torch.equal(a.labels, b.labels)
    assert c.embeddings.device.type == "meta" and c.embeddings.dtype == torch.bfloat16
