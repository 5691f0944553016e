"""Bad text inputs through the command line: each is one error line (exit 2) and nothing is written.

Columns under other names (read with ``data.columns``), a lone surrogate, an open CSV quote, a named pipe
or a device as the data or as ``embed --input``, NaN labels, an ``embed --column`` the file lacks; and
``embed --input`` with only queries, or one column of a pairs file (``--column``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import (
    embed_input,
    latest_checkpoint,
    one_line_error,
    pairs_data,
    train_unevaluated,
    write_run_config,
)
from tests.data.text.helpers import pair_rows, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _config(folder: Path, **data: object) -> str:
    return write_run_config(
        folder / "pairs.yaml",
        data=pairs_data(folder, **data),
        model={"normalize": True, "encoder": {"name": "bag_of_tokens", "token_dim": 8}},
        sampler={"name": "pk", "classes_per_batch": 4, "samples_per_class": 2},
        ks=[1],
        max_duration="1ba",
    )


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], run_dir: Path | None = None) -> str:
    """Run the command line: it must exit with 2 and one line on stderr, leaving ``run_dir`` unmade."""
    error = one_line_error(capsys, argv)
    assert run_dir is None or not run_dir.exists()
    return error


def _renamed(rows: list[dict], names: dict[str, str]) -> list[dict]:
    return [{names.get(key, key): value for key, value in row.items()} for row in rows]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "train.jsonl", pair_rows(24, seed=0))
    write_jsonl(tmp_path / "test.jsonl", pair_rows(8, seed=1))
    return tmp_path


def _train(folder: Path, config: str, *overrides: str) -> list[str]:
    return ["train", config, *overrides, "--run-dir", str(folder / "run")]


def test_columns_under_other_names_are_named_with_the_mapping_that_reads_them(folder, capsys):
    write_jsonl(folder / "q.jsonl", _renamed(pair_rows(24), {"anchor": "query", "positive": "pos"}))
    config = _config(folder, path=str(folder / "q.jsonl"))
    error = _refused(capsys, _train(folder, config), folder / "run")
    assert "q.jsonl: missing column 'anchor'" in error and "found ['query', 'pos']" in error
    assert "columns={anchor: query, positive: pos}" in error and "holds no rows" not in error
    # the mapping reads the training file's columns; the test file keeps its own names
    main(_train(folder, config, "data.columns={anchor: query, positive: pos}"))
    metrics = json.loads((folder / "run" / "metrics.json").read_text())
    assert metrics["num_queries"] == 8


def test_a_misspelt_column_is_named_with_the_one_that_is_there(folder, capsys):
    write_jsonl(folder / "t.jsonl", _renamed(pair_rows(24), {"positive": "positve"}))
    error = _refused(capsys, _train(folder, _config(folder, path=str(folder / "t.jsonl"))), folder / "run")
    assert "found ['anchor', 'positve']" in error and "Did you mean 'positve'?" in error


def test_a_mapping_to_a_column_the_file_lacks_is_named(folder, capsys):
    config = _config(folder)
    error = _refused(capsys, _train(folder, config, "data.columns={anchor: qury}"), folder / "run")
    assert "train.jsonl: columns maps 'anchor' to 'qury', which this file does not have" in error
    error = _refused(capsys, _train(folder, config, "data.columns={anchr: anchor}"), folder / "run")
    assert "'anchr' is not a column this loader reads" in error and "Did you mean 'anchor'?" in error


def test_a_semicolon_delimited_csv_is_named_as_such(folder, capsys):
    lines = ["anchor;positive", *(f"{row['anchor']};{row['positive']}" for row in pair_rows(24))]
    (folder / "p.csv").write_text("\n".join(lines) + "\n")
    error = _refused(capsys, _train(folder, _config(folder, path=str(folder / "p.csv"))), folder / "run")
    assert "found ['anchor;positive']" in error and "looks delimited by ';'" in error


def test_a_lone_surrogate_names_its_line(folder, capsys):
    lines = (folder / "train.jsonl").read_text().splitlines()
    lines[6] = '{"anchor": "a \\ud800 b", "positive": "c"}'
    (folder / "s.jsonl").write_text("\n".join(lines) + "\n")
    error = _refused(capsys, _train(folder, _config(folder, path=str(folder / "s.jsonl"))), folder / "run")
    assert "s.jsonl: line 7, column 'anchor': the text holds a lone surrogate \\ud800 at character 3" in error


def test_an_open_csv_quote_names_the_line_it_opened_on(folder, capsys):
    rows = [f"{row['anchor']},{row['positive']}".replace('"', "") for row in pair_rows(24)]
    rows[10] = rows[10].replace(",", ',"', 1)  # record 11 (line 12) opens a quote that never closes
    (folder / "p.csv").write_text("anchor,positive\n" + "\n".join(rows) + "\n")
    error = _refused(capsys, _train(folder, _config(folder, path=str(folder / "p.csv"))), folder / "run")
    assert "p.csv: line 12: a quoted field opened in the record that starts on this line" in error


def test_nan_labels_name_their_line(tmp_path, capsys):
    rows = [{"text": f"text {i} of {i % 4}", "label": float("nan") if i == 5 else i % 4} for i in range(24)]
    (tmp_path / "t.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in rows)
    )  # NaN, as json writes it
    config = _config(tmp_path)
    data = (
        f"data={{name: texts, path: {tmp_path / 't.jsonl'}, cache_dir: {tmp_path / 'cache'}, max_length: 24}}"
    )
    error = _refused(capsys, ["train", config, data, "--run-dir", str(tmp_path / "run")], tmp_path / "run")
    assert "t.jsonl: line 6, column 'label': the label is NaN" in error


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_pipe_or_a_device_is_refused_before_it_is_opened(folder, capsys, kind):
    special = folder / "special.jsonl"
    if kind == "fifo":
        os.mkfifo(special)  # opening it would wait for a writer forever
    else:
        special.symlink_to("/dev/zero")  # endless bytes
    what = "a named pipe, FIFO" if kind == "fifo" else "a character device"
    error = _refused(capsys, _train(folder, _config(folder, path=str(special))), folder / "run")
    assert f"special.jsonl: not a regular file ({what})" in error
    error = _refused(capsys, _train(folder, _config(folder), f"data.test_path={special}"), folder / "run")
    assert f"special.jsonl: not a regular file ({what})" in error


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A bag-of-tokens run on pairs whose columns are read through data.columns, with a long text."""
    folder = tmp_path_factory.mktemp("cli_text_inputs")
    rows = pair_rows(24, seed=0)
    rows[0]["anchor"] = "long " * 100  # truncated at max_length: train reports it, embed does not again
    write_jsonl(folder / "train.jsonl", _renamed(rows, {"anchor": "query", "positive": "pos"}))
    write_jsonl(folder / "test.jsonl", pair_rows(8, seed=1))
    config = _config(folder, columns={"anchor": "query", "positive": "pos"})
    train_unevaluated(config, "2ba", folder / "run")
    return folder, config, latest_checkpoint(folder / "run")


def test_embed_input_reads_queries_alone_and_the_run_column_names(trained, tmp_path, recwarn):
    folder, config, checkpoint = trained
    rows = pair_rows(8, seed=1)
    write_jsonl(tmp_path / "pairs.jsonl", _renamed(rows, {"anchor": "query", "positive": "pos"}))
    embed_input(config, checkpoint, tmp_path / "pairs.jsonl", tmp_path / "pairs")
    write_jsonl(tmp_path / "queries.jsonl", [{"anchor": row["anchor"]} for row in rows])
    stores = sorted(path.name for path in (folder / "cache").glob("tokens-*"))
    embed_input(config, checkpoint, tmp_path / "queries.jsonl", tmp_path / "queries")
    pairs, queries = np.load(tmp_path / "pairs.npz"), np.load(tmp_path / "queries.npz")
    assert pairs["is_query"].tolist() == [True, False] * 8
    assert queries["is_query"].all() and queries["indices"].tolist() == list(range(8))
    np.testing.assert_allclose(queries["embeddings"], pairs["embeddings"][0::2], atol=1e-6)
    # the training data came back from the cache (one new store: the file's), their truncation not re-reported
    new = sorted(path.name for path in (folder / "cache").glob("tokens-*"))
    assert len(new) == len(stores) + 1 and set(stores) <= set(new)
    assert not [w for w in recwarn if "truncated" in str(w.message)]


@pytest.mark.parametrize("kind", ["columns", "fifo"])
def test_embed_input_names_what_it_cannot_read(trained, tmp_path, capsys, kind):
    _, config, checkpoint = trained
    source = tmp_path / "input.jsonl"
    if kind == "fifo":
        os.mkfifo(source)
    else:
        write_jsonl(source, [{"question": "how to sort"}])
    argv = ["embed", config, "--checkpoint", checkpoint, "--input", str(source), "--out", str(tmp_path / "e")]
    error = _refused(capsys, argv)
    assert not (tmp_path / "e.npz").exists()
    if kind == "fifo":
        assert "input.jsonl: not a regular file (a named pipe, FIFO)" in error
    else:
        assert "expected a column 'text' (passages), 'anchor' (queries)" in error
        assert "found ['question']" in error and "holds no rows" not in error


def _embed_column(config: str, checkpoint: str, source: Path, out: Path, column: str) -> list[str]:
    return ["embed", config, "--checkpoint", checkpoint, "--input", str(source), "--column", column,
            "--out", str(out)]  # fmt: skip


def test_embed_column_embeds_one_column_of_pairs_in_file_order(trained, tmp_path):
    _, config, checkpoint = trained
    pairs = write_jsonl(
        tmp_path / "pairs.jsonl", _renamed(pair_rows(8, seed=1), {"anchor": "query", "positive": "pos"})
    )
    embed_input(config, checkpoint, pairs, tmp_path / "both")
    both = np.load(tmp_path / "both.npz")  # without --column: anchor 0, positive 0, anchor 1, ...
    assert both["indices"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]
    assert both["is_query"].tolist() == [True, False] * 8
    # the run's name of a column, or the file's own name of a column data.columns maps
    for column, first, is_query in (("anchor", 0, True), ("pos", 1, False)):
        main(_embed_column(config, checkpoint, pairs, tmp_path / column, column))
        one = np.load(tmp_path / f"{column}.npz")
        assert one["embeddings"].shape == (8, both["embeddings"].shape[1])
        assert one["indices"].tolist() == list(range(8)) and one["is_query"].tolist() == [is_query] * 8
        np.testing.assert_allclose(one["embeddings"], both["embeddings"][first::2], atol=1e-6)


def test_embed_an_unknown_column_is_one_line_naming_the_columns(trained, tmp_path, capsys):
    _, config, checkpoint = trained
    pairs = write_jsonl(
        tmp_path / "pairs.jsonl", _renamed(pair_rows(8, seed=1), {"anchor": "query", "positive": "pos"})
    )
    error = _refused(capsys, _embed_column(config, checkpoint, pairs, tmp_path / "e", "anchr"))
    assert error == (
        f"composer-dynsample embed: error: --column 'anchr': {pairs} has no such column to embed; choose "
        "'anchor' (the file's 'query') or 'positive' (the file's 'pos') (e.g. --column anchor). "
        "Did you mean 'anchor'?"
    )
    without_input = [
        "embed",
        config,
        "--checkpoint",
        checkpoint,
        "--column",
        "anchor",
        "--out",
        str(tmp_path / "e"),
    ]
    error = _refused(capsys, without_input)
    assert "--column 'anchor' picks a column of an --input file; add --input FILE" in error
    assert not (tmp_path / "e.npz").exists()
