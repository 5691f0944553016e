"""Matryoshka from the command line: a 2-step run with ``model.loss.matryoshka_dims`` reports every metric at
each narrower dimension (metrics.json, at the start too, and the printed table), ``eval`` takes
``evaluation.matryoshka_dims``, and ``export`` writes the dimensions into the model card."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import yaml

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import latest_checkpoint
from tests.cli.test_eval_start import RANKING, pairs_config
from tests.data.text.helpers import pair_rows, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _quietly(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(argv)
    return out.getvalue()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny BERT (8-dimensional embeddings) trained 2 steps with Matryoshka dimensions 8, 4 and 2."""
    folder = tmp_path_factory.mktemp("matryoshka")
    write_jsonl(folder / "train.jsonl", pair_rows(48, seed=0))
    write_jsonl(folder / "test.jsonl", pair_rows(12, seed=1))
    config = pairs_config(folder)
    config["model"]["loss"]["matryoshka_dims"] = [8, 4, 2]
    config["model"]["loss"]["matryoshka_weights"] = [1.0, 1.0, 0.5]
    config["evaluation"]["at_start"] = True
    path = folder / "pairs.yaml"
    path.write_text(yaml.safe_dump(config))
    table = _quietly(["train", str(path), "--run-dir", str(folder / "run")])
    return {
        "folder": folder,
        "config": str(path),
        "table": table,
        "metrics": json.loads((folder / "run" / "metrics.json").read_text()),
    }


def test_metrics_json_holds_every_metric_at_each_narrower_dimension(run):
    metrics = run["metrics"]
    assert set(RANKING) <= set(metrics)  # the full width, as without Matryoshka
    for result in (metrics, metrics["at_start"]):
        assert list(result["matryoshka"]) == ["4", "2"]
        for values in result["matryoshka"].values():
            assert set(values) == set(RANKING) and all(0.0 <= value <= 1.0 for value in values.values())


def test_the_table_shows_the_full_width_beside_each_dimension(run):
    lines = run["table"].splitlines()
    start = lines.index("Matryoshka: each metric on the first d dimensions (L2-normalised again)")
    assert lines[start + 1].split() == ["metric", "full", "4", "2"]
    row = next(line for line in lines[start:] if line.startswith("MRR@10"))
    matryoshka = run["metrics"]["matryoshka"]
    expected = [run["metrics"]["mrr_at_10"], matryoshka["4"]["mrr_at_10"], matryoshka["2"]["mrr_at_10"]]
    assert row.split()[-3:] == [f"{value:.4f}" for value in expected]


def test_eval_asks_for_other_dimensions_and_export_writes_them_in_the_model_card(run):
    checkpoint, folder = latest_checkpoint(run["folder"] / "run"), run["folder"]
    out = folder / "eval.json"
    _quietly(
        [
            "eval",
            run["config"],
            "--checkpoint",
            checkpoint,
            "evaluation.matryoshka_dims=[6,3]",
            "--out",
            str(out),
        ]
    )
    evaluated = json.loads(out.read_text())
    assert list(evaluated["matryoshka"]) == ["6", "3"] and set(evaluated["matryoshka"]["3"]) == set(RANKING)
    assert evaluated["mrr"] == pytest.approx(run["metrics"]["mrr"], abs=1e-6)
    exported = folder / "exported"
    _quietly(["export", run["config"], "--checkpoint", checkpoint, "--out", str(exported)])
    card = (exported / "README.md").read_text()
    assert "- Matryoshka dimensions: 8, 4, 2 (MatryoshkaLoss)" in card
    assert "truncate_dim=2" in card and "| metric | full | 4 | 2 |" in card
    # sentence-transformers' truncate_dim there would truncate every encode: the full width stays the default.
    assert "truncate_dim" not in json.loads((exported / "config_sentence_transformers.json").read_text())
