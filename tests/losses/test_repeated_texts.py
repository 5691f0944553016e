"""Repeated texts are positives, never negatives: the fine-tuning recipe on pairs that share queries and
passages, every step's loss checked against a brute-force reference (in-batch, mined once, online, and a
memory pool), on one process; ``tests/distributed/test_repeated_texts_two_ranks.py`` on two."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.config import build_run, load_config
from composer_dynsample.data.text.text_identity import text_groups
from tests.data.text.helpers import write_jsonl
from tests.losses.repeated_texts import (
    RECIPES,
    LossInputs,
    check_steps,
    recipe_config,
    record_masks,
    reference_groups,
    repeated_pairs,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_the_store_groups_equal_the_reference(tmp_path):
    rows = repeated_pairs()
    write_jsonl(tmp_path / "train.jsonl", rows)
    store = build_run(load_config(recipe_config(tmp_path, "in_batch")), tmp_path / "run").splits.train
    groups = reference_groups(rows)
    reference = [groups[int(h)] for h in store.text_hash[: len(store)]]
    ours = text_groups(store.row_labels, store.text_hash, len(store))[: len(store)].tolist()
    assert len(set(reference)) == 14 + 4 + 2
    # One partition: two rows share a reference group exactly when they share a store group.
    assert len(set(zip(reference, ours))) == len(set(reference)) == len(set(ours))


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_no_repeat_is_a_negative_and_no_anchor_loses_its_positive(tmp_path, monkeypatch, recipe):
    rows = repeated_pairs()
    write_jsonl(tmp_path / "train.jsonl", rows)
    calls, seen = record_masks(monkeypatch), LossInputs()
    run = build_run(load_config(recipe_config(tmp_path, recipe, steps=8)), tmp_path / "run", callbacks=[seen])
    run.trainer.fit()
    masked = check_steps(run.splits.train, seen.rows, calls, reference_groups(rows))
    if recipe == "in_batch":
        assert masked > 0  # some batch held two pairs of one group: the check had something to check


def test_without_repeats_the_recipe_trains_as_the_miner_that_masked_by_text(tmp_path):
    """On pairs with no shared text, the loss reading the batch's groups trains to the weights of the recipe
    before it (a batch-hard miner handing the loss the text hashes): the groups change nothing there."""
    import torch

    from tests.data.text.helpers import pair_rows

    write_jsonl(tmp_path / "train.jsonl", pair_rows(32, seed=0))
    weights = {}
    for name, overrides in {
        "groups": [],
        "miner": [
            "algorithms.hard_negative_mining={strategy: batch_hard, duplicate_key: text_hash}",
            "model.duplicate_key=null",
        ],
    }.items():
        config = load_config(recipe_config(tmp_path, "in_batch", steps=4), overrides)
        run = build_run(config, tmp_path / f"run-{name}")
        run.trainer.fit()
        weights[name] = {key: value.clone() for key, value in run.model.state_dict().items()}
    assert weights["groups"].keys() == weights["miner"].keys()
    for key, value in weights["groups"].items():
        assert torch.allclose(value, weights["miner"][key], atol=1e-6), key
