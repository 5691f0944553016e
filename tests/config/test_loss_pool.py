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


def _mix(b: str = "{name: pairs, path: b.jsonl}", a: str = "{name: pairs, path: a.jsonl}") -> str:
    return f"data={{name: mix, sources: {{a: {a}, b: {b}}}}}"


def test_a_mix_source_whose_loss_is_passages_beside_a_pool_is_refused_naming_the_source():
    source = "{name: pairs, path: b.jsonl, loss: {name: info_nce, negatives: passages, symmetric: true}}"
    nt_xent = ["model.loss.negatives=pool", "model.loss.symmetric=false"]
    cfg = load_config(
        FINETUNE, [_mix(source), *nt_xent, "algorithms.hard_negative_mining={cross_rank: true}"]
    )
    with pytest.raises(ConfigError, match=r"^data\.sources\.b: .*hard_negative_mining\.cross_rank"):
        check_config(cfg)
    check_config(
        load_config(FINETUNE, [_mix(), *nt_xent, "algorithms.hard_negative_mining={cross_rank: true}"])
    )


def test_a_mix_is_checked_by_each_source_sampler_not_the_run_level_one():
    """A run-level table-fed sampler that every source replaces needs no table; a source that keeps it does."""
    mined = "sampler={name: mined_negatives, pairs_per_batch: 16, negatives_per_anchor: 1, window: 8}"
    pk = "{name: pk, classes_per_batch: 4, samples_per_class: 2}"
    overridden = _mix(
        f"{{name: pairs, path: b.jsonl, sampler: {pk}}}", f"{{name: pairs, path: a.jsonl, sampler: {pk}}}"
    )
    check_config(load_config(FINETUNE, [overridden, mined]))
    kept = _mix(f"{{name: pairs, path: b.jsonl, sampler: {pk}}}")
    with pytest.raises(ConfigError, match=r"^data\.sources\.a: sampler: 'mined_negatives' .*embedding_table"):
        check_config(load_config(FINETUNE, [kept, mined]))
