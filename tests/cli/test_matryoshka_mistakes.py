"""Matryoshka dimensions as a user who makes mistakes gives them: wider than the model, unsorted, repeated,
zero or negative are each one line before the first step (nothing left in the run directory), and valid
ones are reported, the same figures from ``train`` and from ``eval``."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import one_line_error, write_bag_pairs_config, write_pairs
from tests.cli.test_eval_start import RANKING

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PK = {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2}
# bag_of_tokens with token_dim 16 and no projection: 16-dimensional embeddings


@pytest.fixture
def config(tmp_path) -> str:
    write_pairs(tmp_path, test=16)
    return write_bag_pairs_config(tmp_path, PK)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.loss.matryoshka_dims=[32,8]", "model.loss.matryoshka_dims: 32 is wider than the 16 dimensions of the model's embeddings; use dimensions of at most 16, e.g. [16, 8]."),
        ("evaluation.matryoshka_dims=[16,8,17]", "evaluation.matryoshka_dims must be strictly descending (the full width first), got [16, 8, 17]."),
        ("evaluation.matryoshka_dims=[24,8]", "evaluation.matryoshka_dims: 24 is wider than the 16 dimensions of the model's embeddings; use dimensions of at most 16, e.g. [16, 8]."),
        ("model.loss.matryoshka_dims=[4,8]", "model.loss.matryoshka_dims must be strictly descending (the full width first), got [4, 8]."),
        ("model.loss.matryoshka_dims=[16,8,8]", "model.loss.matryoshka_dims must be strictly descending (the full width first), got [16, 8, 8]."),
        ("model.loss.matryoshka_dims=[16,0]", "model.loss.matryoshka_dims must hold integers >= 1, got [16, 0]."),
        ("model.loss.matryoshka_dims=[16,-4]", "model.loss.matryoshka_dims must hold integers >= 1, got [16, -4]."),
        ("model.loss.matryoshka_dims=[]", "model.loss.matryoshka_dims must be a non-empty list of dimensions such as [384, 256, 128, 64], got []."),
        ("model.loss.matryoshka_dims=16", "model.loss.matryoshka_dims must be a non-empty list of dimensions such as [384, 256, 128, 64], got 16."),
        ("model.loss.matryoshka_weights=[1,2]", "model.loss.matryoshka_weights needs model.loss.matryoshka_dims, e.g. [384, 256, 128, 64]."),
    ],
)  # fmt: skip
def test_a_wrong_dimension_is_one_line_before_the_first_step(config, tmp_path, capsys, override, expected):
    """Before, a loss dimension wider than the model was a traceback at the first step, and an evaluation
    one a refusal after the whole training (its checkpoints kept, no metrics)."""
    run_dir = tmp_path / "run"
    error = one_line_error(capsys, ["train", config, override, "--quiet", "--run-dir", str(run_dir)])
    assert error == f"composer-dynsample train: error: {expected}"
    assert not run_dir.exists()


def test_valid_dimensions_are_reported_at_each_narrower_width_by_train_and_eval(config, tmp_path, capsys):
    run_dir = tmp_path / "run"
    dims = "model.loss.matryoshka_dims=[16,8,4]"
    main(["train", config, dims, "trainer.max_duration=4ba", "--quiet", "--run-dir", str(run_dir)])
    trained = json.loads((run_dir / "metrics.json").read_text())
    assert list(trained["matryoshka"]) == ["8", "4"]  # the full width is the result itself
    assert all(set(values) == set(RANKING) for values in trained["matryoshka"].values())
    main(["eval", "--run", str(run_dir), "evaluation.matryoshka_dims=[8,2]"])
    evaluated = json.loads((run_dir / "eval.json").read_text())
    assert list(evaluated["matryoshka"]) == ["8", "2"]
    assert evaluated["matryoshka"]["8"] == trained["matryoshka"]["8"]
    assert {key: evaluated[key] for key in RANKING} == {key: trained[key] for key in RANKING}
    # the narrow widths are scored on their own: 2 of 16 dimensions do not rank as all of them do
    assert evaluated["matryoshka"]["2"] != {key: evaluated[key] for key in RANKING}
