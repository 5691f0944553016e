"""A model folder through the command line: its tokenizer, pooling, normalisation and max_seq_length are
the run's defaults, the model built from it embeds as sentence-transformers does, a tokenizer that is
not the folder's is one line, and ``export`` writes back what the folder said."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

from composer_dynsample.cli.main import main
from composer_dynsample.config import load_config
from composer_dynsample.config.run import build_run
from composer_dynsample.data import TextCollate
from composer_dynsample.data.text.tokenizer import train_tokenizer
from composer_dynsample.models.sentence_folder import read_model_folder
from tests.cli.helpers import latest_checkpoint, one_line_error, write_model_folder_config
from tests.data.text.helpers import pair_rows, write_jsonl
from tests.models.folders import POSITIONS, save_bert_folder, save_sentence_folder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PREFIX = "composer-dynsample train: error: "


def train_error(capsys, config: str, run_dir: Path, *overrides: str) -> str:
    """The one line ``train`` exits with (code 2), having written no run folder."""
    error = one_line_error(capsys, ["train", config, *overrides, "--run-dir", str(run_dir)])
    assert error.startswith(PREFIX), error
    assert not run_dir.exists()
    return error[len(PREFIX) :]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A sentence-transformers folder: CLS pooling, Normalize, max_seq_length 12, 64 positions."""
    return save_sentence_folder(tmp_path_factory.mktemp("model") / "st", pooling="cls", max_seq_length=12)


def test_train_takes_the_folder_s_tokenizer_pooling_normalisation_and_length(folder, tmp_path, capsys):
    config = write_model_folder_config(tmp_path, {"name": "transformer", "path": str(folder)})
    main(["train", config, "--run-dir", str(tmp_path / "run")])
    capsys.readouterr()
    run = build_run(load_config(config), tmp_path / "built")
    info, encoder = run.splits.info, run.model.encoder
    assert info.tokenizer == str(folder) and info.max_length == 12
    assert encoder.pooling == "cls" and run.model.normalize is True
    assert info.vocab_size == encoder.model.get_input_embeddings().num_embeddings
    assert not (tmp_path / "run" / "tokenizer.json").exists()  # no tokenizer trained on the pairs
    out = tmp_path / "exported"
    main(["export", config, "--checkpoint", latest_checkpoint(tmp_path / "run"), "--out", str(out)])
    exported = read_model_folder(out)
    assert (exported.pooling, exported.normalize, exported.max_seq_length) == ("cls", True, 12)
    vocabulary = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    assert vocabulary == json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]


def test_the_model_built_from_the_folder_embeds_as_sentence_transformers(folder, tmp_path):
    from sentence_transformers import SentenceTransformer

    config = write_model_folder_config(tmp_path, {"name": "transformer", "path": str(folder)})
    run = build_run(load_config(config), tmp_path / "run")
    store = run.splits.test
    rows = [pair_rows(8, seed=1)[row] for row in store.source_rows]
    texts = [row["anchor" if query else "positive"] for row, query in zip(rows, store.is_query)]
    batch = TextCollate(store)(list(range(len(store))))
    model = run.model.eval()
    with torch.no_grad():
        ours = model.embed(batch["features"])
    reference = SentenceTransformer(str(folder), device="cpu")
    assert reference.max_seq_length == run.splits.info.max_length == 12
    theirs = reference.encode(texts, convert_to_tensor=True)
    assert (
        run.splits.info.num_truncated > 0
    )  # the passages are cut to 12 tokens, as sentence-transformers cuts them
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_a_folder_without_normalize_trains_unnormalised_unless_told(tmp_path):
    plain = save_sentence_folder(tmp_path / "raw", pooling="mean", normalize=False, max_seq_length=None)
    config = write_model_folder_config(tmp_path, {"name": "transformer", "path": str(plain)})
    run = build_run(load_config(config), tmp_path / "run")
    assert run.model.normalize is False and run.model.encoder.pooling == "mean"
    assert run.splits.info.max_length == read_model_folder(plain).max_seq_length
    told = build_run(load_config(config, ["model.normalize=true", "data.max_length=10"]), tmp_path / "told")
    assert told.model.normalize is True and told.splits.info.max_length == 10


def test_a_plain_folder_s_default_length_is_capped_by_its_positions(tmp_path):
    bert = save_bert_folder(tmp_path / "bert")
    config = write_model_folder_config(tmp_path, {"name": "transformer", "path": str(bert)})
    run = build_run(load_config(config), tmp_path / "run")
    assert run.splits.info.max_length == POSITIONS  # the loader's 128, capped at the model's 64 positions
    assert run.splits.info.tokenizer == str(bert) and run.model.encoder.pooling == "mean"
    assert run.model.normalize is True


def test_a_data_tokenizer_other_than_the_folder_s_is_one_line(folder, tmp_path, capsys):
    other = tmp_path / "other.json"
    train_tokenizer(["completely different words here"] * 4, vocab_size=64).save(str(other))
    encoder = {"name": "transformer", "path": str(folder)}
    config = write_model_folder_config(tmp_path, encoder, tokenizer=str(other), max_length=12)
    error = train_error(capsys, config, tmp_path / "run")
    assert error.startswith(f"data.tokenizer {str(other)!r} is not the tokenizer of model.encoder.path "), (
        error
    )
    assert str(folder) in error and "leave data.tokenizer out" in error
    assert not (tmp_path / "cache").exists()  # refused when the config is checked: nothing tokenized
    same = write_model_folder_config(tmp_path, encoder, tokenizer=str(folder))
    run = build_run(load_config(same), tmp_path / "same")
    assert run.splits.info.max_length == 12 and run.splits.info.tokenizer == str(folder)


def test_a_folder_without_a_tokenizer_is_one_line(tmp_path, capsys):
    import transformers

    bert = tmp_path / "bert"
    config = transformers.BertConfig(
        vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    transformers.BertModel(config).save_pretrained(bert)
    capsys.readouterr()
    path = write_model_folder_config(tmp_path, {"name": "transformer", "path": str(bert)}, max_length=24)
    error = train_error(capsys, path, tmp_path / "run")
    assert error.startswith(f"model.encoder.path {str(bert)!r} holds no tokenizer"), error
    assert "set data.tokenizer" in error
    assert not (tmp_path / "cache").exists()


def test_a_folder_s_unknown_pooling_is_one_line(tmp_path, capsys):
    folder = save_sentence_folder(tmp_path / "avg", pooling="max")
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "avg"}))
    config = write_model_folder_config(tmp_path, {"name": "transformer", "path": str(folder)}, max_length=12)
    error = train_error(capsys, config, tmp_path / "run")
    assert error.startswith(f"model.encoder.path {str(folder)!r} pools by 'avg' ("), error
    assert "1_Pooling/config.json" in error and "set model.encoder.pooling to one of" in error
    run = build_run(load_config(config, ["model.encoder.pooling=mean"]), tmp_path / "told")
    assert run.model.encoder.pooling == "mean"


def test_a_folder_s_max_seq_length_beyond_its_positions_is_one_line(tmp_path, capsys):
    folder = save_sentence_folder(tmp_path / "long", max_seq_length=POSITIONS + 36)
    config = write_model_folder_config(tmp_path, {"name": "transformer", "path": str(folder)})
    error = train_error(capsys, config, tmp_path / "run")
    assert error.startswith(
        f"data.max_length is unset and the max_seq_length of model.encoder.path {str(folder)!r} "
        "(its sentence_bert_config.json) is 100 but"
    ), error
    assert f"set data.max_length to at most {POSITIONS}" in error


def test_a_random_init_transformer_keeps_the_trained_tokenizer(tmp_path):
    bert = {"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
    encoder = {"name": "transformer", "config": {**bert, "intermediate_size": 32}}
    config = write_model_folder_config(tmp_path, encoder, max_length=24, vocab_size=200)
    run = build_run(load_config(config), tmp_path / "run")
    assert run.splits.info.tokenizer.startswith("trained: wordpiece")
    assert run.model.encoder.pooling == "mean" and run.model.normalize is True
    assert np.isclose(run.splits.info.max_length, 24)


def test_a_missing_model_folder_is_one_line(tmp_path, capsys):
    absent = tmp_path / "absent"
    config = write_model_folder_config(tmp_path, {"name": "transformer", "path": str(absent)})
    error = train_error(capsys, config, tmp_path / "run")
    assert error.startswith(f"model.encoder.path {str(absent)!r} does not exist; "), error
    assert not (tmp_path / "cache").exists()  # no tokenizer trained for a model that is not there


def test_a_folder_that_lower_cases_what_its_tokenizer_does_not_is_one_line(tmp_path):
    from composer_dynsample.config import ConfigError
    from composer_dynsample.config.checks import check_config

    folder = save_sentence_folder(tmp_path / "cased")
    settings = json.loads((folder / "sentence_bert_config.json").read_text())
    (folder / "sentence_bert_config.json").write_text(json.dumps({**settings, "do_lower_case": True}))
    check_config(
        load_config(write_model_folder_config(tmp_path, {"name": "transformer", "path": str(folder)}))
    )
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps({**tokenizer, "normalizer": {"type": "NFKC"}}))
    config = load_config(write_model_folder_config(tmp_path, {"name": "transformer", "path": str(folder)}))
    with pytest.raises(
        ConfigError, match=r"lower-cases texts \(do_lower_case in its settings\) but its tokenizer"
    ):
        check_config(config)


def test_export_writes_a_model_card_of_the_run(folder, tmp_path, tmp_path_factory, capsys):
    config = write_model_folder_config(tmp_path, {"name": "transformer", "path": str(folder)})
    main(["train", config, "evaluation.interval=1ep", "--run-dir", str(tmp_path / "run")])
    out = tmp_path / "exported"
    main(["export", config, "--checkpoint", latest_checkpoint(tmp_path / "run"), "--out", str(out)])
    capsys.readouterr()
    card = (out / "README.md").read_text()
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    # No path of this machine: the data files by name and SHA-256, the model folder by name.
    assert str(tmp_path_factory.getbasetemp()) not in card, card
    for name in ("train.jsonl", "test.jsonl"):
        digest = hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
        assert f"{name} (SHA-256 {digest})" in card, name
    assert re.search(r"data\.path: `train\.jsonl \(SHA-256 [0-9a-f]{64}\)`", card), card
    assert f"started from `{folder.name}`" in card and "Pooling: cls" in card and "max_seq_length: 12" in card
    for recipe in ("info_nce", "pk", "adamw", "trainer.max_duration: `2ba`", "seed: `0`"):
        assert recipe in card, recipe
    assert f"| mrr | {metrics['mrr']:.4f} |" in card


def test_eval_without_a_checkpoint_scores_what_sentence_transformers_encodes(tmp_path):
    """``eval CONFIG`` of a folder, no checkpoint: the metrics of the folder's own sentence-transformers
    embeddings of the same queries and passages, ranked by brute force (one positive per query). Mean
    pooling: the tiny random model's CLS vectors nearly tie, which would test the tie rule instead."""
    from sentence_transformers import SentenceTransformer

    folder = save_sentence_folder(tmp_path / "mean", pooling="mean", max_seq_length=24)
    config = write_model_folder_config(tmp_path, {"name": "transformer", "path": str(folder)})
    rows = pair_rows(40, seed=1)
    write_jsonl(tmp_path / "test.jsonl", rows)
    main(["eval", config, "--out", str(tmp_path / "start.json")])
    ours = json.loads((tmp_path / "start.json").read_text())
    reference = SentenceTransformer(str(folder), device="cpu")
    queries = reference.encode([row["anchor"] for row in rows], convert_to_tensor=True)
    passages = reference.encode([row["positive"] for row in rows], convert_to_tensor=True)
    scores = torch.nn.functional.normalize(queries, dim=1) @ torch.nn.functional.normalize(passages, dim=1).T
    rank = 1 + (scores > scores.diagonal()[:, None]).sum(dim=1).double()
    expected = {
        "mrr": (1 / rank).mean(), "csn_mrr": (1 / rank).mean(), "mrr_at_10": torch.where(rank <= 10, 1 / rank, 0).mean(),
        "recall_at_1": (rank <= 1).double().mean(), "recall_at_5": (rank <= 5).double().mean(),
        "ndcg_at_10": torch.where(rank <= 10, 1 / torch.log2(rank + 1), 0).mean(),
    }  # fmt: skip
    assert ours["checkpoint"] is None and ours["num_queries"] == 40
    assert 0.1 < expected["mrr"] < 0.9 and scores.unique().numel() == scores.numel()  # no ties, no saturation
    for key, value in expected.items():
        assert ours[key] == pytest.approx(float(value), abs=1e-4), key
