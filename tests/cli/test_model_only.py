"""``export`` and ``embed --input`` build the model from the config and the checkpoint alone: with the
training and test files gone they write the same model and the same embeddings as with them."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import embed_input, latest_checkpoint, one_line_error, train_unevaluated
from tests.cli.test_text import write_config
from tests.data.text.helpers import pair_rows, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TINY_BERT = {"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 32, "max_position_embeddings": 32}  # fmt: skip


@pytest.fixture
def trained(tmp_path):
    """A tiny BERT trained 2 batches on pairs with its own tokenizer: ``(config, checkpoint)``."""
    write_jsonl(tmp_path / "train.jsonl", pair_rows(32, seed=0))
    write_jsonl(tmp_path / "test.jsonl", pair_rows(8, seed=1))
    config = write_config(tmp_path, {"name": "transformer", "config": TINY_BERT, "embedding_dim": 8})
    train_unevaluated(config, "2ba", tmp_path / "run")
    return config, latest_checkpoint(tmp_path / "run")


def test_embed_input_and_export_run_with_the_data_files_removed(trained, tmp_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    config, checkpoint = trained
    main(["embed", config, "--checkpoint", checkpoint, "--out", str(tmp_path / "split")])  # the whole run
    split = np.load(tmp_path / "split.npz")
    rows = pair_rows(8, seed=1)
    write_jsonl(tmp_path / "pairs-to-embed.jsonl", rows)
    for name in ("train.jsonl", "test.jsonl"):
        (tmp_path / name).rename(tmp_path / f"{name}.away")
    embed_input(config, checkpoint, tmp_path / "pairs-to-embed.jsonl", tmp_path / "file")
    np.testing.assert_allclose(np.load(tmp_path / "file.npz")["embeddings"], split["embeddings"], atol=1e-5)
    main(["export", config, "--checkpoint", checkpoint, "--out", str(tmp_path / "st")])
    texts = [text for row in rows for text in (row["anchor"], row["positive"])]
    theirs = sentence_transformers.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(texts)
    np.testing.assert_allclose(theirs, split["embeddings"], atol=1e-5)


def test_a_split_still_needs_the_data_and_says_so_in_one_line(trained, tmp_path, capsys):
    config, checkpoint = trained
    (tmp_path / "test.jsonl").unlink()
    error = one_line_error(
        capsys, ["embed", config, "--checkpoint", checkpoint, "--out", str(tmp_path / "e")]
    )
    assert "test.jsonl" in error, error


def test_a_checkpoint_of_another_model_is_one_line(trained, tmp_path, capsys):
    config, checkpoint = trained
    write_jsonl(tmp_path / "texts.jsonl", [{"text": "a text"}])
    error = one_line_error(
        capsys,
        ["embed", config, "model.encoder.embedding_dim=4", "--checkpoint", checkpoint,
         "--input", str(tmp_path / "texts.jsonl"), "--out", str(tmp_path / "e")],
    )  # fmt: skip
    assert "does not fit the model the config builds" in error, error
