"""``TwoTowerEncoder(frozen_passages=True)``: the ADORE mode, a fixed passage tower beside a trained query one."""

from __future__ import annotations

import copy

import torch
from composer import Trainer

from composer_dynsample import EmbeddingModel, HardNegativeMining, InfoNCELoss
from composer_dynsample.models.text import TwoTowerEncoder
from tests.models.text_helpers import TEXTS, features, text_loader, transformer


def frozen_towers() -> TwoTowerEncoder:
    start = transformer(embedding_dim=8)  # one encoder: its passage side stays the starting copy
    return TwoTowerEncoder(start, copy.deepcopy(start), frozen_passages=True)


def test_passages_take_the_frozen_towers_eval_embedding_without_a_graph_whatever_the_mode():
    towers = frozen_towers().train()
    assert towers.query_encoder.training and not towers.passage_encoder.training
    flags = [i % 2 == 0 for i in range(len(TEXTS))]
    batch = features(TEXTS, is_query=flags)
    embeddings = towers(batch)
    passages = [i for i, flag in enumerate(flags) if not flag]
    reference = copy.deepcopy(towers.passage_encoder).eval()
    with torch.no_grad():
        expected = reference({key: value[passages] for key, value in batch.items()})
    torch.testing.assert_close(embeddings[passages], expected, rtol=0, atol=0)
    torch.testing.assert_close(
        towers(batch)[passages], expected, rtol=0, atol=0
    )  # no dropout: the same again
    embeddings.sum().backward()
    assert all(param.grad is None for param in towers.passage_encoder.parameters())
    assert all(param.grad is not None for param in towers.query_encoder.parameters())
    # A batch of queries alone: the frozen tower adds nothing to the graph.
    towers.zero_grad(set_to_none=True)
    towers(features(TEXTS[:4], is_query=[True] * 4)).sum().backward()
    assert all(param.grad is None for param in towers.passage_encoder.parameters())


def test_training_moves_the_query_tower_and_leaves_the_passage_tower_as_it_started():
    towers = frozen_towers()
    start = copy.deepcopy(towers)
    model = EmbeddingModel(towers, InfoNCELoss(temperature=0.1))
    Trainer(
        model=model,
        train_dataloader=text_loader(),
        optimizers=torch.optim.AdamW(model.parameters(), lr=1e-2),
        algorithms=[HardNegativeMining("batch_hard")],
        max_duration="3ba",
        progress_bar=False,
        seed=0,
    ).fit()
    for ours, theirs in zip(towers.passage_encoder.parameters(), start.passage_encoder.parameters()):
        assert torch.equal(ours, theirs)
    moved = [
        not torch.equal(ours, theirs)
        for ours, theirs in zip(towers.query_encoder.parameters(), start.query_encoder.parameters())
    ]
    assert any(moved)
