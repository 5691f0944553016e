"""TextStore and TextCollate: the batch contract, padding, workers, and Composer's DataSpec."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

pytest.importorskip("tokenizers")

from composer_dynsample.data import IndexDataset
from composer_dynsample.data.text.data_spec import CountSampledRows, SplitTextBatch, text_data_spec
from composer_dynsample.data.text.pairs import load_pairs
from composer_dynsample.data.text.store import TextCollate, TextStore
from composer_dynsample.samplers import PKBatchSampler
from composer_dynsample.samplers.dataloader import build_dataloader


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text_store")
    rng = np.random.default_rng(0)
    words = ["sort", "list", "open", "file", "read", "json", "parse", "date", "time", "path"]
    rows = [
        {
            "anchor": " ".join(rng.choice(words, rng.integers(1, 12))) + f" q{i}",
            "positive": " ".join(rng.choice(words, rng.integers(1, 30))) + f" p{i}",
            "negative": f"unrelated text number {i}",
        }
        for i in range(120)
    ]
    file = folder / "pairs.jsonl"
    file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.warns(UserWarning, match="were truncated"):
        return load_pairs(file, max_length=12, vocab_size=100, cache_dir=folder / "cache")


def test_batch_contract(splits):
    store = splits.train
    batch = TextCollate(store)([0, 1, 2, 3])
    features = batch["features"]
    assert set(batch) == {"features", "labels", "index", "text_hash", "text_group"}
    assert set(features) == {"input_ids", "attention_mask", "is_query"}
    size = len(batch["index"])
    assert size == 6  # two pairs and the anchors' two given negatives
    assert features["input_ids"].dtype == torch.int64 and features["attention_mask"].dtype == torch.int64
    assert (
        features["input_ids"].shape == features["attention_mask"].shape
        and features["input_ids"].shape[0] == size
    )
    assert features["is_query"].dtype == torch.bool and features["is_query"].shape == (size,)
    for key in ("labels", "index", "text_hash"):
        assert batch[key].dtype == torch.int64 and batch[key].shape == (size,)
    lengths = store.tokens.lengths()[store.text_ids[batch["index"].numpy()]]
    assert features["input_ids"].shape[1] == lengths.max() <= 12  # the batch's longest row, not max_length
    assert features["attention_mask"].sum(1).tolist() == lengths.tolist()
    padded = features["input_ids"][features["attention_mask"] == 0]
    assert (padded == splits.info.pad_id).all()


def test_collate_checks_its_indices(splits):
    collate = TextCollate(splits.train)
    with pytest.raises(IndexError, match=r"outside \[0, 191\] for a store of 192 sampled rows"):
        collate([0, 192])  # 192 is the first given negative: never drawn by a sampler
    with pytest.raises(ValueError, match="empty batch"):
        collate([])
    with pytest.raises(TypeError, match="store must be a TextStore"):
        TextCollate(object())


def test_store_validates_its_layout(splits):
    tokens = splits.train.tokens
    with pytest.raises(ValueError, match="text_ids must index the"):
        TextStore(tokens, [len(tokens)], [0], pad_id=0, vocab_size=10)
    with pytest.raises(ValueError, match=r"negatives rows must be in \[num_sampled, 2\)"):
        TextStore(tokens, [0, 1], [0, 1], pad_id=0, vocab_size=10, num_sampled=1, negatives=([0, 1], [0]))
    with pytest.raises(ValueError, match="row_labels has 1 entries; expected 2"):
        TextStore(tokens, [0, 1], [0], pad_id=0, vocab_size=10)


def _batches(loader) -> list[dict]:
    return list(loader)


def test_workers_give_the_same_batches(splits, capfd):
    store = splits.train

    def loader(workers: int):
        sampler = PKBatchSampler(store.labels, classes_per_batch=8, samples_per_class=2, seed=3)
        return build_dataloader(
            IndexDataset(store.labels), sampler, collate_fn=TextCollate(store), num_workers=workers
        )

    serial, parallel = _batches(loader(0)), _batches(loader(2))
    assert len(serial) == len(parallel) == 96 // 8
    for one, two in zip(serial, parallel):
        assert torch.equal(one["index"], two["index"])
        assert torch.equal(one["features"]["input_ids"], two["features"]["input_ids"])
    assert "huggingface/tokenizers" not in capfd.readouterr().err  # workers never touch the tokenizer


def test_collate_pickles_small_for_spawned_workers(splits):
    collate = TextCollate(splits.train)
    data = pickle.dumps(collate)
    token_bytes = splits.train.tokens.num_tokens * 4
    assert len(data) < token_bytes + 200_000 and b"ids.npy" not in data  # the ids stay on disk
    copy = pickle.loads(data)
    assert torch.equal(copy([0, 1])["features"]["input_ids"], collate([0, 1])["features"]["input_ids"])


def test_counting_and_splitting_for_composer(splits):
    store = splits.train
    batch = TextCollate(store)([0, 1, 2, 3])
    assert CountSampledRows(len(store))(batch) == 4
    split = SplitTextBatch(len(store))
    assert split(batch, 4) == [batch]
    with pytest.raises(ValueError, match="cannot be split into microbatches of 2: it has 4 sampled rows"):
        split(batch, 2)
    plain = TextCollate(store, negatives=False)([0, 1, 2, 3])
    halves = split(plain, 2)
    assert [part["index"].tolist() for part in halves] == [[0, 1], [2, 3]]
    assert halves[1]["features"]["input_ids"].shape[0] == 2


def _on_device(batch: dict) -> dict:
    """The batch as Composer hands it to the step on an accelerator: meta tensors, which no read can reach."""
    return {"index": torch.empty(batch["index"].shape, dtype=torch.int64, device="meta")}


def test_the_count_of_a_batch_on_a_device_reads_nothing(splits):
    # Composer counts the device batch again inside every step: that read was the one a step made on CUDA.
    store = splits.train
    with_negatives = TextCollate(store)([0, 1, 2, 3])  # 4 sampled rows and their given negatives
    count = CountSampledRows(len(store), given_negatives=True)
    assert count(with_negatives) == 4 and count(_on_device(with_negatives)) == 4  # the host batch's count
    plain = TextCollate(store, negatives=False)([0, 1, 2])
    assert CountSampledRows(len(store), given_negatives=False)(_on_device(plain)) == 3  # its length
    with pytest.raises(RuntimeError, match="meta"):  # another length with given negatives is read
        count(_on_device(plain))
    spec = text_data_spec(torch.utils.data.DataLoader([0], collate_fn=TextCollate(store, negatives=False)))
    assert spec.get_num_samples_in_batch(_on_device(plain)) == 3
    assert (
        text_data_spec(
            torch.utils.data.DataLoader([0], collate_fn=TextCollate(store))
        ).get_num_samples_in_batch(with_negatives)
        == 4
    )


def test_text_data_spec_lets_composer_train(splits, tmp_path):
    from composer import Trainer
    from composer.models import ComposerModel

    class BagOfTokens(ComposerModel):
        def __init__(self, vocab_size: int) -> None:
            super().__init__()
            self.embedding = torch.nn.EmbeddingBag(vocab_size, 8, mode="sum")
            self.seen: list[int] = []

        def forward(self, batch):
            ids, mask = batch["features"]["input_ids"], batch["features"]["attention_mask"]
            self.seen.append(len(ids))
            return self.embedding(ids, per_sample_weights=mask.float())

        def loss(self, outputs, batch):
            return outputs.pow(2).mean()

    store = splits.train
    sampler = PKBatchSampler(store.labels, classes_per_batch=4, samples_per_class=2, seed=0)
    loader = build_dataloader(IndexDataset(store.labels), sampler, collate_fn=TextCollate(store))
    model = BagOfTokens(splits.info.vocab_size)
    with pytest.raises(ValueError, match="Unable to determine the batch size"):
        Trainer(
            model=model, train_dataloader=loader, max_duration="1ba", device="cpu", progress_bar=False
        ).fit()
    model.seen.clear()
    trainer = Trainer(
        model=model,
        train_dataloader=text_data_spec(loader),
        max_duration="3ba",
        device="cpu",
        progress_bar=False,
        log_to_console=False,
        save_folder=None,
    )
    trainer.fit()
    assert int(trainer.state.timestamp.sample) == 3 * 8  # sampled rows, given negatives not counted
    assert model.seen == [8 + 4] * 3  # each batch whole: 8 sampled rows and the 4 anchors' negatives
    with pytest.raises(TypeError, match="needs a DataLoader whose collate_fn is a TextCollate"):
        text_data_spec(torch.utils.data.DataLoader([1, 2]))


def test_given_negatives_serve_as_negatives_of_the_losses(splits):
    """A negative's label matches no row: losses treat it as a negative of every anchor, never an anchor."""
    from composer_dynsample.losses import InfoNCELoss, TripletMarginLoss

    batch = TextCollate(splits.train)([0, 1, 2, 3, 4, 5])
    labels = batch["labels"]
    negatives = batch["index"] >= len(splits.train)
    assert negatives.sum() == 3 and not (labels[negatives, None] == labels[None, :]).sum(1).gt(1).any()
    torch.manual_seed(0)
    embeddings = torch.nn.functional.normalize(torch.randn(len(labels), 16), dim=1).requires_grad_()
    for loss_fn in (InfoNCELoss(), TripletMarginLoss(margin=0.2)):
        loss = loss_fn(embeddings, labels)
        (gradient,) = torch.autograd.grad(loss, embeddings)
        assert torch.isfinite(loss) and torch.isfinite(gradient).all()
        assert gradient[negatives].abs().sum() > 0  # pushed away from the anchors
