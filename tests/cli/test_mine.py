"""``composer-dynsample mine``: the hard negatives of a pairs config's mined_negatives sampler as JSON Lines,
checked against a brute-force search over ``embed``'s embeddings and read back by the pairs loader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import (
    MINED,
    latest_checkpoint,
    one_line_error,
    trained_pairs_run,
    write_bag_pairs_config,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# 2 negatives per anchor taken from a window of 4; the margin guard at its default (0.95 x the positive's).
SAMPLER = {**MINED, "pairs_per_batch": 4, "negatives_per_anchor": 2, "window": 4}
MINED_OVERRIDES = [
    "sampler={name: mined_negatives, pairs_per_batch: 8, negatives_per_anchor: 1}",
    "algorithms.embedding_table={}",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A bag-of-tokens pairs run of 2 batches on 32 pairs: ``(folder, config, run directory)``."""
    return trained_pairs_run(tmp_path_factory.mktemp("mine"), SAMPLER)


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def brute_force(folder: Path, run_dir: Path, tmp_path: Path, window: int, count: int) -> dict[str, list[str]]:
    """Each anchor's first ``count`` negatives by hand: the training split's embeddings as ``embed`` writes
    them (``embed_store``), every passage of another pair ranked by cosine similarity, the ``window``
    nearest kept unless more similar than 0.95 x the positive or of the anchor's or positive's text."""
    main(["embed", "--run", str(run_dir), "--split", "train", "--out", str(tmp_path / "train.npz")])
    arrays = np.load(tmp_path / "train.npz")
    rows = read_lines(folder / "train.jsonl")
    texts = [
        rows[r]["anchor" if q else "positive"] for r, q in zip(arrays["source_rows"], arrays["is_query"])
    ]
    unit = arrays["embeddings"].astype(np.float64)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    anchors = np.flatnonzero(arrays["is_query"])
    expected = {}
    for anchor in anchors.tolist():
        positive = anchor + 1  # rows 2k and 2k + 1 are pair k
        passages = [row for row in np.flatnonzero(~arrays["is_query"]).tolist() if row != positive]
        similarity = {row: float(unit[anchor] @ unit[row]) for row in passages}
        ranked = sorted(passages, key=lambda row: (-similarity[row], row))[:window]
        limit = 0.95 * float(unit[anchor] @ unit[positive])
        kept = [
            texts[row]
            for row in ranked
            if similarity[row] <= limit and texts[row] not in (texts[anchor], texts[positive])
        ]
        expected[texts[anchor]] = kept[:count]
    return expected


def test_mine_writes_the_sampler_s_nearest_passages_as_triplets(trained, tmp_path, capsys):
    folder, _, run_dir = trained
    out = tmp_path / "triplets.jsonl"
    main(["mine", "--run", str(run_dir), "--out", str(out)])
    printed = capsys.readouterr().out
    assert "mine: reading the texts of the 32 training pairs back from the data file" in printed, printed
    assert "mine: encoding the 64 training texts of 'train' with latest-rank0.pt" in printed, printed
    assert (
        "mine: searching the nearest passages of 32 anchors (search=exact, skip_top=0, window=4)" in printed
    )
    lines = read_lines(out)
    assert f"wrote {len(lines)} triplets (" in printed and f"to {out}" in printed, printed
    assert all(list(line) == ["anchor", "positive", "negative"] for line in lines)
    pairs = {row["anchor"]: row["positive"] for row in read_lines(folder / "train.jsonl")}
    for line in lines:
        assert pairs[line["anchor"]] == line["positive"]
        assert line["negative"] in pairs.values() and line["negative"] != line["positive"]
    found: dict[str, list[str]] = {}
    for line in lines:
        found.setdefault(line["anchor"], []).append(line["negative"])
    expected = brute_force(folder, run_dir, tmp_path, window=4, count=2)
    assert {anchor: negatives for anchor, negatives in expected.items() if negatives} == found
    assert len(lines) == sum(map(len, expected.values())) > 32  # most anchors keep 2
    assert [line["anchor"] for line in lines] == sorted(
        (line["anchor"] for line in lines), key=list(pairs).index
    )  # the training file's order, nearest first within an anchor


def test_mined_triplets_load_with_datasets_and_the_pairs_loader(trained, tmp_path):
    _, _, run_dir = trained
    out = tmp_path / "triplets.jsonl"
    main(["mine", "--run", str(run_dir), "--out", str(out), "--negatives", "1"])
    lines = read_lines(out)
    assert len({line["anchor"] for line in lines}) == len(lines)  # one negative per anchor
    from composer_dynsample.data.text.pairs import load_pairs

    splits = load_pairs(out, test_path=out, vocab_size=64, cache_dir=tmp_path / "cache")
    assert len(splits.train) == 2 * len(lines) and splits.info.num_negatives[0] == len(lines)
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset("json", data_files=str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert loaded.column_names == ["anchor", "positive", "negative"] and loaded.num_rows == len(lines)
    assert loaded[0] == lines[0]


def test_mine_with_config_and_checkpoint_writes_what_run_writes(trained, tmp_path):
    _, config, run_dir = trained
    main(["mine", "--run", str(run_dir), "--out", str(tmp_path / "run.jsonl")])
    argv = ["mine", config, "--checkpoint", latest_checkpoint(run_dir), "--out", str(tmp_path / "c.jsonl")]
    main(argv)
    assert (tmp_path / "run.jsonl").read_bytes() == (tmp_path / "c.jsonl").read_bytes()


def test_mine_without_a_checkpoint_mines_with_the_model_as_built(trained, tmp_path, capsys):
    _, config, _ = trained
    main(["mine", config, "--out", str(tmp_path / "start.jsonl"), "--negatives", "3"])
    assert "with the model as built" in capsys.readouterr().out
    lines = read_lines(tmp_path / "start.jsonl")
    counts = np.unique([line["anchor"] for line in lines], return_counts=True)[1]
    assert lines and counts.max() == 3


def test_the_overrides_the_sampler_refusal_names_mine_a_pk_config(trained, tmp_path, capsys):
    folder, _, _ = trained
    config = write_bag_pairs_config(folder, {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2})
    error = one_line_error(capsys, ["mine", config, "--out", str(tmp_path / "t.jsonl")])
    assert error == (
        "composer-dynsample mine: error: mine writes what a mined_negatives sampler mines, and this config's "
        "sampler is 'pk'; use a mined_negatives config, or add the overrides 'sampler={name: mined_negatives, "
        "pairs_per_batch: 8, negatives_per_anchor: 1}' 'algorithms.embedding_table={}'."
    )
    main(["mine", config, *MINED_OVERRIDES, "--out", str(tmp_path / "t.jsonl")])
    assert read_lines(tmp_path / "t.jsonl")


def test_data_that_are_not_pairs_are_one_line(tmp_path, capsys):
    digits = str(Path(__file__).resolve().parents[2] / "yamls" / "digits_quick.yaml")
    error = one_line_error(capsys, ["mine", digits, *MINED_OVERRIDES, "--out", str(tmp_path / "t.jsonl")])
    assert error == (
        "composer-dynsample mine: error: mine mines negatives among text pairs (data.name: pairs or "
        "code_search), and this config's data are 'digits'; use a pairs config."
    )


@pytest.mark.parametrize(
    ("negatives", "message"),
    [
        ("5", "--negatives 5 is more than the sampler's window of 4 candidates per anchor; add the override "
              "sampler.window=5, or pass --negatives 4 or fewer."),
        ("0", "--negatives must be at least 1, got 0."),
    ],
)  # fmt: skip
def test_a_number_of_negatives_the_window_cannot_give_is_one_line(
    trained, tmp_path, capsys, negatives, message
):
    _, _, run_dir = trained
    argv = ["mine", "--run", str(run_dir), "--out", str(tmp_path / "t.jsonl"), "--negatives", negatives]
    assert one_line_error(capsys, argv) == f"composer-dynsample mine: error: {message}"
    assert not (tmp_path / "t.jsonl").exists()
