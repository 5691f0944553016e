"""Two towers of a model folder (the ADORE mode: a frozen passage copy of the query model) read the folder's
tokenizer, pooling and normalisation, as one transformer of that folder does; two folders of one tokenizer
each load their own model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from composer_dynsample.config import load_config
from composer_dynsample.config.run import build_run
from composer_dynsample.data import TextCollate
from tests.cli.helpers import write_model_folder_config
from tests.models.folders import save_bert_folder, save_sentence_folder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def towers(query: Path, passage: Path) -> dict:
    return {
        "name": "two_tower",
        "frozen_passages": True,
        "query_encoder": {"name": "transformer", "path": str(query)},
        "passage_encoder": {"name": "transformer", "path": str(passage)},
    }


def test_two_towers_of_one_folder_take_its_tokenizer_pooling_and_normalisation(tmp_path):
    folder = save_sentence_folder(tmp_path / "model" / "st", pooling="cls", max_seq_length=12)
    run = build_run(
        load_config(write_model_folder_config(tmp_path, towers(folder, folder))), tmp_path / "run"
    )
    single = build_run(
        load_config(write_model_folder_config(tmp_path, {"name": "transformer", "path": str(folder)})),
        tmp_path / "one",
    )
    assert run.splits.info.tokenizer == str(folder) and run.splits.info.max_length == 12
    assert run.model.normalize is True and run.model.encoder.passage_encoder.pooling == "cls"
    # Before training both towers are the folder's model: every row embeds as one transformer of it.
    store = run.splits.test
    batch = TextCollate(store)(list(range(len(store))))
    with torch.no_grad():
        ours = run.model.eval().embed(batch["features"])
        theirs = single.model.eval().embed(
            TextCollate(single.splits.test)(list(range(len(store))))["features"]
        )
    torch.testing.assert_close(ours, theirs)


def test_two_towers_of_two_folders_of_one_tokenizer_each_load_their_own(tmp_path):
    """Two folders of one tokenizer (two models of one base) build: each tower holds its own folder's
    weights; two vocabularies stay one line (tests/cli/test_two_tower_router.py)."""
    import transformers

    first = save_bert_folder(tmp_path / "first")
    second = save_bert_folder(tmp_path / "second", seed=1)
    run = build_run(load_config(write_model_folder_config(tmp_path, towers(first, second))), tmp_path / "run")
    assert run.splits.info.tokenizer == str(first)
    for tower, folder in (
        (run.model.encoder.query_encoder, first),
        (run.model.encoder.passage_encoder, second),
    ):
        saved = transformers.AutoModel.from_pretrained(str(folder)).embeddings.word_embeddings.weight
        assert torch.equal(tower.model.embeddings.word_embeddings.weight, saved)
    assert not torch.equal(
        run.model.encoder.query_encoder.model.embeddings.word_embeddings.weight,
        run.model.encoder.passage_encoder.model.embeddings.word_embeddings.weight,
    )
