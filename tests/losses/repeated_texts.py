"""Pairs with repeated texts, the fine-tuning recipe's variants that train on them, and the brute-force
check of every step's loss: no text linked to an anchor's by shared texts is its negative, and no anchor
loses its positive pair.

The corpus (:func:`repeated_pairs`): pairs with texts of their own, groups of three pairs that share one
query (one docstring over three functions) and chains ``(A, P), (B, P), (B, Q)`` (a shared passage, then a
shared query), so that ``Q`` is linked to ``A``. The reference groups are found here by a search over the
texts, independently of :func:`~composer_dynsample.data.text.text_identity.text_groups`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from composer.core import Callback, Event, State
from composer.loggers import Logger

from composer_dynsample.data.text.text_identity import text_hash
from tests.data.text.helpers import WORDS, pair_rows, write_jsonl

RECIPE = Path(__file__).resolve().parents[2] / "yamls" / "finetune_code_search.yaml"
MINED = {"name": "mined_negatives", "pairs_per_batch": 4, "negatives_per_anchor": 1, "window": 4,
         "max_relative_similarity": None}  # fmt: skip
#: The recipes checked: the shipped in-batch recipe (its symmetric loss), mined once and online from a warm
#: table, and NT-Xent over a pool of the other ranks' rows and a cross-batch memory (its miner's labels are
#: the text groups).
RECIPES: dict[str, dict[str, Any]] = {
    "in_batch": {},
    "mined_once": {"sampler": {**MINED, "max_snapshots": 1}, "algorithms": {"embedding_table": {"warm_start": True}}},
    "online": {"sampler": {**MINED, "refresh_every": 2}, "algorithms": {"embedding_table": {"warm_start": True}}},
    "pool": {
        "model_duplicate_key": None,
        # The one-way and symmetric forms score queries against passages; a pool beyond the batch is NT-Xent's.
        "model_loss": {"negatives": "pool", "symmetric": False},
        "algorithms": {"hard_negative_mining": {"strategy": "batch_hard", "labels_key": "text_group",
                                                "cross_rank": True, "gather": "autograd", "memory_size": 16}},
    },
}  # fmt: skip


def repeated_pairs(seed: int = 0) -> list[dict[str, str]]:
    """32 pairs: 14 with texts of their own, 4 groups of 3 sharing a query, 2 chains (A, P), (B, P), (B, Q)."""
    rows = pair_rows(14, seed=seed)
    for g in range(4):
        query = f"shared query {g} about {WORDS[g]} and {WORDS[g + 4]}"
        rows += [
            {"anchor": query, "positive": f"def shared{g}_{k}(x): return {WORDS[g]}_{k}(x)"} for k in range(3)
        ]
    for c in range(2):
        first, second = f"chain query alpha {c} {WORDS[8 + c]}", f"chain query beta {c} {WORDS[10 + c]}"
        shared, own = (
            f"def chain{c}(x): return {WORDS[8 + c]}(x)",
            f"def chain{c}_q(x): return {WORDS[10 + c]}(x)",
        )
        rows += [{"anchor": first, "positive": shared}, {"anchor": second, "positive": shared},
                 {"anchor": second, "positive": own}]  # fmt: skip
    order = np.random.default_rng(seed).permutation(len(rows))
    return [rows[i] for i in order]


def reference_groups(rows: list[dict[str, str]]) -> dict[int, int]:
    """Each text's group (by its ``text_hash``) found by a breadth-first search over the pairs: texts of one
    pair are linked; a group is numbered by its first text in the file."""
    neighbours: dict[int, set[int]] = {}
    for row in rows:
        a, p = text_hash(row["anchor"]), text_hash(row["positive"])
        neighbours.setdefault(a, set()).add(p)
        neighbours.setdefault(p, set()).add(a)
    group: dict[int, int] = {}
    for number, start in enumerate(neighbours):
        if start in group:
            continue
        frontier = [start]
        while frontier:
            text = frontier.pop()
            if text not in group:
                group[text] = number
                frontier.extend(neighbours[text] - group.keys())
    return group


def recipe_config(folder: Path, recipe: str, steps: int = 6) -> dict[str, Any]:
    """``yamls/finetune_code_search.yaml`` with a bag-of-tokens encoder on ``folder``'s pairs and the
    ``recipe``'s sampler, algorithms and model changes."""
    config = yaml.safe_load(RECIPE.read_text())
    changes = RECIPES[recipe]
    write_jsonl(folder / "test.jsonl", pair_rows(8, seed=1))
    config["data"] = {"name": "pairs", "path": str(folder / "train.jsonl"), "test_path": str(folder / "test.jsonl"),
                      "vocab_size": 200, "max_length": 24, "cache_dir": str(folder / "cache")}  # fmt: skip
    config["model"]["encoder"] = {"name": "bag_of_tokens", "token_dim": 16}
    if "model_duplicate_key" in changes:
        config["model"]["duplicate_key"] = changes["model_duplicate_key"]
    config["model"]["loss"].update(changes.get("model_loss", {}))
    config["sampler"] = changes.get("sampler", {"name": "pk", "classes_per_batch": 4, "samples_per_class": 2})
    config["algorithms"] = {**(config.get("algorithms") or {}), **changes.get("algorithms", {})}
    config["optimizer"] = {"name": "adamw", "lr": 0.01}
    config["evaluation"] = {"interval": None, "at_start": False, "ks": [1]}
    config["trainer"] = {"max_duration": f"{steps}ba", "progress_bar": False, "save_folder": None}
    return config


class LossInputs(Callback):
    """Records each step's batch rows (``index``) before the loss."""

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.BEFORE_LOSS:
            self.rows.append(state.batch["index"].clone())


def record_masks(monkeypatch) -> list[dict[str, torch.Tensor]]:
    """Patch the InfoNCE loss's masks to record what each call used and returned."""
    from composer_dynsample.losses import infonce

    original, calls = infonce.info_nce_masks, []

    def recording(labels, ref_labels, indices_tuple, negatives="pool", **kwargs):
        positive, negative = original(labels, ref_labels, indices_tuple, negatives, **kwargs)
        calls.append({"labels": labels.clone(), "ref_labels": None if ref_labels is None else ref_labels.clone(),
                      "positive": positive.clone(), "negative": negative.clone()})  # fmt: skip
        return positive, negative

    monkeypatch.setattr(infonce, "info_nce_masks", recording)
    return calls


def check_steps(
    store: Any, rows_of_steps: list[torch.Tensor], calls: list[dict], groups: dict[int, int]
) -> int:
    """Assert every step's masks against the reference; return the number of (anchor, row) entries of two
    labels in one group that the steps masked (so a caller can insist the corpus exercised them)."""
    assert len(calls) == len(rows_of_steps) > 0
    masked = 0
    for rows, call in zip(rows_of_steps, calls):
        rows = rows.numpy()
        group = torch.tensor([groups[int(h)] for h in store.text_hash[rows]])
        labels = torch.from_numpy(store.row_labels[rows])
        same_group, same_label = group[:, None] == group[None, :], labels[:, None] == labels[None, :]
        local = call["negative"][:, : len(rows)]
        if call["ref_labels"] is None:
            # The pool is the batch: the negatives are exactly the rows of another group.
            assert torch.equal(local, ~same_group), (rows, group.tolist())
        else:
            # The miner's labels are the groups: the batch's label partition is the reference's.
            assert torch.equal(call["labels"][:, None] == call["labels"][None, :], same_group)
            ref = call["ref_labels"]
            assert not (call["negative"] & (call["labels"][:, None] == ref[None, :])).any()
        # No anchor loses its positive: every row with its pair's other row in the batch keeps a positive.
        has_partner = (same_label & ~torch.eye(len(rows), dtype=torch.bool)).any(1)
        assert call["positive"][has_partner].any(1).all(), rows
        masked += int((same_group & ~same_label).sum())
    return masked
