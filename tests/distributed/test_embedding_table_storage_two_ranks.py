"""``EmbeddingTable(storage_dir=...)`` on 2 real processes over gloo when the node file cannot be shared as
meant: a folder no rank can write, a rank that cannot map the file, ranks that name different folders
(``~`` under each rank's own ``HOME``), two nodes of one host name on one folder; and a resume after the
node file's folder is gone. Every refusal is the same one line on both ranks, which are in step after it;
a rank that waits for the other past a minute ends the process (no test hangs)."""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import shutil
from collections.abc import Iterator

import pytest
import torch
from composer.utils import dist

from composer_dynsample.algorithms.embedding_table import EmbeddingTable, node_rows
from composer_dynsample.algorithms.embedding_table.node_rows import StorageDirError
from composer_dynsample.distributed import gather_objects
from tests.distributed._helpers import shared_tmp_dir

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]


@contextlib.contextmanager
def _ends_a_hang(seconds: float = 60.0) -> Iterator[None]:
    """End the process (a failed run for the launcher) when the block has not finished in ``seconds``."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _write(table: EmbeddingTable, value: float = 1.0) -> EmbeddingTable:
    """``table`` with rows 0 and 3 of 4 set to ``value`` at step 1 (the first write allocates the rows)."""
    with _ends_a_hang():
        table.write(torch.tensor([0, 3]), torch.full((2, 2), value), step=1)
    return table


def _refusal(table: EmbeddingTable) -> str:
    """The one-line :class:`StorageDirError` that allocating ``table`` raises, the same on both ranks."""
    with pytest.raises(StorageDirError) as refused:
        _write(table)
    message = str(refused.value)
    assert "\n" not in message
    with _ends_a_hang():
        assert gather_objects(message) == [message, message]  # both ranks refused, and are in step again
    return message


def _files(folder) -> list:
    return sorted(path for path in folder.rglob("*") if path.is_file())


def test_a_folder_that_cannot_be_written_stops_both_ranks_with_one_line(monkeypatch):
    folder = shared_tmp_dir() / "table"

    def refuse(file, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(file))

    monkeypatch.setattr(node_rows, "open", refuse, raising=False)
    message = _refusal(EmbeddingTable(4, storage_dir=str(folder)))
    assert message == (
        f"EmbeddingTable: storage_dir: '{folder}' cannot be written (Permission denied); give storage_dir a "
        "folder you can write in, with room for the table."
    )
    assert _files(folder.parent) == []


def test_a_rank_that_cannot_map_the_file_stops_both_ranks_with_one_line(monkeypatch):
    folder = shared_tmp_dir() / "table"
    if dist.get_global_rank() == 1:

        def fail(path, *args, **kwargs):
            raise RuntimeError(f"unable to mmap 32 bytes from file <{path}>: Cannot allocate memory (12)")

        monkeypatch.setattr(node_rows.torch, "from_file", fail)
    message = _refusal(EmbeddingTable(4, storage_dir=str(folder)))
    assert message.startswith(
        f"EmbeddingTable: storage_dir: rank 1 cannot map the file in '{folder}' (unable"
    )
    assert message.endswith(
        "Cannot allocate memory (12)); give storage_dir a folder with room for the table."
    )
    assert _files(folder.parent) == []  # the file local rank 0 made is gone


def test_ranks_that_name_different_folders_are_refused_and_leave_no_file(monkeypatch):
    homes = shared_tmp_dir()
    monkeypatch.setenv("HOME", str(homes / f"rank{dist.get_global_rank()}"))
    message = _refusal(EmbeddingTable(4, storage_dir="~/table"))
    assert message.startswith("EmbeddingTable: storage_dir: rank 1 sees no file embedding-table-")
    assert message.endswith(
        f" in '{homes / 'rank1' / 'table'}', where local rank 0 made it; give storage_dir one folder the "
        "node's ranks share (an absolute path: '~' and a relative path follow each rank's HOME and working "
        "folder)."
    )
    assert _files(homes) == []


def test_two_nodes_of_one_host_name_on_one_folder_get_a_file_each(monkeypatch):
    folder = shared_tmp_dir() / "table"
    monkeypatch.setenv("LOCAL_RANK", "0")  # each rank the first of its own node, both of this host name
    table = _write(EmbeddingTable(4, storage_dir=str(folder)), value=float(dist.get_global_rank() + 1))
    with _ends_a_hang():
        names = gather_objects(table.rows.untyped_storage().filename)
        dist.barrier()
    assert None not in names and names[0] != names[1]
    assert table.rows[[0, 3]].tolist() == [[dist.get_global_rank() + 1.0] * 2] * 2  # not the other node's
    assert _files(folder) == []


def test_a_resume_on_both_ranks_after_the_folder_is_gone_restores_the_rows():
    folder = shared_tmp_dir() / "table"
    first = _write(EmbeddingTable(4, dtype="float16", storage_dir=str(folder)), value=0.3)
    state = first.state_dict()
    with _ends_a_hang():
        dist.barrier()
        if dist.get_global_rank() == 0:
            shutil.rmtree(folder.parent)
        dist.barrier()
        resumed = EmbeddingTable(4, dtype="float16", storage_dir=str(folder))
        resumed.load_state_dict(state)
        names = gather_objects(resumed.rows.untyped_storage().filename)
    assert names[0] == names[1] and names[0] is not None and names[0] != first.rows.untyped_storage().filename
    assert torch.equal(resumed.rows, first.rows) and torch.equal(resumed.written_at, first.written_at)
    assert resumed.rows[0].tolist() == [torch.tensor(0.3, dtype=torch.float16).item()] * 2
    assert _files(folder) == []
