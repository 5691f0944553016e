"""The cross-rank agreement check and its hash, on one process (the 2-rank cases are in
test_rank_agreement_two_ranks.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from composer_dynsample.distributed import RankMismatchError, check_ranks_agree, stable_hash


def test_stable_hash_is_a_63_bit_hash_of_the_value_and_its_type():
    assert stable_hash("abc") == stable_hash("abc") and 0 <= stable_hash("abc") < 2**63
    assert stable_hash(np.arange(4)) == stable_hash(torch.arange(4))
    assert stable_hash(np.arange(4)) != stable_hash(np.arange(4, dtype=np.int32))
    assert stable_hash(np.arange(4)) != stable_hash(np.arange(4).reshape(2, 2))
    assert stable_hash(1) != stable_hash("1") != stable_hash(1.0)
    assert stable_hash(["ab", "c"]) != stable_hash(["a", "bc"])
    assert stable_hash(("a", np.arange(2))) == stable_hash(["a", torch.arange(2)])


def test_stable_hash_refuses_what_it_cannot_hash_reproducibly():
    with pytest.raises(TypeError, match=r"stable_hash takes .* got a dict"):
        stable_hash({"a": 1})


def test_on_one_rank_the_check_passes_and_a_local_error_raises_as_is():
    check_ranks_agree({"seed": 0, "plan": "abc"}, subject="demo", advice="")
    with pytest.raises(ValueError, match=r"^broken here$"):
        check_ranks_agree({"seed": 0}, subject="demo", advice="", local_error="broken here", error=ValueError)
    assert issubclass(RankMismatchError, ValueError) and issubclass(RankMismatchError, RuntimeError)
