"""Text configs: the loaders and encoders by name, vocab_size from the tokenizer, the run's tokenizer,
two towers, the pairs' evaluation protocol, and one-line errors for text and image mix-ups."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tokenizers")

from composer_dynsample.callbacks.retrieval_gallery import RetrievalGallery
from composer_dynsample.config import ConfigError, build_run, load_config
from composer_dynsample.config.checks import check_config
from composer_dynsample.config.evaluation import final_metrics, gallery_rows, query_rows
from composer_dynsample.config.names import DATASETS, ENCODERS
from composer_dynsample.config.run_tokenizer import run_tokenizer, write_run_tokenizer
from composer_dynsample.data import TextCollate
from composer_dynsample.metrics import RankingScore, RetrievalRecallAtK
from composer_dynsample.models.text import BagOfTokensEncoder, TextCNNEncoder, TwoTowerEncoder
from tests.config.helpers import pairs_config
from tests.data.text.helpers import write_pairs, write_texts

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text_config")
    return {
        "pairs": write_pairs(folder / "pairs.jsonl", 60),
        "texts": write_texts(folder / "texts.csv", labels=12, per_label=4),
        "cache": folder / "cache",
    }


def build(tmp_path, files, *overrides, **sections):
    config = pairs_config(files["pairs"], files["cache"], **sections)
    return build_run(load_config(config, list(overrides)), tmp_path)


def test_the_registries_name_the_text_loaders_and_encoders():
    assert {"pairs", "texts", "code_search"} <= set(DATASETS)
    assert {"transformer", "bag_of_tokens", "text_cnn", "two_tower"} <= set(ENCODERS)


def test_pairs_build_a_text_run_scored_queries_against_passages(tmp_path, data):
    run = build(tmp_path / "run", data, "dataloader.num_workers=1")
    splits = run.splits
    assert isinstance(run.model.encoder, BagOfTokensEncoder)
    assert run.model.encoder.vocab_size == splits.info.vocab_size
    assert isinstance(run.train_dataloader.collate_fn, TextCollate)
    assert sorted(run.model.eval_metrics) == sorted(
        ["mrr", "mrr_at_10", "recall_at_1", "recall_at_5", "ndcg_at_10", "csn_mrr"]
    )
    assert all(isinstance(metric, RankingScore) for metric in run.model.eval_metrics.values())
    assert isinstance(run.gallery, RetrievalGallery) and run.gallery.gallery is splits.test
    assert run.gallery.rows.tolist() == gallery_rows(splits).tolist() == list(range(1, len(splits.test), 2))
    assert query_rows(splits).tolist() == list(range(0, len(splits.test), 2))
    run.trainer.fit()  # two batches through a worker process, and an evaluation
    assert int(run.trainer.state.timestamp.batch) == 2
    assert torch.isfinite(run.trainer.state.loss).all()
    result, embeddings = final_metrics(run.model, splits, [1, 5], "cosine")
    assert result["num_queries"] == len(splits.test) // 2 == embeddings.shape[0]
    assert 0 < result["mrr"] <= 1 and result["recall_at_1"] <= result["recall_at_5"]


def test_labelled_texts_are_scored_leave_one_out(tmp_path, data):
    run = build(
        tmp_path / "run",
        data,
        "evaluation.ks=[1]",
        data={
            "name": "texts",
            "path": str(data["texts"]),
            "vocab_size": 100,
            "cache_dir": str(data["cache"]),
        },
        model={"encoder": {"name": "text_cnn", "token_dim": 8, "channels": 8}},
    )
    assert isinstance(run.model.encoder, TextCNNEncoder) and run.gallery is None and run.leave_one_out
    assert isinstance(run.model.eval_metrics["recall_at_1"], RetrievalRecallAtK)
    assert run.splits.class_names[0] == "intent_0"
    run.trainer.fit()
    assert int(run.trainer.state.timestamp.batch) == 2


def test_two_towers_are_encoder_sections_of_their_own(tmp_path, data):
    towers = {
        "name": "two_tower",
        "query_encoder": {"name": "bag_of_tokens", "token_dim": 8},
        "passage_encoder": {"name": "text_cnn", "token_dim": 8, "channels": 8},
    }
    run = build(tmp_path / "run", data, model={"encoder": towers})
    encoder = run.model.encoder
    assert isinstance(encoder, TwoTowerEncoder)
    assert (
        encoder.query_encoder.vocab_size == encoder.passage_encoder.vocab_size == run.splits.info.vocab_size
    )
    run.trainer.fit()
    assert int(run.trainer.state.timestamp.batch) == 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["model.encoder={name: mlp}"],
            r"model.encoder: 'mlp' reads feature tensors, but data 'pairs' holds texts",
        ),
        (
            ["data={name: digits}"],
            r"model.encoder: 'bag_of_tokens' reads token ids, but data 'digits' holds feature",
        ),
        (
            ["evaluation.ks=[12]"],
            r"Recall@12 needs more than 12 gallery items, but the gallery holds 12 \(the test passages\)",
        ),
        (["data.max_length=1"], r"^data: max_length must be an integer >= 2, got 1\.$"),
    ],
)
def test_text_and_image_mix_ups_are_one_line(tmp_path, data, overrides, message):
    with pytest.raises(ConfigError, match=message):
        build(tmp_path / "run", data, *overrides)


@pytest.mark.parametrize(
    ("tower", "message"),
    [
        ("3", r"model.encoder.query_encoder must be an encoder section"),
        (
            "{name: bag_of_tokens, tokn_dim: 4}",
            r"model.encoder.query_encoder: unknown key 'tokn_dim'.*'token_dim'",
        ),
    ],
)
def test_tower_sections_are_checked_before_data_is_loaded(data, tower, message):
    towers = f"model.encoder={{name: two_tower, query_encoder: {tower}, passage_encoder: {{name: text_cnn}}}}"
    cfg = load_config(
        pairs_config(data["pairs"], data["cache"], data={"name": "pairs", "path": "/no/such"}), [towers]
    )
    with pytest.raises(ConfigError, match=message):
        check_config(cfg)


def test_a_run_reads_back_the_tokenizer_of_the_run_it_continues(tmp_path, data):
    first = build(tmp_path / "first", data)
    written = write_run_tokenizer(first.splits, tmp_path / "first")
    assert written == tmp_path / "first" / "tokenizer.json"
    assert written.read_bytes() == first.splits.info.tokenizer_path.read_bytes()
    # A checkpoint of that run (trainer.load_path) or the run directory itself (autoresume) name it.
    checkpoint = {"trainer": {"load_path": str(tmp_path / "first" / "checkpoints" / "ep1.pt")}}
    assert run_tokenizer(checkpoint) == written
    assert run_tokenizer({"run_dir": str(tmp_path / "first")}) == written
    assert run_tokenizer({"run_dir": str(tmp_path / "fresh")}) is None
    # The loader gets it instead of training one: a tokenizer trained on other texts would differ.
    again = build(tmp_path / "first", data, "data.vocab_size=150")
    assert again.splits.info.tokenizer_path == written
    assert again.splits.info.vocab_size == first.splits.info.vocab_size


class BadData(ValueError):
    """A loader's own error class, as TokenCacheError is."""


def bad_loader(path: str) -> None:
    raise BadData(f"{path}: line 3, column 'anchor': the text is empty.")


def test_a_loaders_value_errors_are_its_own_line_after_data(data):
    cfg = load_config(
        pairs_config(data["pairs"], data["cache"]),
        ["data={_component_: tests.config.test_text.bad_loader, path: p.jsonl}"],
    )
    with pytest.raises(ConfigError) as error:
        build_run(cfg, data["cache"] / "unused")
    assert str(error.value) == "data: p.jsonl: line 3, column 'anchor': the text is empty."


def _batch_rows(encoder) -> list[int]:
    """Record the rows of every forward pass of ``encoder``."""
    seen: list[int] = []
    encoder.register_forward_hook(lambda module, args, out: seen.append(out.shape[0]))
    return seen


def test_the_final_evaluation_embeds_in_the_evaluation_batch_sizes(tmp_path, data):
    """The evaluation after training, ``eval`` and ``evaluation.at_start`` hold at most ``batch_size``
    queries and ``gallery_batch_size`` passages in a forward pass (they once embedded 1,024 at a time,
    whatever the config said: 3 GB of transformer activations on 1,000 code passages), with the scores of
    one whole batch."""
    from composer_dynsample.cli.training import evaluate_run

    run = build(tmp_path / "run", data, "evaluation.batch_size=3", "evaluation.gallery_batch_size=5")
    assert run.batch_sizes == (3, 5)
    seen = _batch_rows(run.model.encoder)
    result, embeddings = evaluate_run(run)
    queries = embeddings.shape[0]
    assert max(seen) == 5 and 3 in seen and sum(seen) == 2 * queries, seen
    whole, _ = final_metrics(
        run.model, run.splits, [1, 5], "cosine", batch_size=10**4, gallery_batch_size=10**4
    )
    assert result == pytest.approx(whole, abs=1e-6)


def test_an_embedding_table_encodes_in_the_gallery_batch_size_unless_told(tmp_path, data):
    from composer_dynsample.algorithms import EmbeddingTable

    def table(*overrides):
        run = build(tmp_path / "run", data, "evaluation.gallery_batch_size=7", *overrides)
        (found,) = [a for a in run.trainer.state.algorithms if isinstance(a, EmbeddingTable)]
        return found

    assert table("algorithms.embedding_table={}").refresh_batch_size == 7
    assert table("algorithms.embedding_table={refresh_batch_size: 4}").refresh_batch_size == 4
