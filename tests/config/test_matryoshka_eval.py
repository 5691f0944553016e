"""The evaluation at each Matryoshka dimension equals the metrics computed by hand on the embeddings truncated
and L2-normalised again, for text pairs (queries vs passages) and a train gallery; without dimensions the
result is as before."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.nn.functional as F

from composer_dynsample.config import ConfigError, build_run, load_config
from composer_dynsample.config.evaluation import final_metrics, gallery_rows, query_rows
from composer_dynsample.metrics import ranking_metrics, retrieval_metrics
from composer_dynsample.models.embed import embed_store, store_labels
from tests.config.helpers import pairs_config
from tests.data.text.helpers import pair_rows, write_jsonl

DIGITS = Path(__file__).resolve().parents[2] / "yamls" / "digits_quick.yaml"
QUIET = ["trainer.progress_bar=false", "evaluation.interval=null"]

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _cut(embeddings, dim):
    return F.normalize(embeddings[:, :dim], dim=-1)


def test_pairs_at_each_dimension_equal_the_ranking_metrics_of_the_cut_embeddings(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", pair_rows(40, seed=0))
    write_jsonl(tmp_path / "test.jsonl", pair_rows(16, seed=1))
    config = pairs_config(tmp_path / "train.jsonl", tmp_path / "cache", trainer={"max_duration": "1ba"})
    config["data"]["test_path"] = str(tmp_path / "test.jsonl")
    run = build_run(load_config(config, QUIET), tmp_path / "run")
    splits, model = run.splits, run.trainer.state.model
    plain, _ = final_metrics(model, splits, [1, 5], "cosine")
    result, _ = final_metrics(model, splits, [1, 5], "cosine", dims=(16, 8, 4))
    assert "matryoshka" not in plain
    assert {key: value for key, value in result.items() if key != "matryoshka"} == plain
    assert list(result["matryoshka"]) == ["8", "4"]  # 16 is the full width: the top-level result
    queries = embed_store(model, splits.test, rows=query_rows(splits))
    passages = embed_store(model, splits.test, rows=gallery_rows(splits))
    labels, passage_labels = (
        store_labels(splits.test, query_rows(splits)),
        store_labels(splits.test, gallery_rows(splits)),
    )
    for dim in (8, 4):
        by_hand = ranking_metrics(
            _cut(queries, dim), labels, _cut(passages, dim), passage_labels,
            distance="cosine", recall_ks=[1, 5], mrr_ks=(10,), ndcg_ks=(10,),
        )  # fmt: skip
        got = result["matryoshka"][str(dim)]
        assert set(got) == {"mrr", "mrr_at_10", "recall_at_1", "recall_at_5", "ndcg_at_10", "csn_mrr"}
        for name, value in got.items():
            assert value == pytest.approx(by_hand[name.replace("_at_", "@")], abs=1e-6), (dim, name)
    assert result["matryoshka"]["4"]["mrr"] != pytest.approx(result["mrr"], abs=1e-6)


def test_a_train_gallery_at_each_dimension_equals_the_retrieval_metrics_of_the_cut_embeddings(tmp_path):
    run = build_run(load_config(DIGITS, [*QUIET, "trainer.max_duration=1ba"]), tmp_path / "run")
    splits, model = run.splits, run.trainer.state.model
    result, queries = final_metrics(model, splits, [1, 5], "euclidean", dims=(16, 4))
    gallery = embed_store(model, splits.train)
    labels, gallery_labels = store_labels(splits.test), store_labels(splits.train)
    for dim in (16, 4):
        by_hand = retrieval_metrics(
            _cut(queries, dim), labels, _cut(gallery, dim), gallery_labels, ks=(1, 5), distance="euclidean"
        )
        got = result["matryoshka"][str(dim)]
        assert set(got) == {"recall_at_1", "recall_at_5", "map_at_r", "r_precision"}
        for name, value in got.items():
            assert value == pytest.approx(float(by_hand[name]), abs=1e-6), (dim, name)
    with pytest.raises(ConfigError, match=r"^matryoshka_dims: 64 is wider than the 32 dimensions"):
        final_metrics(model, splits, [1], "cosine", dims=(64, 8))
