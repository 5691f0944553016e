"""EmbeddingModel(forward_chunk_size=N): the whole batch as the pool, one chunk's activations at a time.

The reference for every gradient is the plain computation: the unchunked batch where the encoder is
deterministic and per-row (no dropout, no BatchNorm), and the same chunks run without recomputation
where the encoder has random state (dropout) or batch statistics (BatchNorm).
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn

from composer_dynsample import (
    EmbeddingModel,
    InfoNCELoss,
    MultiSimilarityLoss,
    TripletMarginLoss,
)
from composer_dynsample.mining import MultiSimilarityMiner, SemiHardMiner, build_miner
from composer_dynsample.validation import InputTypeError
from tests.models.helpers import DIM, fit_with_chunks, make_data, make_encoder, make_trainer

CASES = [
    ("semi_hard", TripletMarginLoss(margin=0.3)),
    ("batch_hard", TripletMarginLoss(margin=0.2)),
    ("multi_similarity", MultiSimilarityLoss()),
    ("batch_hard", InfoNCELoss(temperature=0.1)),
    ("multi_similarity", InfoNCELoss(temperature=0.1, negatives="mined", symmetric=True)),
]


def _grads(model: nn.Module) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return grads


def _step(model: EmbeddingModel, strategy: str, loss: nn.Module, features, labels) -> torch.Tensor:
    embeddings = model.embed(features)
    loss(embeddings, labels, build_miner(strategy)(embeddings.detach(), labels)).backward()
    return embeddings.detach()


@pytest.mark.parametrize("chunk", [7, 16])
@pytest.mark.parametrize(
    ("strategy", "loss"), CASES, ids=[f"{name}-{type(loss).__name__}" for name, loss in CASES]
)
def test_gradients_equal_the_unchunked_batch(strategy, loss, chunk):
    features, labels = make_data()
    model = EmbeddingModel(make_encoder())
    expected_embeddings = _step(model, strategy, loss, features, labels)
    expected = _grads(model)
    model.forward_chunk_size = chunk
    embeddings = _step(model, strategy, loss, features, labels)
    torch.testing.assert_close(embeddings, expected_embeddings)
    for grad, reference in zip(_grads(model), expected):
        torch.testing.assert_close(grad, reference)
    assert sum(g.abs().sum() for g in expected) > 0  # not a comparison of two zeros


def _saved_bytes(model: EmbeddingModel, features: torch.Tensor) -> int:
    """The bytes autograd keeps for the backward after one forward (what the backward will read)."""
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model.embed(features)
    return total


def test_the_forward_keeps_no_activations():
    features, _ = make_data(rows=256)
    wide = nn.Sequential(nn.Linear(DIM, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8))
    unchunked = _saved_bytes(EmbeddingModel(wide.double()), features)
    chunked = _saved_bytes(EmbeddingModel(wide, forward_chunk_size=32), features)
    assert unchunked > 256 * 512 * 8  # at least one 256 x 512 float64 activation
    # Only the chunks' inputs are kept (to recompute from): the batch's features, no activation.
    assert chunked == features.numel() * features.element_size()


def _chunks_without_recomputation(model: EmbeddingModel, features: torch.Tensor, chunk: int) -> torch.Tensor:
    return torch.cat([model._embed(part) for part in features.split(chunk)])


def test_dropout_masks_are_replayed_in_the_recomputation():
    features, labels = make_data()
    model = EmbeddingModel(make_encoder(nn.Dropout(0.5)), forward_chunk_size=10)
    loss = TripletMarginLoss(margin=0.3)
    torch.manual_seed(5)
    reference = _chunks_without_recomputation(model, features, 10)
    tuples = SemiHardMiner()(reference.detach(), labels)
    loss(reference, labels, tuples).backward()
    expected = _grads(model)
    torch.manual_seed(5)
    embeddings = model.embed(features)
    torch.testing.assert_close(embeddings, reference)
    loss(embeddings, labels, tuples).backward()
    for grad, want in zip(_grads(model), expected):
        torch.testing.assert_close(grad, want)
    # The masks matter: another seed gives other embeddings.
    torch.manual_seed(6)
    assert not torch.allclose(model.embed(features), reference)


def test_batchnorm_uses_chunk_statistics_and_counts_each_chunk_once():
    features, labels = make_data()
    reference_model = EmbeddingModel(make_encoder(nn.BatchNorm1d(16)))
    model = EmbeddingModel(make_encoder(nn.BatchNorm1d(16)), forward_chunk_size=16)
    loss = MultiSimilarityLoss()
    reference = _chunks_without_recomputation(reference_model, features, 16)
    loss(reference, labels, MultiSimilarityMiner()(reference.detach(), labels)).backward()
    embeddings = model.embed(features)
    torch.testing.assert_close(embeddings, reference)
    loss(embeddings, labels, MultiSimilarityMiner()(embeddings.detach(), labels)).backward()
    for grad, want in zip(_grads(model), _grads(reference_model)):
        torch.testing.assert_close(grad, want)
    norm, reference_norm = model.encoder[1], reference_model.encoder[1]
    assert int(norm.num_batches_tracked) == 3  # three chunks, each once: not again in the backward
    torch.testing.assert_close(norm.running_mean, reference_norm.running_mean)
    torch.testing.assert_close(norm.running_var, reference_norm.running_var)
    # Chunk statistics, not the batch's: the unchunked batch normalises differently.
    assert not torch.allclose(EmbeddingModel(make_encoder(nn.BatchNorm1d(16))).embed(features), reference)


class DictEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(DIM, 4).double(), nn.Linear(2, 4).double()

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.a(features["x"]) + self.b(features["y"])


def test_mapping_features_are_split_key_by_key():
    features, _ = make_data()
    batch = {"x": features, "y": features[:, :2] * 3}
    torch.manual_seed(0)
    model = EmbeddingModel(DictEncoder())
    expected = model.embed(batch)
    expected.sum().backward()
    grads = _grads(model)
    model.forward_chunk_size = 5
    embeddings = model.embed(batch)
    embeddings.sum().backward()
    torch.testing.assert_close(embeddings, expected)
    for grad, want in zip(_grads(model), grads):
        torch.testing.assert_close(grad, want)


def test_no_grad_embeds_chunk_by_chunk_without_checkpoints():
    features, _ = make_data()
    calls: list[int] = []
    model = EmbeddingModel(make_encoder(), forward_chunk_size=20)
    model.encoder.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    with torch.no_grad():
        embeddings = model.embed(features)
    assert calls == [16, 16, 16] and not embeddings.requires_grad  # ceil(48 / 20) = 3 equal chunks


def test_chunks_are_as_equal_as_possible_and_a_one_row_chunk_under_batchnorm_is_named():
    # Before, 10 rows in chunks of 3 left a last chunk of one row, on which BatchNorm raised in training.
    features, _ = make_data(rows=10)
    model = EmbeddingModel(make_encoder(nn.BatchNorm1d(16)), forward_chunk_size=3)
    calls: list[int] = []
    model.encoder.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    assert model.embed(features).shape == (10, 5) and calls == [3, 3, 2, 2]
    model.forward_chunk_size = 2  # 5 rows in chunks of at most 2: one chunk of a single row
    with pytest.raises(ValueError, match=r"forward_chunk_size=2 cuts this batch of 5 rows into 3 chunks"):
        model.embed(features[:5])
    model.eval()  # running statistics: one row is fine
    assert model.embed(features[:5]).shape == (5, 5)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "8", True])
def test_bad_chunk_sizes_are_named(bad):
    with pytest.raises((ValueError, TypeError), match="forward_chunk_size"):
        EmbeddingModel(nn.Linear(2, 2), forward_chunk_size=bad)


def test_features_that_cannot_be_split_are_named():
    model = EmbeddingModel(nn.Identity(), forward_chunk_size=2)
    with pytest.raises(
        InputTypeError, match=r"forward_chunk_size.*tensor or a mapping.*'x': tensor of shape"
    ):
        model.embed({"x": torch.zeros(4, 2), "y": torch.zeros(3, 2)})
    with pytest.raises(InputTypeError, match="got list"):
        model.embed([torch.zeros(4, 2)])


@pytest.mark.parametrize(
    ("strategy", "memory_size"), [("semi_hard", 0), ("semi_hard", 40), ("batch_hard", 40)]
)
def test_training_through_the_trainer_matches_the_unchunked_run(strategy, memory_size):
    expected = fit_with_chunks(None, strategy, memory_size)
    params = fit_with_chunks(12, strategy, memory_size)
    for param, want in zip(params, expected):
        torch.testing.assert_close(param, want)
    assert not torch.allclose(make_encoder()[0].weight, params[0])  # training moved the weights


def _fit_microbatched(chunk: int | None, microbatch: int) -> list[str]:
    """One epoch of 4 x 8 P x K batches with Composer's microbatches; the warnings it raised."""
    trainer, _ = make_trainer(
        chunk,
        "semi_hard",
        rows=64,
        lr=0.1,
        mining={},
        max_duration="1ep",
        device_train_microbatch_size=microbatch,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit()
    return [str(w.message) for w in caught if "HardNegativeMining" in str(w.message)]


@pytest.mark.parametrize(
    ("chunk", "advice"),
    [(None, "EmbeddingModel\\(forward_chunk_size=N\\)"), (8, "forward_chunk_size=8 already")],
)
def test_microbatches_smaller_than_the_device_batch_warn_once(chunk, advice):
    messages = _fit_microbatched(chunk, microbatch=16)
    assert len(messages) == 1
    assert "split the device batch of 32 rows into microbatches of 16" in messages[0]
    assert re.search(advice, messages[0])


def test_microbatches_at_the_device_batch_do_not_warn():
    assert _fit_microbatched(8, microbatch=32) == []
