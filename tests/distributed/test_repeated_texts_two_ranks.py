"""Repeated texts are positives, never negatives, on 2 real processes over gloo: the fine-tuning recipe on
pairs that share queries and passages, each rank's every step checked against the brute-force reference
(in-batch, mined once, online, and a cross-rank pool with a memory), as ``tests/losses/test_repeated_texts.py``
does on one process.

Run with ``bash tests/run_distributed.sh 2``.
"""

from __future__ import annotations

import pytest
import torch
from composer.utils import dist

pytest.importorskip("tokenizers")

from composer_dynsample.config import build_run, load_config
from tests.data.text.helpers import write_jsonl
from tests.distributed._helpers import shared_tmp_dir
from tests.losses import repeated_texts as repeats

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.mark.parametrize("recipe", list(repeats.RECIPES))
def test_no_repeat_is_a_negative_and_no_anchor_loses_its_positive_on_two_ranks(monkeypatch, recipe):
    folder = shared_tmp_dir(prefix="dynsample-repeats-")
    rows = repeats.repeated_pairs()
    if dist.get_global_rank() == 0:
        write_jsonl(folder / "train.jsonl", rows)
    dist.barrier()
    calls, seen = repeats.record_masks(monkeypatch), repeats.LossInputs()
    run = build_run(
        load_config(repeats.recipe_config(folder, recipe, steps=6)),
        folder / f"run-{recipe}",
        callbacks=[seen],
    )
    run.trainer.fit()
    groups = repeats.reference_groups(rows)
    repeats.check_steps(run.splits.train, seen.rows, calls, groups)
    if recipe == "pool":
        # The pool opens with every rank's batch in rank order: its labels split those rows as the reference.
        store, both = run.splits.train, dist.all_gather_object([rows.tolist() for rows in seen.rows])
        for step, call in enumerate(calls):
            global_rows = both[0][step] + both[1][step]
            reference = torch.tensor([groups[int(h)] for h in store.text_hash[global_rows]])
            pool = call["ref_labels"][: len(global_rows)]
            assert torch.equal(pool[:, None] == pool[None, :], reference[:, None] == reference[None, :])
