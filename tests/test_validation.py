"""check_pool: the one check of a batch and its optional pool that the losses, miners and metrics share."""

import pytest
import torch

from composer_dynsample.validation import InputTypeError, check_pool

NAMES = ("embeddings", "labels", "ref_emb", "ref_labels")
BATCH = (torch.randn(3, 2), torch.tensor([0, 0, 1]))


def test_no_pool_and_a_valid_pool():
    assert check_pool(BATCH, (None, None), NAMES) is None
    pool = (torch.randn(5, 2), torch.arange(5))
    checked = check_pool(BATCH, pool, NAMES)
    assert checked[0] is pool[0] and checked[1] is pool[1]


@pytest.mark.parametrize(
    ("pool", "error", "message"),
    [
        ((torch.randn(5, 2), None), ValueError, "ref_emb and ref_labels must be given together: ref_emb was"),
        ((None, torch.arange(5)), ValueError, "together: ref_labels was given without ref_emb"),
        ((torch.randn(5, 4), torch.arange(5)), ValueError, "ref_emb has dimension 4 but embeddings 2"),
        ((torch.randn(5, 2), torch.arange(4)), ValueError, "ref_labels has 4 entries but ref_emb has 5 rows"),
        ((torch.randn(5, 2), torch.rand(5)), InputTypeError, "ref_labels must be a 1-D integer tensor"),
        ((torch.arange(10).view(5, 2), torch.arange(5)), InputTypeError, "ref_emb must be a 2-D floating"),
    ],
)
def test_bad_pool_names_the_argument(pool, error, message):
    with pytest.raises(error, match=message):
        check_pool(BATCH, pool, NAMES)


def test_the_batch_is_checked_first_and_finiteness_is_optional():
    with pytest.raises(ValueError, match="labels has 2 entries but embeddings has 3 rows"):
        check_pool((BATCH[0], torch.tensor([0, 1])), (None, None), NAMES)
    bad = torch.tensor([[0.0, float("nan")]] * 5)
    with pytest.raises(ValueError, match="ref_emb contain NaN or inf"):
        check_pool(BATCH, (bad, torch.arange(5)), NAMES)
    assert check_pool(BATCH, (bad, torch.arange(5)), NAMES, finite=False) is not None
