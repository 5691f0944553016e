"""``EmbeddingTable(storage_dir=...)`` given wrongly: a value that names no folder or is no path, a file, a
folder that cannot be written, a bad dtype; and what works however it is named: spaces, quotes and odd
characters, ``~`` (the home folder), a resume after the node file and its folder are gone, float16 and
bfloat16 rows, two runs given one folder (a file each; a file of the same name is refused, untouched).
Through the command line each refusal is one line (exit status 2) and leaves no run directory. The
folder-without-room case is tests/algorithms/test_embedding_table_node_file.py; the 2-rank cases are
tests/distributed/test_embedding_table_storage_two_ranks.py."""

from __future__ import annotations

import contextlib
import errno
import socket
import uuid

import pytest
import torch

from composer_dynsample.algorithms.embedding_table import EmbeddingTable, node_rows
from composer_dynsample.algorithms.embedding_table.node_rows import StorageDirError
from tests.data.text.helpers import read_only_folder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _written(table: EmbeddingTable) -> EmbeddingTable:
    """``table`` with rows 0, 2 and 4 of 5 written at step 3 (its rows allocated by that first write)."""
    table.write(torch.tensor([0, 2, 4]), torch.arange(12, dtype=torch.float32).view(3, 4) / 8, step=3)
    return table


@pytest.mark.parametrize("value", ["", "  ", "runs/a\0b"])
def test_a_value_that_names_no_folder_is_refused_when_the_table_is_made(value):
    with pytest.raises(ValueError, match=r"^storage_dir must name a folder, got .*; give a folder"):
        EmbeddingTable(storage_dir=value)


@pytest.mark.parametrize(
    ("value", "kind"), [(5, "int"), (["runs/a"], "list"), (b"runs/a", "bytes"), (True, "bool")]
)
def test_a_value_that_is_no_path_is_one_line(value, kind):
    with pytest.raises(ValueError) as refused:
        EmbeddingTable(storage_dir=value)
    assert str(refused.value) == (
        f"storage_dir must be a folder's path (a string), got {value!r} ({kind}); give one folder (e.g. "
        "storage_dir='/dev/shm'), or leave storage_dir out for rows in each rank's memory."
    )


def test_a_bad_dtype_with_a_storage_dir_is_one_line(tmp_path):
    with pytest.raises(ValueError) as refused:
        EmbeddingTable(storage_dir=str(tmp_path), dtype="float8")
    assert str(refused.value) == "dtype must be one of ('float32', 'float16', 'bfloat16'), got 'float8'."
    assert list(tmp_path.iterdir()) == []


def test_a_leading_tilde_is_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    table = _written(EmbeddingTable(5, storage_dir="~/node files"))
    assert table.rows.untyped_storage().filename.startswith(f"{tmp_path}/home/node files/embedding-table-")
    assert [path.name for path in tmp_path.iterdir()] == ["home"]  # no folder named '~'


def test_float16_rows_round_trip_within_float16_precision(tmp_path):
    embeddings = torch.randn(5, 16, generator=torch.Generator().manual_seed(0))
    table = EmbeddingTable(5, dtype="float16", storage_dir=str(tmp_path))
    table.write(torch.arange(5), embeddings, step=1)
    assert table.rows.dtype == torch.float16 and torch.equal(table.rows, embeddings.half())
    assert torch.allclose(table.rows.float(), embeddings, rtol=2**-11, atol=2**-24)
    assert not torch.equal(table.rows.float(), embeddings)  # float16 rows, not float32 ones


def test_two_runs_given_one_folder_each_map_a_file_of_their_own(tmp_path, monkeypatch):
    first, second = (
        _written(EmbeddingTable(5, storage_dir=str(tmp_path))),
        EmbeddingTable(5, storage_dir=str(tmp_path)),
    )
    second.write(torch.tensor([0]), torch.full((1, 4), 9.0), step=4)
    assert first.rows.untyped_storage().filename != second.rows.untyped_storage().filename
    assert first.rows[0].tolist() == [0.0, 0.125, 0.25, 0.375] and second.rows[0].tolist() == [9.0] * 4
    assert list(tmp_path.iterdir()) == []
    # A run whose file has the same name as another run's, still there: refused, the other file untouched.
    monkeypatch.setattr(node_rows.uuid, "uuid4", lambda: uuid.UUID(int=7))
    other = tmp_path / f"embedding-table-{uuid.UUID(int=7).hex}-{socket.gethostname()}-0.bin"
    other.write_bytes(b"another run's rows")
    with pytest.raises(StorageDirError) as refused:
        _written(EmbeddingTable(5, storage_dir=str(tmp_path)))
    assert str(refused.value) == (
        f"EmbeddingTable: storage_dir: '{other}' exists already, another run's node file of the same name; "
        "give this run a storage_dir of its own."
    )
    assert other.read_bytes() == b"another run's rows" and list(tmp_path.iterdir()) == [other]


@pytest.mark.parametrize("under", [False, True])
def test_a_file_is_named_as_a_file(tmp_path, under):
    blocker = tmp_path / "rows.bin"
    blocker.write_text("my data")
    storage = blocker / "sub" if under else blocker
    with pytest.raises(StorageDirError) as refused:
        _written(EmbeddingTable(5, storage_dir=str(storage)))
    assert str(refused.value) == (
        f"EmbeddingTable: storage_dir: '{blocker}' is a file, not a folder; give storage_dir a folder (it is "
        "created when missing)."
    )
    assert blocker.read_text() == "my data" and list(tmp_path.iterdir()) == [blocker]


@pytest.mark.parametrize("how", ["permission_denied", "read_only_folder"])
def test_a_folder_that_cannot_be_written_is_named_with_the_fix(tmp_path, monkeypatch, how):
    folder = tmp_path / "table"
    if how == "permission_denied":
        folder.mkdir()

        def refuse(file, *args, **kwargs):
            raise PermissionError(errno.EACCES, "Permission denied", str(file))

        monkeypatch.setattr(node_rows, "open", refuse, raising=False)
    context = read_only_folder(folder) if how == "read_only_folder" else contextlib.nullcontext()
    with context, pytest.raises(StorageDirError) as refused:
        _written(EmbeddingTable(5, storage_dir=str(folder)))
    assert str(refused.value) == (
        f"EmbeddingTable: storage_dir: '{folder}' cannot be written (Permission denied); give storage_dir a "
        "folder you can write in, with room for the table."
    )
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_odd_folder_names_hold_the_rows_and_a_resume_makes_the_file_again(tmp_path, dtype):
    folder = tmp_path / "node files é" / "#1 ?{rank}%s [x] 'q' \"dq\" $HOME"
    first = _written(EmbeddingTable(5, dtype=dtype, storage_dir=str(folder)))
    assert first.rows.untyped_storage().filename is not None and list(folder.iterdir()) == []
    expected = torch.zeros(5, 4, dtype=getattr(torch, dtype))
    expected[[0, 2, 4]] = (torch.arange(12, dtype=torch.float32).view(3, 4) / 8).to(expected.dtype)
    assert torch.equal(first.rows, expected) and first.written_at.tolist() == [3, -1, 3, -1, 3]
    state = first.state_dict()
    folder.rmdir()
    folder.parent.rmdir()  # the node file went when it was mapped; now its folder is gone too
    resumed = EmbeddingTable(5, dtype=dtype, storage_dir=str(folder))
    resumed.load_state_dict(state)
    assert resumed.rows.untyped_storage().filename is not None and list(folder.iterdir()) == []
    assert torch.equal(resumed.rows, expected) and torch.equal(resumed.written_at, first.written_at)
    resumed.write(torch.tensor([1]), torch.ones(1, 4), step=4)
    assert resumed.rows[1].tolist() == [1.0] * 4 and torch.equal(first.rows, expected)  # a file of its own


def test_a_resume_into_a_file_is_refused(tmp_path):
    state = _written(EmbeddingTable(5)).state_dict()
    blocker = tmp_path / "table"
    blocker.write_text("x")
    with pytest.raises(StorageDirError, match="is a file, not a folder"):
        EmbeddingTable(5, storage_dir=str(blocker)).load_state_dict(state)


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ("FILE", "EmbeddingTable: storage_dir: 'FILE' is a file, not a folder; give storage_dir a folder (it is "
         "created when missing)."),
        ("''", "rejected the config: storage_dir must name a folder, got ''; give a folder"),
        ("5", "error: algorithms.embedding_table.storage_dir must be a string or null, got 5 (an integer)."),
    ],
)  # fmt: skip
def test_through_the_command_line_a_bad_storage_dir_is_one_line(tmp_path, capsys, storage, message):
    pytest.importorskip("tokenizers")
    from tests.cli.helpers import one_line_error, write_bag_pairs_config, write_pairs

    write_pairs(tmp_path, train=16, test=8)
    (tmp_path / "rows.bin").write_text("x")
    storage, message = (text.replace("FILE", str(tmp_path / "rows.bin")) for text in (storage, message))
    sampler = {"name": "pk", "classes_per_batch": 4, "samples_per_class": 2}
    config = write_bag_pairs_config(tmp_path, sampler, algorithms={"embedding_table": {}})
    argv = ["train", config, f"algorithms.embedding_table.storage_dir={storage}", "trainer.max_duration=1ba"]
    error = one_line_error(capsys, [*argv, "--quiet", "--run-dir", str(tmp_path / "run")])
    assert message in error, error
    assert not (tmp_path / "run").exists() and (tmp_path / "rows.bin").read_text() == "x"
