"""Duplicate ids: the same sample under two labels is never a negative of itself, in mining and the loss."""

from __future__ import annotations

import pytest
import torch
from composer.core import DataSpec
from composer.loggers import InMemoryLogger

from composer_dynsample import (
    CrossBatchMemory,
    EmbeddingModel,
    HardNegativeMining,
    InfoNCELoss,
    PKBatchSampler,
    TripletMarginLoss,
    build_dataloader,
)
from composer_dynsample.mining import (
    BatchHardMiner,
    DistanceWeightedMiner,
    HardTopKMiner,
    MultiSimilarityMiner,
    RandomTripletsMiner,
    SemiHardMiner,
    assemble_pool,
    drop_duplicate_negatives,
)
from composer_dynsample.mining.duplicates import duplicate_negatives
from tests.algorithms.helpers import (
    BagEncoder,
    PairsTexts,
    Recorder,
    TextCollate,
    assert_first_batch_refused,
    reference_duplicates,
    text_trainer,
)


def _drop_reference(tuples, duplicates):
    """The tuples (triplets, or the negative pairs of pairs) whose negative is no duplicate, in order."""
    if len(tuples) == 3:
        keep = [not duplicates[a][n] for a, n in zip(tuples[0].tolist(), tuples[2].tolist())]
        return tuple(t[torch.tensor(keep, dtype=torch.bool)] for t in tuples), keep.count(False)
    keep = [not duplicates[a][n] for a, n in zip(tuples[2].tolist(), tuples[3].tolist())]
    mask = torch.tensor(keep, dtype=torch.bool)
    return (tuples[0], tuples[1], tuples[2][mask], tuples[3][mask]), keep.count(False)


# Pairs data: q1 and q2 share their answer P, pair 3 repeats pair 0, pair 2 shares nothing.
PAIRS_LABELS = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
PAIRS_IDS = torch.tensor([100, 200, 101, 200, 102, 201, 100, 200])  # q1 P q2 P q3 R q1 P


def test_a_shared_answer_and_a_repeated_pair_are_no_negatives_and_the_rest_are():
    duplicates = duplicate_negatives(PAIRS_LABELS, PAIRS_IDS, PAIRS_LABELS, PAIRS_IDS)
    excluded = {a: duplicates[a].nonzero().view(-1).tolist() for a in range(8)}
    assert excluded[0] == [3, 6, 7]  # q1: pair 1's copy of its answer P, and pair 3 (q1 and P again)
    assert excluded[1] == [2, 3, 6, 7]  # P: its copies, and q2, a query whose answer is P too
    assert excluded[2] == [1, 7]  # q2: the copies of its answer P; q1 stays a negative
    assert excluded[4] == [] and excluded[5] == []  # pair 2 shares no text with the others
    assert duplicates.tolist() == reference_duplicates(PAIRS_LABELS, PAIRS_IDS)
    assert torch.equal(duplicates, duplicates.T)  # the relation is symmetric


def test_negative_ids_match_nothing_and_unique_ids_exclude_nothing():
    unknown = torch.full((8,), -1)
    assert not duplicate_negatives(PAIRS_LABELS, unknown, PAIRS_LABELS, unknown).any()
    unique = torch.arange(8)
    assert not duplicate_negatives(PAIRS_LABELS, unique, PAIRS_LABELS, unique).any()


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("with_pool", [False, True])
def test_duplicate_negatives_equal_the_set_definition(seed, with_pool):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (10,), generator=generator)
    ids = torch.randint(-1, 6, (10,), generator=generator)  # few ids: many collisions, some rows without one
    ref_labels, ref_ids = (
        (torch.randint(0, 5, (7,), generator=generator), torch.randint(-1, 6, (7,), generator=generator))
        if with_pool
        else (labels, ids)
    )
    expected = reference_duplicates(labels, ids, *((ref_labels, ref_ids) if with_pool else ()))
    assert duplicate_negatives(labels, ids, ref_labels, ref_ids).tolist() == expected
    # Entry lists of any shape give the same answers.
    anchors = torch.randint(0, 10, (5, 3), generator=generator)
    rows = torch.randint(0, ref_labels.shape[0], (5, 3), generator=generator)
    answers = duplicate_negatives(labels, ids, ref_labels, ref_ids, anchors, rows)
    assert answers.tolist() == [
        [expected[a][n] for a, n in zip(r, c)] for r, c in zip(anchors.tolist(), rows.tolist())
    ]


def _text_batch(seed: int, rows: int = 24, classes: int = 8, texts: int = 10, dim: int = 5):
    """Embeddings where equal ids are equal rows (a deterministic encoder on identical texts): the duplicate
    of a positive is then the hardest negative there is."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(rows) % classes
    ids = torch.randint(0, texts, (rows,), generator=generator)
    table = torch.nn.functional.normalize(torch.randn(texts, dim, generator=generator), dim=1)
    return table[ids], labels, ids


MINERS = {
    "batch_hard": BatchHardMiner(),
    "semi_hard": lambda *args: SemiHardMiner(margin=0.5)(*args),
    "hard_topk": lambda *args: HardTopKMiner(k=3)(*args),
    "distance_weighted": lambda *args: DistanceWeightedMiner(generator=torch.Generator().manual_seed(0))(
        *args
    ),
    "random_triplets": lambda *args: RandomTripletsMiner(generator=torch.Generator().manual_seed(0))(*args),
    "multi_similarity": lambda *args: MultiSimilarityMiner(epsilon=0.5)(*args),
}


@pytest.mark.parametrize("miner", sorted(MINERS))
@pytest.mark.parametrize("with_pool", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_the_post_filter_drops_exactly_the_duplicate_negatives(miner, with_pool, seed):
    embeddings, labels, ids = _text_batch(seed)
    ref = _text_batch(seed + 100, rows=12) if with_pool else (None, None, None)
    tuples = MINERS[miner](embeddings, labels, ref[0], ref[1])
    kept, dropped = drop_duplicate_negatives(tuples, labels, ids, ref[1], ref[2])
    duplicates = reference_duplicates(labels, ids, *((ref[1], ref[2]) if with_pool else ()))
    expected, count = _drop_reference(tuples, duplicates)
    assert all(torch.equal(k, e) for k, e in zip(kept, expected))  # the others untouched, in order
    assert int(dropped) == count and dropped.dtype == torch.int64
    negatives = zip(kept[0].tolist(), kept[2].tolist()) if len(kept) == 3 else zip(kept[2], kept[3])
    assert not any(duplicates[a][n] for a, n in negatives)


def test_batch_hard_picks_the_copy_of_a_positive_and_the_filter_drops_it():
    embeddings, labels, ids = _text_batch(0)
    tuples = BatchHardMiner()(embeddings, labels)
    _, dropped = drop_duplicate_negatives(tuples, labels, ids)
    assert int(dropped) > 0  # the batch really holds duplicate negatives for the filter to find
    unique = torch.arange(labels.shape[0])
    kept, dropped = drop_duplicate_negatives(tuples, labels, unique)
    assert int(dropped) == 0 and all(torch.equal(k, t) for k, t in zip(kept, tuples))


def test_the_filter_needs_pool_labels_and_ids_together():
    embeddings, labels, ids = _text_batch(0)
    with pytest.raises(ValueError, match="ref_labels and ref_duplicate_ids must be given together"):
        drop_duplicate_negatives(BatchHardMiner()(embeddings, labels), labels, ids, labels)


# The reference pool and the cross-batch memory carry the ids as they carry the labels.


def test_the_pool_carries_the_batch_ids_then_the_memory_ids():
    x, y, ids = torch.randn(4, 3), torch.tensor([0, 0, 1, 1]), torch.tensor([5, 6, 7, 8])
    memory_x, memory_y, memory_ids = torch.randn(3, 3), torch.tensor([2, 2, 3]), torch.tensor([9, 5, 4])
    pool = assemble_pool(x, y, memory_embeddings=memory_x, memory_labels=memory_y, enqueue=True,
                         duplicate_ids=ids, memory_duplicate_ids=memory_ids)  # fmt: skip
    assert pool.duplicate_ids.tolist() == [5, 6, 7, 8, 9, 5, 4]
    assert pool.enqueue_duplicate_ids.tolist() == [5, 6, 7, 8]
    # A memory without ids (saved before they were kept) joins with -1: no id, matching nothing.
    pool = assemble_pool(x, y, memory_embeddings=memory_x, memory_labels=memory_y, duplicate_ids=ids)
    assert pool.duplicate_ids.tolist() == [5, 6, 7, 8, -1, -1, -1] and pool.enqueue_duplicate_ids is None
    # Without ids nothing changes.
    pool = assemble_pool(x, y, memory_embeddings=memory_x, memory_labels=memory_y, enqueue=True)
    assert pool.duplicate_ids is None and pool.enqueue_duplicate_ids is None
    assert assemble_pool(x, y, duplicate_ids=ids).duplicate_ids is ids


def test_the_memory_keeps_ids_in_fifo_order_and_rows_without_ids_hold_minus_one():
    memory, expected = CrossBatchMemory(5), []
    memory.enqueue(torch.zeros(2, 3), torch.tensor([0, 1]))
    assert memory.duplicate_ids is None  # no ids ever given: none kept
    expected = [-1, -1]
    for step, ids in enumerate(([10, 11], None, [12, 13, 14])):
        labels = torch.arange(2 + step) if ids is None else torch.arange(len(ids))
        memory.enqueue(torch.zeros(labels.shape[0], 3), labels, None if ids is None else torch.tensor(ids))
        expected = (expected + (ids or [-1] * labels.shape[0]))[-5:]
        assert memory.duplicate_ids.tolist() == expected
    with pytest.raises(ValueError, match=r"duplicate_ids of shape \(1,\) must have the labels' shape \(2,\)"):
        memory.enqueue(torch.zeros(2, 3), torch.tensor([0, 1]), torch.tensor([1]))


def test_the_memory_checkpoint_holds_the_ids_and_an_old_one_without_them_loads():
    memory = CrossBatchMemory(4)
    memory.enqueue(torch.randn(3, 2), torch.tensor([0, 1, 2]), torch.tensor([7, 8, 9]))
    restored = CrossBatchMemory(4)
    restored.load_state_dict(memory.state_dict())
    assert restored.duplicate_ids.tolist() == [7, 8, 9]
    old = memory.state_dict()
    del old["duplicate_ids"]  # a checkpoint written before ids were kept
    restored = CrossBatchMemory(4)
    restored.load_state_dict(old)
    assert restored.duplicate_ids is None and restored.labels.tolist() == [0, 1, 2]
    restored.enqueue(torch.randn(2, 2), torch.tensor([3, 4]), torch.tensor([5, 6]))
    assert restored.duplicate_ids.tolist() == [-1, -1, 5, 6]


# Through Composer's Trainer, on text batches: {"features": {...}, "labels", "indices", "text_hash"}.


def test_trainer_mines_without_duplicate_negatives_and_logs_how_many_it_dropped():
    recorder, logged = Recorder(), InMemoryLogger()
    algorithm = HardNegativeMining("batch_hard", duplicate_key="text_hash")
    text_trainer(algorithm, TripletMarginLoss(0.2), callbacks=[recorder], loggers=[logged]).fit()
    counts = [value for _, value in logged.data["mining/duplicate_negatives_dropped"]]
    assert len(counts) == len(recorder.mined) > 0
    for mined, batch, count in zip(recorder.mined, recorder.batches, counts):
        assert torch.equal(mined.duplicate_ids, batch["text_hash"]) and mined.ref_duplicate_ids is None
        # The unfiltered tuples, mined again on the same embeddings, minus the duplicate negatives.
        tuples = BatchHardMiner()(mined.embeddings.detach(), mined.labels)
        expected, dropped = _drop_reference(tuples, reference_duplicates(mined.labels, batch["text_hash"]))
        assert all(torch.equal(k, e) for k, e in zip(mined.indices_tuple, expected))
        assert count == dropped
    assert sum(counts) > 0  # the data's shared answers did put duplicates into batches


def test_infonce_through_the_trainer_masks_the_duplicates_of_the_pool():
    recorder = Recorder()
    algorithm = HardNegativeMining("batch_hard", duplicate_key="text_hash")
    text_trainer(algorithm, InfoNCELoss(0.1), callbacks=[recorder], max_duration="1ep").fit()
    changed = 0
    for mined, loss in zip(recorder.mined, recorder.losses):
        args = (mined.embeddings.detach(), mined.labels, mined.indices_tuple)
        assert torch.allclose(loss, InfoNCELoss(0.1)(*args, duplicate_ids=mined.duplicate_ids), atol=1e-6)
        changed += not torch.allclose(loss, InfoNCELoss(0.1)(*args), atol=1e-6)
    assert changed > 0


def test_the_memory_stores_the_global_batch_ids_and_checkpoints_them():
    recorder = Recorder()
    algorithm = HardNegativeMining("batch_hard", duplicate_key="text_hash", memory_size=32)
    text_trainer(algorithm, InfoNCELoss(0.1), callbacks=[recorder], max_duration="6ba").fit()
    enqueued = torch.cat([batch["text_hash"] for batch in recorder.batches])
    assert algorithm.memory.duplicate_ids.tolist() == enqueued[-32:].tolist()
    for step, mined in enumerate(recorder.mined[1:], start=1):
        stored = torch.cat([batch["text_hash"] for batch in recorder.batches[:step]])[-32:]
        assert mined.ref_duplicate_ids.tolist() == mined.duplicate_ids.tolist() + stored.tolist()
        duplicates = reference_duplicates(
            mined.labels, mined.duplicate_ids, mined.ref_labels, mined.ref_duplicate_ids
        )
        assert not any(
            duplicates[a][n] for a, n in zip(mined.indices_tuple[0].tolist(), mined.indices_tuple[2].tolist())
        )
    saved = algorithm.state_dict()["memory"]
    assert saved["duplicate_ids"] is not None
    resumed = HardNegativeMining("batch_hard", duplicate_key="text_hash", memory_size=32)
    resumed.load_state_dict(algorithm.state_dict())
    assert torch.equal(resumed.memory.duplicate_ids, algorithm.memory.duplicate_ids)


def test_a_memory_checkpoint_without_ids_resumes_with_rows_that_match_nothing():
    old = HardNegativeMining("batch_hard", memory_size=32)
    text_trainer(old, TripletMarginLoss(0.2), max_duration="3ba").fit()
    state = old.state_dict()
    del state["memory"]["duplicate_ids"]  # as written before ids were kept
    algorithm = HardNegativeMining("batch_hard", duplicate_key="text_hash", memory_size=32)
    algorithm.load_state_dict(state)
    recorder = Recorder()
    text_trainer(algorithm, InfoNCELoss(0.1), callbacks=[recorder], max_duration="2ba").fit()
    first = recorder.mined[0]
    assert first.ref_duplicate_ids.tolist() == first.duplicate_ids.tolist() + [-1] * 32
    assert all(torch.isfinite(loss) for loss in recorder.losses)


def test_a_missing_or_bad_duplicate_key_is_named():
    algorithm = HardNegativeMining("batch_hard", duplicate_key="text_hsah")
    with pytest.raises(ValueError, match=r"state.batch\['text_hsah'\].*Set duplicate_key to where it is"):
        text_trainer(algorithm, TripletMarginLoss(0.2), max_duration="1ba").fit()
    with pytest.raises(
        ValueError, match=r"duplicate_key must be a batch key \(a string or an index\) or None"
    ):
        HardNegativeMining(duplicate_key=1.5)


def test_float_duplicate_ids_are_refused_in_one_line():
    class FloatHash(TextCollate):
        def __call__(self, indices):
            batch = super().__call__(indices)
            batch["text_hash"] = batch["text_hash"].float()
            return batch

    data = PairsTexts()
    sampler = PKBatchSampler(data.labels, classes_per_batch=4, samples_per_class=2, seed=0)
    loader = build_dataloader(data, sampler, collate_fn=FloatHash(data))
    model = EmbeddingModel(BagEncoder())
    assert_first_batch_refused(
        model,
        DataSpec(loader, get_num_samples_in_batch=lambda batch: int(batch["labels"].shape[0])),
        HardNegativeMining("batch_hard", duplicate_key="text_hash"),
        match=r"state.batch\['text_hash'\] \(duplicate_key\) must be a 1-D integer tensor",
    )


def test_a_loss_without_duplicate_ids_gets_the_filtered_tuples_only():
    from pytorch_metric_learning import losses as pml_losses

    recorder = Recorder()
    algorithm = HardNegativeMining("batch_hard", duplicate_key="text_hash")
    text_trainer(
        algorithm, pml_losses.TripletMarginLoss(margin=0.2), callbacks=[recorder], max_duration="3ba"
    ).fit()
    for mined, loss in zip(recorder.mined, recorder.losses):
        expected = pml_losses.TripletMarginLoss(margin=0.2)(
            mined.embeddings.detach(), mined.labels, mined.indices_tuple
        )
        assert torch.allclose(loss, expected, atol=1e-6)
