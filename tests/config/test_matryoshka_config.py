"""``model.loss.matryoshka_dims`` / ``matryoshka_weights`` wrap the configured loss; ``evaluation.matryoshka_dims``
asks for the metrics at each dimension; bad values are one line naming the key, before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from composer_dynsample import InfoNCELoss, MatryoshkaLoss, TripletMarginLoss
from composer_dynsample.config import ConfigError, build_run, load_config
from composer_dynsample.config.checks import check_config
from composer_dynsample.config.matryoshka import evaluation_dims
from composer_dynsample.config.model_builders import build_loss

DIGITS = Path(__file__).resolve().parents[2] / "yamls" / "digits_quick.yaml"
FINETUNE = Path(__file__).resolve().parents[2] / "yamls" / "finetune_code_search.yaml"

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_the_keys_wrap_the_configured_loss():
    cfg = load_config(FINETUNE, ["model.loss.matryoshka_dims=[384,256,128,64]"])
    check_config(cfg)
    loss = build_loss(cfg)
    assert isinstance(loss, MatryoshkaLoss) and isinstance(loss.loss, InfoNCELoss)
    assert loss.matryoshka_dims == (384, 256, 128, 64) and loss.matryoshka_weights == (1.0,) * 4
    assert (loss.loss.temperature, loss.negatives, loss.loss.symmetric) == (0.05, "passages", True)
    assert evaluation_dims(cfg) == (384, 256, 128, 64)
    weighted = build_loss(
        load_config(
            FINETUNE, ["model.loss.matryoshka_dims=[384,64]", "model.loss.matryoshka_weights=[1,0.5]"]
        )
    )
    assert weighted.matryoshka_weights == (1.0, 0.5)
    plain = load_config(FINETUNE)
    assert isinstance(build_loss(plain), InfoNCELoss) and evaluation_dims(plain) == ()


def test_the_default_loss_is_wrapped_too_and_evaluation_dims_take_precedence():
    cfg = load_config(DIGITS, ["model.loss=null", "model.loss.matryoshka_dims=[32,8]"])
    check_config(cfg)
    loss = build_loss(cfg)
    assert isinstance(loss, MatryoshkaLoss) and isinstance(loss.loss, TripletMarginLoss)
    asked = load_config(DIGITS, ["model.loss.matryoshka_dims=[32,8]", "evaluation.matryoshka_dims=[16,4]"])
    assert evaluation_dims(asked) == (16, 4)
    assert evaluation_dims(load_config(DIGITS, ["evaluation.matryoshka_dims=[16]"])) == (16,)


def test_a_run_trains_with_the_wrapper(tmp_path):
    overrides = ["trainer.progress_bar=false", "trainer.max_duration=1ba", "evaluation.interval=null"]
    cfg = load_config(DIGITS, [*overrides, "model.loss.matryoshka_dims=[32,16,8]"])
    run = build_run(cfg, tmp_path / "run")
    assert isinstance(run.model.loss_fn, MatryoshkaLoss) and run.model.loss_fn.matryoshka_dims == (32, 16, 8)
    run.trainer.fit()
    assert int(run.trainer.state.timestamp.batch) == 1


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            ["model.loss.matryoshka_dims=[64,128]"],
            r"^model\.loss\.matryoshka_dims must be strictly descending",
        ),
        (["model.loss.matryoshka_dims=[32,0]"], r"^model\.loss\.matryoshka_dims must hold integers >= 1"),
        (["model.loss.matryoshka_dims=64"], r"^model\.loss\.matryoshka_dims must be a non-empty list"),
        (
            ["model.loss.matryoshka_dims=[32,8]", "model.loss.matryoshka_weights=[1]"],
            r"^model\.loss\.matryoshka_weights must hold one weight per dimension of matryoshka_dims \(2\)",
        ),
        (
            ["model.loss.matryoshka_weights=[1,1]"],
            r"^model\.loss\.matryoshka_weights needs model\.loss\.matryoshka_dims",
        ),
        (
            ["model.loss.matryoshka_dim=[32,8]"],
            r"^model\.loss: unknown key 'matryoshka_dim'.*Did you mean 'matryoshka_dims'",
        ),
        (["evaluation.matryoshka_dims=[8,16]"], r"^evaluation\.matryoshka_dims must be strictly descending"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match) as error:
        check_config(load_config(DIGITS, overrides))
    assert len(str(error.value).splitlines()) == 1


def test_a_dimension_wider_than_the_model_is_refused_at_the_first_step(tmp_path):
    overrides = ["trainer.progress_bar=false", "trainer.max_duration=1ba", "evaluation.interval=null"]
    run = build_run(load_config(DIGITS, [*overrides, "model.loss.matryoshka_dims=[64,8]"]), tmp_path / "run")
    with pytest.raises(
        ValueError, match=r"matryoshka_dims: 64 is wider than the 32 dimensions of embeddings"
    ):
        run.trainer.fit()
