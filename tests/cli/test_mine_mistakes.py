"""``composer-dynsample mine`` used wrongly: an existing or data file as ``--out``, a full disk, a checkpoint of
another model, more negatives than the corpus holds, a config that does not mine, data changed since the run
or while mining; and what works however it is asked: prompts, mapped columns, given negatives, a split
file, CSV fields over several lines, odd output names. Each refusal is one line (exit status 2) and leaves
the file system as it was."""

from __future__ import annotations

import csv
import errno
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import MINED, latest_checkpoint, one_line_error, trained_pairs_run
from tests.data.text.helpers import pair_rows, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ERROR = "composer-dynsample mine: error: "
SAMPLER = {**MINED, "pairs_per_batch": 4, "negatives_per_anchor": 2, "window": 4}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A bag-of-tokens pairs run of 2 batches on 32 pairs and its triplets: ``(folder, config, run, triplets)``."""
    folder, config, run_dir = trained_pairs_run(tmp_path_factory.mktemp("mine_mistakes"), SAMPLER)
    main(["mine", "--run", str(run_dir), "--out", str(folder / "reference.jsonl")])
    return folder, config, run_dir, (folder / "reference.jsonl").read_bytes()


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def assert_mined_from(lines: list[dict], rows: list[dict]) -> None:
    """Every line is a pair of ``rows`` with the positive of another pair as its negative, as the file has them."""
    pairs = {row["anchor"]: row["positive"] for row in rows}
    assert lines and all(list(line) == ["anchor", "positive", "negative"] for line in lines)
    for line in lines:
        assert pairs[line["anchor"]] == line["positive"], line
        assert line["negative"] in pairs.values() and line["negative"] != line["positive"], line


def test_an_existing_out_is_replaced_only_with_overwrite(trained, tmp_path, capsys):
    _, _, run_dir, reference = trained
    out = tmp_path / "triplets.jsonl"
    out.write_text("my notes\n")
    error = one_line_error(capsys, ["mine", "--run", str(run_dir), "--out", str(out)])
    assert error == f"{ERROR}--out '{out}' exists; pass --overwrite to replace it, or choose a new file."
    assert out.read_text() == "my notes\n"
    main(["mine", "--run", str(run_dir), "--out", str(out), "--overwrite"])
    assert out.read_bytes() == reference


def test_the_run_s_data_file_is_never_the_out(trained, capsys):
    folder, _, run_dir, _ = trained
    data = folder / "train.jsonl"
    before = data.read_bytes()
    error = one_line_error(capsys, ["mine", "--run", str(run_dir), "--out", str(data), "--overwrite"])
    assert error == (
        f"{ERROR}--out '{data}' is the run's data file '{data}'; writing the triplets there would replace the "
        "pairs they are read from: choose another file."
    )
    assert data.read_bytes() == before


def test_a_full_disk_leaves_the_previous_file_and_nothing_beside_it(trained, tmp_path, capsys, monkeypatch):
    _, _, run_dir, _ = trained
    out = tmp_path / "triplets.jsonl"
    out.write_text("the previous triplets\n")
    dumps, calls = json.dumps, []

    def fill_up(row, **options):
        calls.append(row)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return dumps(row, **options)

    monkeypatch.setattr(json, "dumps", fill_up)
    error = one_line_error(capsys, ["mine", "--run", str(run_dir), "--out", str(out), "--overwrite"])
    assert error == (
        f"{ERROR}--out '{out}': could not be written (No space left on device); nothing was written: free "
        "space there or choose another folder."
    )
    assert out.read_text() == "the previous triplets\n" and [p.name for p in tmp_path.iterdir()] == [out.name]


def test_odd_out_names_are_written_as_any_other(trained, tmp_path, monkeypatch):
    _, _, run_dir, reference = trained
    monkeypatch.chdir(tmp_path)
    main(["mine", "--run", str(run_dir), "--out=-mined triplets ü.jsonl"])  # a leading dash: --out=VALUE
    main(["mine", "--run", str(run_dir), "--out", "new folder é/#1 {rank}.jsonl"])
    assert (tmp_path / "-mined triplets ü.jsonl").read_bytes() == reference
    assert (tmp_path / "new folder é" / "#1 {rank}.jsonl").read_bytes() == reference


def test_a_checkpoint_of_another_model_is_one_line(trained, tmp_path, capsys):
    _, config, run_dir, _ = trained
    checkpoint = latest_checkpoint(run_dir)
    argv = [
        "mine",
        config,
        "model.encoder.token_dim=8",
        "--checkpoint",
        checkpoint,
        "--out",
        str(tmp_path / "t"),
    ]
    error = one_line_error(capsys, argv)
    assert error.startswith(f"{ERROR}checkpoint '{checkpoint}' does not match the config's model"), error
    assert "size mismatch for encoder.embedding.weight" in error and not list(tmp_path.iterdir())


def test_more_negatives_than_the_corpus_holds_is_one_line(trained, tmp_path, capsys):
    _, _, run_dir, _ = trained
    argv = [
        "mine",
        "--run",
        str(run_dir),
        "sampler.window=100",
        "--negatives",
        "100",
        "--out",
        str(tmp_path / "t"),
    ]
    error = one_line_error(capsys, argv)
    assert "window=100 needs at least 116 passages of distinct texts, and the pairs hold 32" in error, error
    assert error.endswith("use fewer pairs per batch, fewer negatives per anchor or a smaller window.")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.name=texts", "this config's data are 'texts'; use a pairs config."),
        ("sampler={name: neighbours, seeds_per_batch: 4, negatives_per_seed: 1}", "this config's sampler is "
         "'neighbours'; use a mined_negatives config"),
        ("algorithms.embedding_table=null", "the algorithms section has no embedding_table, so every negative "
         "would be a random passage"),
    ],
)  # fmt: skip
def test_a_config_that_does_not_mine_pairs_is_one_line(trained, tmp_path, capsys, override, message):
    _, config, _, _ = trained
    error = one_line_error(capsys, ["mine", config, override, "--out", str(tmp_path / "t.jsonl")])
    assert message in error, error
    assert not list(tmp_path.iterdir())


def test_prompted_texts_are_mined_and_written_as_the_file_has_them(trained, tmp_path):
    folder, config, run_dir, _ = trained
    prompts = "data.prompts={anchor: 'query: ', positive: 'passage: '}"
    out = tmp_path / "t.jsonl"
    main(["mine", config, prompts, "--checkpoint", latest_checkpoint(run_dir), "--out", str(out)])
    lines = read_lines(out)
    assert_mined_from(lines, read_lines(folder / "train.jsonl"))
    assert not any(text.startswith(("query: ", "passage: ")) for line in lines for text in line.values())


def _csv_over_lines(path: Path, rows: list[dict]) -> list[dict]:
    """``rows`` as a CSV whose positives hold newlines, quotes and commas; the rows as the file has them."""
    rows = [{**row, "positive": row["positive"].replace(": ", ':\n    "x", ')} for row in rows]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, ["anchor", "positive"])
        writer.writeheader()
        writer.writerows(rows)
    return rows


@pytest.mark.parametrize("kind", ["columns", "given_negatives", "split", "csv_fields_over_lines"])
def test_the_file_s_own_texts_come_back_however_the_pairs_are_read(trained, tmp_path, capsys, kind):
    _, config, _, _ = trained
    rows = pair_rows(32, seed=3, negatives=kind == "given_negatives")
    source, overrides, anchors = tmp_path / "pairs.jsonl", [], 32
    if kind == "columns":
        write_jsonl(
            source, [{"query": r["anchor"], "pos": r["positive"], "id": i} for i, r in enumerate(rows)]
        )
        overrides = ["data.columns={anchor: query, positive: pos}"]
    elif kind == "csv_fields_over_lines":
        source = tmp_path / "pairs.csv"
        rows = _csv_over_lines(source, rows)
    else:
        write_jsonl(source, rows)
    if kind == "split":
        overrides, anchors = ["data.test_path=null", "data.test_fraction=0.25"], 24
    out = tmp_path / "t.jsonl"
    main(["mine", config, f"data.path={source}", *overrides, "--out", str(out)])  # the model as built
    assert f"searching the nearest passages of {anchors} anchors" in capsys.readouterr().out
    lines = read_lines(out)
    assert_mined_from(lines, rows)
    assert len({line["anchor"] for line in lines}) <= anchors
    if kind == "given_negatives":  # mined among the positives, never the given negatives
        assert not {line["negative"] for line in lines} & {row["negative"] for row in rows}


def test_data_changed_since_the_run_are_mined_as_they_are_now(trained, tmp_path, capsys):
    folder, _, run_dir, _ = trained
    data = folder / "train.jsonl"
    before = data.read_bytes()
    rows = pair_rows(20, seed=7)
    try:
        write_jsonl(data, rows)
        main(["mine", "--run", str(run_dir), "--out", str(tmp_path / "t.jsonl")])
    finally:
        data.write_bytes(before)
    assert (
        "mine: reading the texts of the 20 training pairs back from the data file" in capsys.readouterr().out
    )
    assert_mined_from(read_lines(tmp_path / "t.jsonl"), rows)


def test_data_changed_while_mining_is_one_line(trained, tmp_path, capsys, monkeypatch):
    folder, _, run_dir, _ = trained
    data = folder / "train.jsonl"
    before = data.read_bytes()
    from composer_dynsample.cli import mine

    build = mine._build_model_run

    def build_then_edit(*args, **kwargs):
        run = build(*args, **kwargs)
        shutil.copy(folder / "test.jsonl", data)  # another file where the loaded one was
        return run

    monkeypatch.setattr(mine, "_build_model_run", build_then_edit)
    try:
        error = one_line_error(capsys, ["mine", "--run", str(run_dir), "--out", str(tmp_path / "t.jsonl")])
    finally:
        data.write_bytes(before)
    assert error == f"{ERROR}{data} changed since it was loaded; run mine again."
    assert not list(tmp_path.iterdir())
