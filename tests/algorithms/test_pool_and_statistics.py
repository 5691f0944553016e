"""assemble_pool and mining_statistics against brute-force references, and the algorithm's host syncs."""

from __future__ import annotations

import sys

import pytest
import torch

from composer_dynsample import HardNegativeMining
from composer_dynsample.distances import paired_distance
from composer_dynsample.mining import BatchHardMiner, MultiSimilarityMiner, build_miner
from composer_dynsample.mining.pool import assemble_pool
from composer_dynsample.mining.statistics import STATISTICS, mining_statistics
from tests.algorithms.helpers import make_trainer


def _data(seed=0, rows=12, dim=4):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, dim, generator=generator), torch.randint(0, 3, (rows,), generator=generator)


@pytest.mark.parametrize("memory_rows", [0, 5])
@pytest.mark.parametrize("enqueue", [False, True])
def test_pool_is_the_batch_then_the_memory(memory_rows, enqueue):
    x, y = _data()
    memory_x, memory_y = _data(seed=1, rows=memory_rows)
    pool = assemble_pool(
        x, y, memory_embeddings=memory_x.double(), memory_labels=memory_y.int(), enqueue=enqueue
    )
    assert torch.equal(pool.embeddings, torch.cat([x, memory_x]))
    assert torch.equal(pool.labels, torch.cat([y, memory_y])) and pool.labels.dtype == y.dtype
    assert pool.embeddings.dtype == x.dtype
    assert pool.offset == (0 if memory_rows else None)
    if memory_rows == 0:
        assert pool.embeddings is x  # nothing joined: the batch itself, mined without a reference pool
    if enqueue:
        assert torch.equal(pool.enqueue_embeddings, x) and not pool.enqueue_embeddings.requires_grad
    else:
        assert pool.enqueue_embeddings is None and pool.enqueue_labels is None


def test_one_process_cross_rank_pool_is_the_batch_with_its_gradient():
    x, y = _data()
    x.requires_grad_(True)
    pool = assemble_pool(x, y, cross_rank=True, with_grad=True)
    assert torch.equal(pool.embeddings, x) and pool.embeddings.requires_grad


def _reference(embeddings, pool, tuples, distance, margin):
    """A float64 loop over the tuples."""
    e, p = embeddings.double(), pool.double()

    def d(u, v):
        return float(paired_distance(u[None], v[None], distance)[0])

    if len(tuples) == 3:
        ap = [d(e[a], p[q]) for a, q in zip(tuples[0].tolist(), tuples[1].tolist())]
        an = [d(e[a], p[n]) for a, n in zip(tuples[0].tolist(), tuples[2].tolist())]
        active = [float(dp - dn + margin > 0) for dp, dn in zip(ap, an)]
    else:
        ap = [d(e[a], p[q]) for a, q in zip(tuples[0].tolist(), tuples[1].tolist())]
        an = [d(e[a], p[n]) for a, n in zip(tuples[2].tolist(), tuples[3].tolist())]
        active = None
    count = e.shape[0]
    pairs = [d(e[i], e[j]) for i in range(count) for j in range(count) if i != j]
    spread = sum(pairs) / len(pairs)
    if distance == "euclidean":  # the spread is the root of the mean squared distance
        spread = (sum(v * v for v in pairs) / len(pairs)) ** 0.5
    reference = {
        "skipped": 0.0,
        "num_tuples": float(len(ap) + (0 if active is not None else len(an))),
        "positive_distance": sum(ap) / len(ap) if ap else 0.0,
        "negative_distance": sum(an) / len(an) if an else 0.0,
        "embedding_spread": spread,
    }
    if active is not None:
        reference["active_fraction"] = sum(active) / len(active) if active else 0.0
    return reference


@pytest.mark.parametrize("distance", ["cosine", "euclidean", "squared_euclidean"])
@pytest.mark.parametrize("strategy", ["batch_hard", "semi_hard", "multi_similarity"])
def test_statistics_match_a_float64_loop(strategy, distance):
    x, y = _data(rows=16)
    memory_x, memory_y = _data(seed=2, rows=6)
    pool = assemble_pool(x, y, memory_embeddings=memory_x, memory_labels=memory_y)
    tuples = build_miner(strategy, distance=distance)(x, y, pool.embeddings, pool.labels, self_offset=0)
    stats = mining_statistics(x, pool.embeddings, tuples, distance=distance, margin=0.3)
    assert all(value.ndim == 0 for value in stats.values())
    assert list(stats) == [name for name in STATISTICS if name in stats]
    reference = _reference(x, pool.embeddings, tuples, distance, 0.3)
    assert {k: float(v) for k, v in stats.items()} == pytest.approx(reference, abs=1e-5)


def test_skipped_and_empty_steps():
    x, _ = _data()
    assert {k: float(v) for k, v in mining_statistics(x, x, (), skipped=True).items()} == {"skipped": 1.0}
    empty = (torch.empty(0, dtype=torch.int64),) * 3
    stats = mining_statistics(x, x, empty)
    assert float(stats["num_tuples"]) == 0.0 and float(stats["positive_distance"]) == 0.0


def test_statistics_reach_the_logger_with_one_host_sync_per_step(monkeypatch):
    # Count the host reads made from the algorithm, its step, the pool, the statistics modules and the log window:
    # one tolist per logging step (every step by default), the finiteness flag and the statistics together; the
    # miners' own reads are not counted. Before, one item (the finiteness flag) and one tolist per step.
    counted = ("hard_negative_mining.py", "step.py", "statistics.py", "pool.py", "log_window.py")
    calls = []
    for name in ("item", "tolist", "__float__", "__bool__", "__int__"):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, _original=original, _name=name, **kwargs):
            if sys._getframe(1).f_code.co_filename.endswith(counted):
                calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    trainer, _, _ = make_trainer(HardNegativeMining("semi_hard", memory_size=32), max_duration="3ba")
    trainer.fit()
    assert sorted(calls) == ["tolist"] * 3


def _with_memory(strategy, x, y, memory_x, memory_y, **kwargs):
    pool = assemble_pool(x, y, memory_embeddings=memory_x, memory_labels=memory_y)
    return build_miner(strategy, kwargs)(x, y, pool.embeddings, pool.labels, self_offset=0)


@pytest.mark.parametrize("strategy", ["batch_hard", "hard_topk"])
def test_an_anchor_is_never_its_own_positive_even_on_ties(strategy):
    # Duplicate embeddings: the hardest positive ties with the anchor's own row. The miner used to pick
    # the own row and the self-match filter then dropped anchors 0 and 2 with their valid triplets.
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    y = torch.tensor([0, 0, 1, 1])
    ours = _with_memory(strategy, x, y, torch.tensor([[-1.0, 0.0]]), torch.tensor([9]))
    assert ours[0].tolist() == [0, 1, 2, 3] and ours[1].tolist() == [1, 0, 3, 2]


def test_random_triplets_with_a_memory_give_every_anchor_a_triplet():
    x, y = torch.nn.functional.normalize(torch.randn(8, 16), dim=1), torch.arange(8) // 2
    memory_x, memory_y = torch.nn.functional.normalize(torch.randn(4, 16), dim=1), torch.arange(10, 14)
    for seed in range(20):  # was about half the anchors: the own row was drawn as positive, then dropped
        generator = torch.Generator().manual_seed(seed)
        anchors, positives, _ = _with_memory("random_triplets", x, y, memory_x, memory_y, generator=generator)
        assert anchors.tolist() == list(range(8)) and positives.tolist() == [1, 0, 3, 2, 5, 4, 7, 6]


def test_multi_similarity_with_a_memory_keeps_no_pair_for_an_anchor_without_a_positive():
    # Anchors 0 and 1 are each alone in their class: with the own row as a "positive" at distance 0,
    # they used to keep their close negative pairs.
    x = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [-0.1, 1.0]]), dim=1)
    y = torch.tensor([0, 1, 2, 2])
    ours = _with_memory("multi_similarity", x, y, torch.tensor([[-1.0, 0.0]]), torch.tensor([7]), epsilon=0.1)
    assert [t.tolist() for t in ours] == [t.tolist() for t in MultiSimilarityMiner(epsilon=0.1)(x, y)]


def test_self_offset_must_point_at_the_anchors():
    x, y = _data(rows=4)
    with pytest.raises(ValueError, match=r"self_offset=2 says the pool holds the 4 anchors at rows 2 to 5"):
        BatchHardMiner()(x, y, torch.cat([x, x]), torch.cat([y, y + 1]), self_offset=2)
