"""InfoNCELoss(negatives="passages") is sentence-transformers' MultipleNegativesRankingLoss on query/passage pairs.

``negatives="pool"`` on pairs as classes of two is NT-Xent: passages are anchors too, and a query's negatives
include the other queries. MNRL scores each query against the passages only, in one direction.
"""

from __future__ import annotations

import pytest
import torch

from composer_dynsample import EmbeddingModel, InfoNCELoss
from composer_dynsample.mining import BatchHardMiner

st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")


def _pairs(pairs: int, dim: int = 8, seed: int = 0, negatives: int = 0):
    """Unit rows interleaved as the text batches hold them (query, passage, query, passage, ...), then the
    given negative passages: ``(embeddings, labels, is_query, queries, passages, hard)``."""
    generator = torch.Generator().manual_seed(seed)
    queries = torch.nn.functional.normalize(torch.randn(pairs, dim, generator=generator, dtype=torch.float64))
    passages = torch.nn.functional.normalize(queries + 0.8 * torch.randn(pairs, dim, generator=generator))
    hard = torch.nn.functional.normalize(
        torch.randn(negatives, dim, generator=generator, dtype=torch.float64)
    )
    embeddings = torch.cat([torch.stack([queries, passages], 1).reshape(2 * pairs, dim), hard])
    labels = torch.cat([torch.arange(pairs).repeat_interleave(2), pairs + torch.arange(negatives)])
    is_query = torch.cat([torch.arange(2 * pairs) % 2 == 0, torch.zeros(negatives, dtype=torch.bool)])
    return embeddings.requires_grad_(), labels, is_query, queries, passages, hard


def _mnrl(*columns: torch.Tensor) -> torch.Tensor:
    return st_losses.MultipleNegativesRankingLoss(model=None, scale=20.0).compute_loss_from_embeddings(
        list(columns), None
    )


@pytest.mark.parametrize("negatives", [0, 3])
def test_it_equals_sentence_transformers_mnrl_and_its_gradient(negatives):
    embeddings, labels, is_query, _, _, _ = _pairs(6, negatives=negatives)
    ours = InfoNCELoss(temperature=0.05, negatives="passages")(embeddings, labels, is_query=is_query)
    (grad,) = torch.autograd.grad(ours, embeddings)
    leaf = embeddings.detach().clone().requires_grad_()
    queries, passages, hard = leaf[:12:2], leaf[1:12:2], leaf[12:]
    # MNRL's candidates: every passage, then the given negatives (each query's, shared by the batch).
    theirs = _mnrl(queries, passages, hard) if negatives else _mnrl(queries, passages)
    theirs.backward()
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("negatives", [0, 3])
def test_symmetric_equals_sentence_transformers_mnsrl_and_its_gradient(negatives):
    """``symmetric=True`` adds each passage against the batch's queries: MultipleNegativesSymmetricRankingLoss
    (a given negative passage is scored only as a query's candidate, never against the queries)."""
    embeddings, labels, is_query, _, _, _ = _pairs(6, negatives=negatives, seed=1)
    loss = InfoNCELoss(temperature=0.05, negatives="passages", symmetric=True)
    ours = loss(embeddings, labels, is_query=is_query)
    (grad,) = torch.autograd.grad(ours, embeddings)
    leaf = embeddings.detach().clone().requires_grad_()
    columns = [leaf[:12:2], leaf[1:12:2], *([leaf[12:]] if negatives else [])]
    mnsrl = st_losses.MultipleNegativesSymmetricRankingLoss(model=None, scale=20.0)
    theirs = mnsrl.compute_loss_from_embeddings(columns, None)
    theirs.backward()
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-9, atol=1e-10)
    assert not torch.isclose(
        ours, InfoNCELoss(temperature=0.05, negatives="passages")(embeddings, labels, is_query=is_query)
    )


def test_pool_is_nt_xent_there_and_differs():
    embeddings, labels, is_query, _, _, _ = _pairs(6)
    pool = InfoNCELoss(temperature=0.05)(embeddings, labels)
    passages = InfoNCELoss(temperature=0.05, negatives="passages")(embeddings, labels, is_query=is_query)
    assert not torch.isclose(pool, passages)


def test_mined_positives_give_the_same_loss():
    # Under HardNegativeMining the tuples name the positives: a pair's other row, as every same-label row.
    embeddings, labels, is_query, _, _, _ = _pairs(6)
    tuples = BatchHardMiner()(embeddings.detach(), labels)
    loss = InfoNCELoss(temperature=0.05, negatives="passages")
    torch.testing.assert_close(
        loss(embeddings, labels, tuples, is_query=is_query), loss(embeddings, labels, is_query=is_query)
    )


def test_without_query_flags_or_with_a_pool_beyond_the_batch_it_says_so():
    embeddings, labels, is_query, _, _, _ = _pairs(3)
    loss = InfoNCELoss(negatives="passages")
    with pytest.raises(ValueError, match=r"needs is_query=, a \(B,\) bool tensor .* got none"):
        loss(embeddings, labels)
    with pytest.raises(ValueError, match=r"a pool beyond the batch .* use negatives='pool'"):
        loss(embeddings, labels, ref_emb=embeddings, ref_labels=labels, is_query=is_query)


def test_the_model_passes_the_text_batch_s_query_flags():
    embeddings, labels, is_query, _, _, _ = _pairs(4)
    model = EmbeddingModel(torch.nn.Identity(), loss=InfoNCELoss(temperature=0.05, negatives="passages"))
    batch = {"features": {"input_ids": torch.zeros(8, 2), "is_query": is_query}, "labels": labels}
    expected = InfoNCELoss(temperature=0.05, negatives="passages")(embeddings, labels, is_query=is_query)
    torch.testing.assert_close(model.loss(embeddings, batch), expected)
