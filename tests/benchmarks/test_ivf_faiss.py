"""``benchmarks/ivf_faiss.py --quick``: both indexes searched at equal recall, the ratio written."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.quick_runs import run_quick

pytest.importorskip("faiss")


def test_the_quick_run_compares_faiss_with_the_own_index_at_equal_recall(tmp_path):
    run_quick("ivf_faiss", tmp_path, timeout=300)
    result = json.loads((tmp_path / "ivf_faiss_quick.json").read_text())
    own, theirs, as_own = result["rows"]
    assert (
        own["index"].startswith("own")
        and theirs["index"].startswith("faiss")
        and "as the own" in as_own["index"]
    )
    for faiss_row in (theirs, as_own):  # faiss's nprobe is the fewest reaching the own index's recall
        assert faiss_row["recall"] >= own["recall"] >= 0.9
    assert result["ratio"] == pytest.approx(theirs["total_s"] / own["total_s"], rel=0.01)
    assert result["ratio_own_kmeans"] == pytest.approx(as_own["total_s"] / own["total_s"], rel=0.01)
    assert own["same_lists_1_and_2_threads"] is True  # the sampler's lists do not depend on the threads
    assert "faiss / own" in (tmp_path / "ivf_faiss_quick.md").read_text()
