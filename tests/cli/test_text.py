"""Texts through the real command line: train, eval, embed (a split or a file) and export on tiny pairs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import (
    embed_input,
    export_huggingface,
    latest_checkpoint,
    one_line_error,
    pairs_data,
    train_unevaluated,
)
from tests.data.text.helpers import pair_rows, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

RANKING = ("mrr", "mrr_at_10", "recall_at_1", "recall_at_5", "ndcg_at_10", "csn_mrr")


def write_config(folder, encoder, **data) -> str:
    config = {
        "seed": 0,
        "data": pairs_data(folder, **data),
        "model": {"normalize": True, "encoder": encoder, "loss": {"name": "info_nce", "temperature": 0.1}},
        "sampler": {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2},
        "algorithms": {"hard_negative_mining": {"strategy": "batch_hard", "duplicate_key": "text_hash"}},
        "optimizer": {"name": "adamw", "lr": 0.01},
        "evaluation": {"interval": "2ep", "ks": [1, 5]},
        "trainer": {"max_duration": "4ep", "progress_bar": False},
        "loggers": {},
    }
    path = folder / "pairs.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A bag-of-tokens run on 48 training pairs, 4 epochs, evaluated at epochs 2 and 4."""
    folder = tmp_path_factory.mktemp("cli_text")
    write_jsonl(folder / "train.jsonl", pair_rows(48, seed=0))
    write_jsonl(folder / "test.jsonl", pair_rows(12, seed=1))
    config = write_config(folder, {"name": "bag_of_tokens", "token_dim": 16})
    main(["train", config, "--run-dir", str(folder / "run")])
    return folder, config, json.loads((folder / "run" / "metrics.json").read_text())


def test_train_writes_the_ranking_metrics_and_the_tokenizer(run, capsys):
    folder, _, metrics = run
    for key in RANKING:
        assert 0.0 <= metrics[key] <= 1.0, key
    assert metrics["protocol"] == "test queries vs test passages"
    assert (
        metrics["num_queries"] == metrics["gallery_size"] == 12 and metrics["queries_without_positive"] == 0
    )
    assert [entry["epoch"] for entry in metrics["eval_history"]] == [2, 4]
    assert metrics["eval_history"][-1]["mrr"] == pytest.approx(metrics["mrr"], abs=1e-6)
    assert (folder / "run" / "tokenizer.json").is_file()
    assert (
        not (folder / "run" / "embeddings.png").exists() and not (folder / "run" / "retrievals.png").exists()
    )


def test_eval_reads_the_run_tokenizer_and_repeats_the_final_metrics(run, tmp_path, capsys):
    folder, config, metrics = run
    checkpoint = folder / "run" / "checkpoints" / "latest-rank0.pt"
    # A vocab_size of 60 would train another tokenizer: eval must read the run's instead.
    main(
        [
            "eval",
            config,
            "--checkpoint",
            str(checkpoint),
            "data.vocab_size=60",
            "--out",
            str(tmp_path / "e.json"),
        ]
    )
    result = json.loads((tmp_path / "e.json").read_text())
    for key in RANKING:
        assert result[key] == pytest.approx(metrics[key], abs=1e-6), key
    table = capsys.readouterr().out
    assert "MRR@10" in table and "nDCG@10" in table and "Recall@5" in table


def test_embed_a_split_and_the_same_texts_from_a_file(run, tmp_path):
    folder, config, _ = run
    checkpoint = latest_checkpoint(folder / "run")
    main(["embed", config, "--checkpoint", checkpoint, "--out", str(tmp_path / "split")])
    split = np.load(tmp_path / "split.npz")
    assert split["embeddings"].shape == (24, 16) and split["is_query"].tolist() == [True, False] * 12
    assert split["source_rows"].tolist() == np.repeat(np.arange(12), 2).tolist()
    embed_input(config, checkpoint, folder / "test.jsonl", tmp_path / "file")
    file = np.load(tmp_path / "file.npz")
    np.testing.assert_allclose(file["embeddings"], split["embeddings"], atol=1e-5)
    assert (
        file["indices"].tolist() == split["source_rows"].tolist()
        and file["is_query"].tolist() == [True, False] * 12
    )
    texts = write_jsonl(
        tmp_path / "texts.jsonl", [{"text": row["positive"]} for row in pair_rows(12, seed=1)]
    )
    embed_input(config, checkpoint, texts, tmp_path / "texts")
    plain = np.load(tmp_path / "texts.npz")
    np.testing.assert_allclose(plain["embeddings"], split["embeddings"][1::2], atol=1e-5)
    assert plain["indices"].tolist() == list(range(12)) and not plain["is_query"].any()


def test_export_for_sentence_transformers_embeds_as_the_model(tmp_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    write_jsonl(tmp_path / "train.jsonl", pair_rows(32, seed=0))
    write_jsonl(tmp_path / "test.jsonl", pair_rows(8, seed=1))
    bert = {"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 32, "max_position_embeddings": 32}  # fmt: skip
    config = write_config(tmp_path, {"name": "transformer", "config": bert, "embedding_dim": 8})
    train_unevaluated(config, "2ba", tmp_path / "run")
    checkpoint = latest_checkpoint(tmp_path / "run")
    main(["export", config, "--checkpoint", checkpoint, "--out", str(tmp_path / "st")])
    main(["embed", config, "--checkpoint", checkpoint, "--out", str(tmp_path / "mine")])
    mine = np.load(tmp_path / "mine.npz")["embeddings"]
    rows = pair_rows(8, seed=1)
    texts = [text for row in rows for text in (row["anchor"], row["positive"])]
    theirs = sentence_transformers.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(texts)
    np.testing.assert_allclose(theirs, mine, atol=1e-5)


def test_export_of_a_bag_of_tokens_model(run, tmp_path, capsys):
    from composer_dynsample.export import load_exported_encoder
    from composer_dynsample.models.text import BagOfTokensEncoder

    folder, config, _ = run
    checkpoint = latest_checkpoint(folder / "run")
    with pytest.raises(SystemExit) as stop:
        main(["export", config, "--checkpoint", checkpoint, "--out", str(tmp_path / "st")])
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(error.splitlines()) == 1
    assert (
        "export --format sentence-transformers: export_sentence_transformers needs a TransformerEncoder"
        in error
    )
    assert not (tmp_path / "st").exists()
    export_huggingface(config, checkpoint, tmp_path / "hf")
    assert isinstance(load_exported_encoder(tmp_path / "hf"), BagOfTokensEncoder)


def test_bad_text_input_is_one_line_naming_the_file_line_and_column(run, tmp_path, capsys):
    folder, config, _ = run
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "no_positive.jsonl").write_text('{"anchor": "a"}\n')
    (bad / "empty.jsonl").write_text('{"anchor": "a", "positive": "b"}\n{"anchor": "  ", "positive": "c"}\n')
    (bad / "latin1.jsonl").write_bytes(
        b'{"anchor": "a", "positive": "b"}\n{"anchor": "caf\xe9", "positive": "c"}\n'
    )
    (bad / "quoted.csv").write_text('anchor,positive\n"two\nlines",b\nq,""\n')
    (bad / "tokenizer.json").write_text("{not json")
    cases = [
        ("data.path=" + str(bad / "no_positive.jsonl"), "no_positive.jsonl: missing column 'positive'"),
        ("data.path=" + str(bad / "empty.jsonl"), "empty.jsonl: line 2, column 'anchor': the text is blank"),
        ("data.path=" + str(bad / "latin1.jsonl"), "latin1.jsonl: line 2"),
        ("data.path=" + str(bad / "quoted.csv"), "quoted.csv: line 4, column 'positive': the text is empty"),
        ("data.tokenizer=" + str(bad / "tokenizer.json"), "tokenizer.json: not a tokenizers JSON file"),
        ("data.max_length=1", "data: max_length must be an integer >= 2, got 1"),
    ]
    for override, message in cases:
        argv = ["train", config, override, "data.test_path=null", "--run-dir", str(tmp_path / "r")]
        error = one_line_error(capsys, argv)
        assert error.startswith("composer-dynsample train: error: data: ") and message in error, error
        assert "rejected the config" not in error  # the loader's own line, not the call's arguments
    assert not (tmp_path / "r").exists()
    (bad / "no_text.jsonl").write_text('{"positive": "a"}\n')  # an anchor alone is a query: embedded
    error = one_line_error(
        capsys,
        ["embed", config, "--checkpoint", latest_checkpoint(folder / "run"),
         "--input", str(bad / "no_text.jsonl"), "--out", str(tmp_path / "x")],
    )  # fmt: skip
    assert (
        "no_text.jsonl: expected a column 'text' (passages), 'anchor' (queries), or 'anchor' and 'positive' "
        "(pairs), found ['positive']" in error
    )
    with pytest.raises(SystemExit) as stop:  # a split or a file, not both
        main(["embed", config, "--checkpoint", "c.pt", "--split", "test", "--input", "f.jsonl", "--out", "x"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_overwrite_removes_the_previous_runs_tokenizer(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", pair_rows(32, seed=0))
    write_jsonl(tmp_path / "test.jsonl", pair_rows(8, seed=1))
    config = write_config(tmp_path, {"name": "bag_of_tokens", "token_dim": 8})
    quick = ["trainer.max_duration=1ba", "evaluation.interval=null", "--run-dir", str(tmp_path / "run")]
    main(["train", config, *quick])
    first = (tmp_path / "run" / "tokenizer.json").read_bytes()
    # A new run in its place trains its own tokenizer (a smaller vocabulary) instead of reading the old one.
    main(["train", config, "data.vocab_size=120", *quick, "--overwrite"])
    second = (tmp_path / "run" / "tokenizer.json").read_bytes()
    assert second != first and len(second) < len(first)


def test_labelled_texts_train_leave_one_out_with_their_label_names(tmp_path):
    from tests.data.text.helpers import write_texts

    texts = write_texts(tmp_path / "intents.csv", labels=10, per_label=4)
    config = write_config(
        tmp_path, {"name": "text_cnn", "token_dim": 8, "channels": 8}, name="texts", path=str(texts)
    )
    main(["train", config, "data.test_path=null", "evaluation.ks=[1]", "--run-dir", str(tmp_path / "run")])
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["protocol"] == "leave-one-out among the test items" and metrics["num_queries"] == 8
    assert 0.0 <= metrics["recall_at_1"] <= 1.0 and "map_at_r" in metrics
    assert metrics["class_names"][:2] == ["intent_0", "intent_1"]
    assert (tmp_path / "run" / "embeddings.png").is_file()


def test_embed_holds_at_most_the_gallery_batch_size_in_a_forward_pass(run, tmp_path, monkeypatch):
    from composer_dynsample.models.text import BagOfTokensEncoder

    folder, config, _ = run
    seen, forward = [], BagOfTokensEncoder.forward
    monkeypatch.setattr(
        BagOfTokensEncoder,
        "forward",
        lambda self, features: seen.append(len(out := forward(self, features))) or out,
    )
    checkpoint = latest_checkpoint(folder / "run")
    main(
        [
            "embed",
            config,
            "--checkpoint",
            checkpoint,
            "evaluation.gallery_batch_size=5",
            "--out",
            str(tmp_path / "e"),
        ]
    )
    assert np.load(tmp_path / "e.npz")["embeddings"].shape[0] == sum(seen) == 24 and max(seen) == 5, seen
