"""MatryoshkaLoss: sentence-transformers' MatryoshkaLoss around MultipleNegativesRankingLoss for InfoNCE on
query/passage pairs (loss and gradient), a brute-force sum of the inner loss at each truncation for the tuple
losses (the mined tuple reused, the pool truncated too), through EmbeddingModel (GradCache chunks included),
and its one-line refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from composer_dynsample import EmbeddingModel, InfoNCELoss, MatryoshkaLoss, TripletMarginLoss
from composer_dynsample.losses import ContrastiveLoss
from composer_dynsample.mining import BatchHardMiner
from composer_dynsample.mining.mined_batch import MinedBatch
from tests.losses.test_infonce_passages import _pairs

st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")


class _Columns(torch.nn.Module):
    """A stand-in for a SentenceTransformer: a column's ``{"emb": tensor}`` is its sentence embedding."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width

    def get_embedding_dimension(self) -> int:
        return self.width

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"sentence_embedding": features["emb"]}


def _st_matryoshka(columns: list[torch.Tensor], dims: list[int], weights: list[float] | None) -> torch.Tensor:
    model = _Columns(columns[0].shape[1])
    inner = st_losses.MultipleNegativesRankingLoss(model=model, scale=20.0)
    loss = st_losses.MatryoshkaLoss(model, inner, dims, matryoshka_weights=weights)
    return loss([{"emb": column} for column in columns], None)


def _unit(rows: int, dim: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(rows, dim, generator=generator, dtype=torch.float64))


@pytest.mark.parametrize(
    ("dims", "weights", "negatives"),
    [([8, 4, 2], [1.0, 0.5, 0.25], 0), ([8, 6, 3], None, 3), ([6, 3], [2.0, 1.0], 0)],
)
def test_infonce_on_pairs_equals_sentence_transformers_matryoshka_mnrl_and_its_gradient(
    dims, weights, negatives
):
    embeddings, labels, is_query, _, _, _ = _pairs(6, negatives=negatives)
    inner = InfoNCELoss(temperature=0.05, negatives="passages")
    ours = MatryoshkaLoss(inner, dims, weights)(embeddings, labels, is_query=is_query)
    (grad,) = torch.autograd.grad(ours, embeddings)
    leaf = embeddings.detach().clone().requires_grad_()
    columns = [leaf[:12:2], leaf[1:12:2], *([leaf[12:]] if negatives else [])]
    theirs = _st_matryoshka(columns, dims, weights)
    theirs.backward()
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-9, atol=1e-10)


def test_the_weights_multiply_and_are_not_renormalised():
    embeddings, labels, is_query, _, _, _ = _pairs(5)
    inner = InfoNCELoss(temperature=0.05, negatives="passages")
    one = MatryoshkaLoss(inner, [8, 4])(embeddings, labels, is_query=is_query)
    at = [inner(F.normalize(embeddings[:, :dim]), labels, is_query=is_query) for dim in (8, 4)]
    torch.testing.assert_close(one, at[0] + at[1])
    doubled = MatryoshkaLoss(inner, [8, 4], [2, 2])(embeddings, labels, is_query=is_query)
    torch.testing.assert_close(doubled, 2 * one)


def _brute_force(inner, dims, weights, embeddings, labels, tuples, ref=None, ref_labels=None, **extra):
    total = 0.0
    for dim, weight in zip(dims, weights):
        pool = None if ref is None else F.normalize(ref[:, :dim])
        total = total + weight * inner(
            F.normalize(embeddings[:, :dim]), labels, tuples, pool, ref_labels, **extra
        )
    return total


@pytest.mark.parametrize("with_pool", [False, True])
def test_a_tuple_loss_is_the_sum_at_each_truncation_of_the_tuple_mined_on_the_full_width(with_pool):
    embeddings = _unit(12, 16, seed=1).requires_grad_()
    labels = torch.arange(6).repeat_interleave(2)
    ref = _unit(10, 16, seed=2).requires_grad_() if with_pool else None
    ref_labels = torch.arange(10) % 6 if with_pool else None
    tuples = BatchHardMiner()(embeddings.detach(), labels, None if ref is None else ref.detach(), ref_labels)
    dims, weights = (16, 8, 4), (1.0, 0.7, 0.3)
    inner = TripletMarginLoss(margin=0.3)
    ours = MatryoshkaLoss(inner, dims, weights)(embeddings, labels, tuples, ref, ref_labels)
    expected = _brute_force(inner, dims, weights, embeddings, labels, tuples, ref, ref_labels)
    torch.testing.assert_close(ours, expected)
    inputs = [embeddings] if ref is None else [embeddings, ref]
    for got, want in zip(torch.autograd.grad(ours, inputs), torch.autograd.grad(expected, inputs)):
        torch.testing.assert_close(got, want)


def test_the_model_passes_the_mined_batch_duplicate_ids_and_query_flags_through_the_wrapper():
    embeddings = _unit(8, 8, seed=3).requires_grad_()
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    ids = torch.tensor([10, 11, 12, 11, 13, 14, 15, 16])  # row 3 repeats row 1 under another label
    tuples = BatchHardMiner()(embeddings.detach(), labels)
    inner = InfoNCELoss(temperature=0.1)
    model = EmbeddingModel(torch.nn.Identity(), loss=MatryoshkaLoss(inner, [8, 4], [1.0, 0.5]))
    mined = MinedBatch(embeddings, labels, tuples, duplicate_ids=ids)
    got = model.loss(mined, {"features": embeddings, "labels": labels})
    expected = _brute_force(inner, (8, 4), (1.0, 0.5), embeddings, labels, tuples, duplicate_ids=ids)
    torch.testing.assert_close(got, expected)
    assert not torch.isclose(got, _brute_force(inner, (8, 4), (1.0, 0.5), embeddings, labels, tuples))
    # Pairs: the model hands the text batch's is_query to the inner InfoNCE(negatives="passages").
    pairs, pair_labels, is_query, _, _, _ = _pairs(4)
    passages = InfoNCELoss(temperature=0.05, negatives="passages")
    model = EmbeddingModel(torch.nn.Identity(), loss=MatryoshkaLoss(passages, [8, 4]))
    batch = {"features": {"input_ids": torch.zeros(8, 2), "is_query": is_query}, "labels": pair_labels}
    expected = _brute_force(passages, (8, 4), (1, 1), pairs, pair_labels, None, is_query=is_query)
    torch.testing.assert_close(model.loss(pairs, batch), expected)


def test_a_loss_without_the_model_s_keywords_gets_none_of_them():
    calls = []

    class Plain(torch.nn.Module):  # pytorch-metric-learning's signature: no global_mean, no ids
        def forward(self, embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None):
            calls.append(embeddings.shape[1])
            return embeddings.sum() * 0.0

    embeddings, labels = _unit(4, 6, seed=4), torch.tensor([0, 0, 1, 1])
    mined = MinedBatch(embeddings, labels, BatchHardMiner()(embeddings, labels), global_mean=True)
    EmbeddingModel(torch.nn.Identity(), loss=MatryoshkaLoss(Plain(), [6, 3])).loss(mined, None)
    assert calls == [6, 3]


def test_gradcache_chunks_give_the_unchunked_gradient():
    torch.manual_seed(0)
    encoder = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8)).double()
    features = torch.randn(12, 5, dtype=torch.float64)
    batch = {"features": features, "labels": torch.arange(6).repeat_interleave(2)}
    grads = []
    for chunk in (None, 5):
        model = EmbeddingModel(
            encoder, loss=MatryoshkaLoss(InfoNCELoss(temperature=0.1), [8, 4, 2]), forward_chunk_size=chunk
        )
        encoder.zero_grad()
        model.loss(model(batch), batch).backward()
        grads.append([parameter.grad.clone() for parameter in encoder.parameters()])
    for chunked, whole in zip(grads[1], grads[0]):
        torch.testing.assert_close(chunked, whole)


def test_every_inner_loss_is_wrapped_and_the_repr_names_the_dimensions():
    embeddings, labels = _unit(8, 8, seed=5), torch.arange(4).repeat_interleave(2)
    for inner in (ContrastiveLoss(), TripletMarginLoss(), InfoNCELoss(symmetric=True)):
        wrapped = MatryoshkaLoss(inner, [8, 2])
        torch.testing.assert_close(
            wrapped(embeddings, labels), _brute_force(inner, (8, 2), (1, 1), embeddings, labels, None)
        )
    assert "matryoshka_dims=[8, 2], matryoshka_weights=[1.0, 1.0]" in repr(
        MatryoshkaLoss(TripletMarginLoss(), [8, 2])
    )
    assert MatryoshkaLoss(InfoNCELoss(negatives="passages"), [4]).negatives == "passages"


@pytest.mark.parametrize(
    ("dims", "weights", "match"),
    [
        ([], None, r"^matryoshka_dims must be a non-empty list of dimensions"),
        ([8, 0], None, r"^matryoshka_dims must hold integers >= 1, got \[8, 0\]\.$"),
        ([8, 4.5], None, r"^matryoshka_dims must hold integers >= 1"),
        (
            [4, 8],
            None,
            r"^matryoshka_dims must be strictly descending \(the full width first\), got \[4, 8\]\.$",
        ),
        ([8, 8], None, r"strictly descending"),
        ([8, 4], [1.0], r"^matryoshka_weights must hold one weight per dimension of matryoshka_dims \(2\)"),
        ([8, 4], [1.0, 0.0], r"^matryoshka_weights must be finite numbers > 0, got \[1\.0, 0\.0\]\.$"),
        ([8, 4], [1.0, float("nan")], r"finite numbers > 0"),
    ],
)
def test_bad_dimensions_and_weights_are_one_line(dims, weights, match):
    with pytest.raises(ValueError, match=match) as error:
        MatryoshkaLoss(TripletMarginLoss(), dims, weights)
    assert len(str(error.value).splitlines()) == 1


def test_a_dimension_wider_than_the_embeddings_is_one_line():
    loss = MatryoshkaLoss(TripletMarginLoss(), [16, 8])
    embeddings, labels = _unit(4, 8, seed=6), torch.tensor([0, 0, 1, 1])
    with pytest.raises(
        ValueError, match=r"^matryoshka_dims: 16 is wider than the 8 dimensions of embeddings"
    ):
        loss(embeddings, labels)
    with pytest.raises(TypeError, match=r"loss must be a torch\.nn\.Module"):
        MatryoshkaLoss("triplet", [8])  # type: ignore[arg-type]
