"""``composer-dynsample embed --input`` used wrongly: an existing ``--out``, a full disk, empty files, a
``--column`` the file lacks, a ``--prompt-name`` of a model without a folder; and what works however it is
asked: CSV fields over several lines, odd file names. Each refusal is one line (exit status 2) and leaves the
file system as it was."""

from __future__ import annotations

import csv
import errno
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import (
    embed_input,
    latest_checkpoint,
    one_line_error,
    trained_pairs_run,
)
from tests.data.text.helpers import write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ERROR = "composer-dynsample embed: error: "
PK = {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2}
#: Passages with what CSV quotes: newlines, a blank line, quotes, commas; and a plain one.
TEXTS = ["def f(x):\n    return x", "plain text", 'say "hi", then\n\nstop, twice', "last one"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A bag-of-tokens pairs run of 2 batches, and TEXTS embedded from JSON Lines: ``(config, checkpoint, rows)``."""
    folder, config, run_dir = trained_pairs_run(tmp_path_factory.mktemp("embed_mistakes"), PK)
    checkpoint = latest_checkpoint(run_dir)
    write_jsonl(folder / "texts.jsonl", [{"text": text} for text in TEXTS])
    embed_input(config, checkpoint, folder / "texts.jsonl", folder / "reference.npz")
    return config, checkpoint, np.load(folder / "reference.npz")["embeddings"]


def _argv(trained, source: Path, out: Path, *options: str) -> list[str]:
    config, checkpoint, _ = trained
    return ["embed", config, "--checkpoint", checkpoint, "--input", str(source), *options, "--out", str(out)]


def _texts_file(path: Path) -> Path:
    write_jsonl(path, [{"text": text} for text in TEXTS])
    return path


def test_csv_fields_over_several_lines_are_one_row_each(trained, tmp_path):
    source = tmp_path / "texts.csv"
    with open(source, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text"])
        writer.writerows([text] for text in TEXTS)
    main(_argv(trained, source, tmp_path / "e"))
    arrays = np.load(tmp_path / "e.npz")
    assert arrays["indices"].tolist() == [0, 1, 2, 3] and arrays["is_query"].tolist() == [False] * 4
    np.testing.assert_allclose(arrays["embeddings"], trained[2], atol=1e-6)  # as the JSON Lines rows


@pytest.mark.parametrize("suffix", [".npz", ""])
def test_an_existing_out_is_replaced_only_with_overwrite(trained, tmp_path, capsys, suffix):
    out = tmp_path / "e.npz"
    out.write_bytes(b"my notes")
    source = _texts_file(tmp_path / "texts.jsonl")
    error = one_line_error(capsys, _argv(trained, source, tmp_path / f"e{suffix}"))
    assert error == f"{ERROR}--out '{out}' exists; pass --overwrite to replace it, or choose a new file."
    assert out.read_bytes() == b"my notes"
    main(_argv(trained, source, tmp_path / f"e{suffix}", "--overwrite"))
    np.testing.assert_allclose(np.load(out)["embeddings"], trained[2], atol=1e-6)


def test_a_full_disk_leaves_the_previous_file_and_nothing_beside_it(trained, tmp_path, capsys, monkeypatch):
    out = tmp_path / "e.npz"
    out.write_bytes(b"the previous embeddings")
    (tmp_path / "in").mkdir()
    source = _texts_file(tmp_path / "in" / "texts.jsonl")

    def fill_up(file, **arrays):
        file.write(b"PK\x03\x04 half an archive")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", fill_up)
    error = one_line_error(capsys, _argv(trained, source, out, "--overwrite"))
    assert error == (
        f"{ERROR}--out '{out}': could not be written (No space left on device); nothing was written: free "
        "space there or choose another folder."
    )
    assert out.read_bytes() == b"the previous embeddings"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["e.npz", "in"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.jsonl", "", "holds no rows."),
        ("blank.jsonl", "\n\n", "holds no rows."),
        ("empty.csv", "", "empty file; expected a header line naming the columns."),
        ("header.csv", "text\n", "holds no rows."),
    ],
)
def test_an_empty_file_is_one_line(trained, tmp_path, capsys, name, content, message):
    (tmp_path / name).write_text(content)
    error = one_line_error(capsys, _argv(trained, tmp_path / name, tmp_path / "e"))
    assert error == f"{ERROR}{tmp_path / name}: {message}"
    assert sorted(path.name for path in tmp_path.iterdir()) == [name]


@pytest.mark.parametrize(
    ("rows", "column", "message"),
    [
        ([{"text": "a"}], "anchor", "--column 'anchor': SOURCE has no such column to embed; choose 'text' "
         "(e.g. --column text)."),
        ([{"anchor": "a", "positive": "b"}], "negative", "--column 'negative': SOURCE has no such column to "
         "embed; choose 'anchor' or 'positive' (e.g. --column anchor)."),
        ([{"question": "a"}], "question", "SOURCE: expected a column 'text' (passages), 'anchor' (queries), or "
         "'anchor' and 'positive' (pairs), found ['question']; rename one, or map it with the config's "
         "data.columns (e.g. data.columns={anchor: query})."),
    ],
)  # fmt: skip
def test_a_column_the_file_lacks_is_one_line(trained, tmp_path, capsys, rows, column, message):
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    error = one_line_error(capsys, _argv(trained, source, tmp_path / "e", "--column", column))
    assert error == ERROR + message.replace("SOURCE", str(source))
    assert not (tmp_path / "e.npz").exists()


def test_a_prompt_name_without_a_model_folder_is_one_line(trained, tmp_path, capsys):
    source = _texts_file(tmp_path / "texts.jsonl")
    error = one_line_error(capsys, _argv(trained, source, tmp_path / "e", "--prompt-name", "query"))
    assert error == (
        f"{ERROR}--prompt-name names prompts of the model folder (model.encoder.path), but the model has none; "
        "give the prompts themselves (data.prompts, or embed's --prompt)."
    )
    assert not (tmp_path / "e.npz").exists()


def test_odd_file_names_are_read_and_written_as_any_other(trained, tmp_path, monkeypatch):
    config, checkpoint, reference = trained
    (tmp_path / "my texts ü").mkdir()
    _texts_file(tmp_path / "my texts ü" / "-the texts #1.jsonl")
    monkeypatch.chdir(tmp_path / "my texts ü")
    common = ["embed", config, "--checkpoint", checkpoint]
    main([*common, "--input=-the texts #1.jsonl", "--out=-embedded ✓"])  # a leading dash: --option=VALUE
    main([*common, "--input", "./-the texts #1.jsonl", "--out", "new folder é/{rank} e.npz"])
    for out in ("-embedded ✓.npz", "new folder é/{rank} e.npz"):
        np.testing.assert_allclose(np.load(tmp_path / "my texts ü" / out)["embeddings"], reference, atol=1e-6)
