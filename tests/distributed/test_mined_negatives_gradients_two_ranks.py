"""Cross-rank InfoNCE over batches with mined corpus negatives and given negatives, on 2 real ranks.

Each rank's text batch is its P pairs, then one mined passage per query, then the given negatives of
its queries (``TextCollate``). With ``HardNegativeMining(cross_rank=True, gather="autograd")`` the
Trainer's DDP step must equal one process's SGD step on the two ranks' batches concatenated in rank
order: the gathered pool keeps every row beside its own label (sentence-transformers' PR #3453 fixed a
gather that laid anchors, positives and negatives out in different orders).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from composer import Trainer
from composer.core import Callback
from composer.utils import dist

pytest.importorskip("tokenizers")

from composer_dynsample import EmbeddingModel, HardNegativeMining, InfoNCELoss, SetSamplerEpoch
from composer_dynsample.data import IndexDataset, TextCollate, text_data_spec
from composer_dynsample.data.text.pairs import load_pairs
from composer_dynsample.mining import BatchHardMiner
from composer_dynsample.models.text import BagOfTokensEncoder
from composer_dynsample.samplers.dataloader import build_dataloader
from composer_dynsample.samplers.mined_negatives import MinedNegativesPKBatchSampler
from tests.data.text.helpers import write_pairs

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]

P, LR = 4, 0.5


class Record(Callback):
    """Every rank's batch, gathered, at each step (what the rank-order concatenation is made of)."""

    def __init__(self) -> None:
        self.batches: list[list[dict]] = []

    def after_dataloader(self, state, logger) -> None:
        self.batches.append(dist.all_gather_object({key: state.batch[key] for key in ("index", "labels")}))


def splits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mined_grad") if dist.get_global_rank() == 0 else None
    folder = Path(dist.all_gather_object(str(folder))[0])  # one folder: rank 0's
    if dist.get_global_rank() == 0:
        write_pairs(folder / "pairs.jsonl", 40, negatives=True)
        load_pairs(folder / "pairs.jsonl", vocab_size=120, max_length=16, cache_dir=folder / "cache")
    dist.barrier()  # rank 1 reads rank 0's tokenized cache
    return load_pairs(folder / "pairs.jsonl", vocab_size=120, max_length=16, cache_dir=folder / "cache")


def test_the_ddp_step_equals_one_process_on_the_ranks_batches_in_rank_order(tmp_path_factory):
    dist.initialize_dist("cpu")
    store = splits(tmp_path_factory).train
    sampler = MinedNegativesPKBatchSampler.from_store(
        store, P, 1, window=3, max_relative_similarity=None, seed=4
    )
    # A snapshot before training: the first epoch's negatives are mined (the same one on both ranks).
    snapshot = torch.randn(len(store), 6, generator=torch.Generator().manual_seed(3))
    sampler.update_neighbours(snapshot)
    collate = TextCollate(store)
    loader = build_dataloader(IndexDataset(store.labels), sampler, collate_fn=collate)
    torch.manual_seed(0)
    encoder = BagOfTokensEncoder(vocab_size=store.vocab_size, token_dim=8, embedding_dim=6)
    start = copy.deepcopy(encoder)
    model = EmbeddingModel(encoder, InfoNCELoss(temperature=0.1))
    recorder = Record()
    trainer = Trainer(
        model=model,
        train_dataloader=text_data_spec(loader),
        optimizers=torch.optim.SGD(model.parameters(), lr=LR),
        algorithms=[HardNegativeMining("batch_hard", cross_rank=True, gather="autograd")],
        callbacks=[SetSamplerEpoch(), recorder],
        max_duration="1ba",
        progress_bar=False,
        seed=0,
    )
    trainer.fit()
    (per_rank,) = recorder.batches
    assert sampler.guard_counts(0)["random"] == 0  # every query's negative was mined
    # Each rank's batch: its pairs, one mined passage per query, then given negatives.
    for batch in per_rank:
        rows = batch["index"].numpy()
        assert (rows[: 2 * P] < len(store)).all() and not store.is_query[rows[2 * P : 3 * P]].any()
        assert (rows[3 * P :] >= len(store)).any()  # given negatives are in the batch
    labels = torch.cat([batch["labels"] for batch in per_rank])
    # One process on the concatenated batch: the same mining, the same loss, one SGD step.
    reference = EmbeddingModel(start, InfoNCELoss(temperature=0.1))
    parts = [collate(batch["index"][: 3 * P].tolist()) for batch in per_rank]  # each rank's own batch again
    for part, batch in zip(parts, per_rank):
        assert torch.equal(part["index"], batch["index"])
    embeddings = torch.cat([reference(part) for part in parts])
    tuples = BatchHardMiner()(embeddings.detach(), labels)
    reference.loss_fn(embeddings, labels, tuples).backward()
    for trained, initial in zip(model.encoder.parameters(), start.parameters()):
        if initial.grad is None:
            continue
        expected = initial.detach() - LR * initial.grad
        torch.testing.assert_close(trained.detach(), expected, atol=1e-6, rtol=1e-5)
    moved = [
        not torch.equal(a.detach(), b.detach())
        for a, b in zip(model.encoder.parameters(), start.parameters())
    ]
    assert any(moved)  # the step did something: the comparison is not between two untouched copies
