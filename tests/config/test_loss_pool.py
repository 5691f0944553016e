"""The fine-tuning recipe's loss (queries against passages, both ways) beside a pool beyond the batch is
refused when the config is checked, in one line naming both keys, instead of at the first step."""

from __future__ import annotations

from pathlib import Path

import pytest

from composer_dynsample.config import ConfigError, load_config
from composer_dynsample.config.checks import check_config

FINETUNE = Path(__file__).resolve().parents[2] / "yamls" / "finetune_code_search.yaml"


@pytest.mark.parametrize(
    ("pool", "key"),
    [("{cross_rank: true}", "cross_rank"), ("{memory_size: 64}", "memory_size"),
     ("{cross_rank: true, memory_size: 64}", "cross_rank")],
)  # fmt: skip
def test_passages_beside_a_pool_is_refused_naming_both_keys(pool, key):
    cfg = load_config(FINETUNE, [f"algorithms.hard_negative_mining={pool}"])
    with pytest.raises(ConfigError) as caught:
        check_config(cfg)
    message = str(caught.value)
    assert "\n" not in message
    assert "model.loss.negatives=passages" in message and f"algorithms.hard_negative_mining.{key}" in message
    assert "model.loss.negatives=pool" in message


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithms.hard_negative_mining={cross_rank: true}", "model.loss.negatives=pool", "model.loss.symmetric=false"],
        ["algorithms.hard_negative_mining={strategy: batch_hard}"],
        ["algorithms.hard_negative_mining={cross_rank: false, memory_size: 0}"],
        ["algorithms.hard_negative_mining={memory_size: 64}", "model.loss.matryoshka_dims=[384,64]",
         "model.loss.negatives=pool", "model.loss.symmetric=false"],
        [],
    ],
)  # fmt: skip
def test_the_recipe_alone_or_nt_xent_with_a_pool_passes(overrides):
    check_config(load_config(FINETUNE, overrides))


def test_a_matryoshka_wrapped_passages_loss_is_checked_too():
    cfg = load_config(
        FINETUNE, ["algorithms.hard_negative_mining={memory_size: 64}", "model.loss.matryoshka_dims=[384,64]"]
    )
    with pytest.raises(ConfigError, match="memory_size"):
        check_config(cfg)
