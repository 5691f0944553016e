"""``EmbeddingTable(storage_dir=...)``: the rows in a memory-mapped file shared by the node's ranks train and
resume exactly as the rows in memory do, the file is gone once mapped, and a folder without room is one line.
The 2-rank case (one copy, seen by both ranks) is tests/distributed/test_embedding_table_two_ranks.py."""

from __future__ import annotations

import pytest
import torch

from composer_dynsample.algorithms.embedding_table import EmbeddingTable
from composer_dynsample.algorithms.embedding_table.node_rows import node_shared_rows
from tests.algorithms.test_embedding_table import make_trainer


def _table(trainer) -> EmbeddingTable:
    (table,) = [a for a in trainer.state.algorithms if isinstance(a, EmbeddingTable)]
    return table


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_node_file_table_trains_and_resumes_as_the_table_in_memory(tmp_path, dtype):
    in_memory, *_ = make_trainer(
        tmp_path / "a", algorithms=[EmbeddingTable(dtype=dtype)], lr=0.1, duration="3ep"
    )
    in_memory.fit()
    folder = tmp_path / "node"
    first, *_ = make_trainer(
        tmp_path / "b",
        algorithms=[EmbeddingTable(dtype=dtype, storage_dir=str(folder))],
        lr=0.1,
        duration="2ep",
    )
    first.fit()
    mapped = _table(first).rows
    assert mapped.untyped_storage().filename is not None  # a file's pages, not the heap
    assert list(folder.iterdir()) == []  # unlinked once mapped: nothing left behind, even after a crash
    resumed_table = EmbeddingTable(dtype=dtype, storage_dir=str(folder))
    resumed, *_ = make_trainer(
        tmp_path / "c", algorithms=[resumed_table], lr=0.1, duration="3ep",
        load_path=str(tmp_path / "b" / "checkpoints" / "latest-rank0.pt"),
    )  # fmt: skip
    assert resumed_table.rows.untyped_storage().filename is not None  # the checkpoint's rows, in a node file
    resumed.fit()
    assert torch.equal(resumed_table.rows, _table(in_memory).rows)
    assert resumed_table.fingerprint() == _table(in_memory).fingerprint()


def test_the_node_file_is_zeroed_and_writable(tmp_path):
    rows = node_shared_rows((5, 3), torch.bfloat16, tmp_path)
    assert rows.shape == (5, 3) and rows.dtype == torch.bfloat16 and bool((rows == 0).all())
    rows[2] = 1.5
    assert rows[2].tolist() == [1.5, 1.5, 1.5]


def test_a_storage_dir_that_cannot_hold_the_table_is_one_line(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(
        ValueError, match=r"^EmbeddingTable: storage_dir: .*a_file.*give storage_dir a folder"
    ):
        node_shared_rows((4, 2), torch.float32, blocker / "sub")
    with pytest.raises(ValueError, match=r"the table needs 16384\.0 GiB"):
        node_shared_rows((2**34, 2**9), torch.float16, tmp_path)
    with pytest.raises(ValueError, match="storage_dir must be a folder for a table on the cpu"):
        EmbeddingTable(storage_dir=str(tmp_path), device="cuda")
