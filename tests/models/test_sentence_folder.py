"""A model folder's settings: what a sentence-transformers folder says of its pooling, normalisation and
length, the encoder built from it, and an export of it that says the same (on the tiny folders of
tests/models/folders.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from composer_dynsample import EmbeddingModel
from composer_dynsample.export import export_sentence_transformers
from composer_dynsample.models.sentence_folder import read_model_folder, tokenizer_vocabulary
from composer_dynsample.models.transformer import TransformerEncoder, position_limit
from tests.models.folders import POSITIONS, save_bert_folder, save_sentence_folder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def sentence_folder(tmp_path_factory) -> Path:
    return save_sentence_folder(tmp_path_factory.mktemp("sentence") / "st")


def _legacy_folder(folder: Path) -> Path:
    """A folder as sentence-transformers 2 wrote them: the model in ``0_Transformer``, modules named
    ``sentence_transformers.models.*`` and the pooling as ``pooling_mode_*`` flags."""
    model = save_bert_folder(folder / "0_Transformer")
    (model / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 32, "do_lower_case": False})
    )
    pooling = {
        "word_embedding_dimension": 16,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    modules = [
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


def test_a_sentence_transformers_folder_says_its_pooling_normalisation_and_length(sentence_folder):
    folder = read_model_folder(sentence_folder)
    assert folder.sentence_transformers and folder.model_dir == sentence_folder
    assert (folder.pooling, folder.normalize, folder.max_seq_length) == ("cls", True, 20)
    assert folder.max_seq_length_source == "sentence_bert_config.json"
    assert folder.has_tokenizer and folder.other_modules == ()
    vocabulary = tokenizer_vocabulary(sentence_folder)
    assert vocabulary is not None and vocabulary["[PAD]"] == 0
    assert tokenizer_vocabulary(sentence_folder / "tokenizer.json") == vocabulary


def test_a_legacy_folder_is_read_too(tmp_path):
    folder = read_model_folder(_legacy_folder(tmp_path / "legacy"))
    assert folder.model_dir == tmp_path / "legacy" / "0_Transformer"
    assert (folder.pooling, folder.normalize, folder.max_seq_length) == ("mean", False, 32)
    assert position_limit(path=tmp_path / "legacy").tokens == POSITIONS  # config.json of 0_Transformer
    encoder = TransformerEncoder(path=tmp_path / "legacy")
    assert encoder.pooling == "mean" and encoder.max_tokens == POSITIONS


def test_a_plain_hugging_face_folder_says_nothing_but_its_tokenizer(tmp_path):
    folder = read_model_folder(save_bert_folder(tmp_path / "hf"))
    assert not folder.sentence_transformers and folder.has_tokenizer
    assert (folder.pooling, folder.normalize, folder.max_seq_length) == (None, None, None)
    assert TransformerEncoder(path=tmp_path / "hf").pooling == "mean"


def test_the_encoder_pools_as_its_folder_unless_told(sentence_folder):
    assert TransformerEncoder(path=sentence_folder).pooling == "cls"
    assert TransformerEncoder(path=sentence_folder, pooling="mean").pooling == "mean"
    config = {"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
    assert TransformerEncoder(vocab_size=50, config={**config, "intermediate_size": 32}).pooling == "mean"


def test_every_pooling_of_sentence_transformers_is_the_encoder_s_and_an_unknown_one_is_one_line(tmp_path):
    folder = _legacy_folder(tmp_path / "max")
    pooling = folder / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({"pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": False}))
    assert (read_model_folder(folder).pooling, read_model_folder(folder).include_prompt) == ("max", True)
    assert TransformerEncoder(path=folder).pooling == "max"
    assert TransformerEncoder(path=folder, pooling="cls").pooling == "cls"  # the config's choice wins
    flags = {"pooling_mode_lasttoken": True, "pooling_mode_cls_token": True, "include_prompt": False}
    pooling.write_text(json.dumps(flags))  # the flags name their modes in sentence-transformers' order
    assert (read_model_folder(folder).pooling, read_model_folder(folder).include_prompt) == (
        "cls+lasttoken",
        False,
    )
    encoder = TransformerEncoder(path=folder)
    assert (encoder.pooling, encoder.include_prompt, encoder.embedding_dim) == ("cls+lasttoken", False, 32)
    assert TransformerEncoder(path=folder, include_prompt=True).include_prompt is True
    pooling.write_text(json.dumps({"pooling_mode": ["mean", "max"]}))
    assert read_model_folder(folder).pooling == "mean+max"
    pooling.write_text(json.dumps({"pooling_mode": "avg"}))
    with pytest.raises(ValueError, match=r"pools by 'avg' \(.*1_Pooling/config\.json\)") as error:
        TransformerEncoder(path=folder)
    assert "\n" not in str(error.value) and "set pooling to one of ('cls', 'max'," in str(error.value)
    assert TransformerEncoder(path=folder, pooling="mean").pooling == "mean"
    (folder / "modules.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"modules\.json is not valid JSON"):
        read_model_folder(folder)


def test_an_export_of_a_folder_model_says_what_the_folder_said(sentence_folder, tmp_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model = EmbeddingModel(TransformerEncoder(path=sentence_folder), normalize=True).eval()
    config = {
        "data": {"name": "pairs", "path": "train.jsonl", "test_path": "test.jsonl"},
        "model": {
            "encoder": {"name": "transformer", "path": str(sentence_folder)},
            "loss": {"name": "info_nce"},
        },
        "sampler": {"name": "pk", "classes_per_batch": 8},
        "optimizer": {"name": "adamw", "lr": 2e-5},
        "trainer": {"max_duration": "1ep"},
    }
    metrics = {"mrr": 0.75, "csn_mrr": 0.5, "epochs": 1, "at_start": {"mrr": 0.5, "csn_mrr": 0.25}}
    out = export_sentence_transformers(
        model,
        sentence_folder / "tokenizer.json",
        tmp_path / "out",
        max_length=20,
        config=config,
        metrics=metrics,
    )
    again = read_model_folder(out)
    assert (again.pooling, again.normalize, again.max_seq_length) == ("cls", True, 20)
    assert sentence_transformers.SentenceTransformer(str(out), device="cpu").max_seq_length == 20
    card = (out / "README.md").read_text()
    assert "train.jsonl" in card and "test.jsonl" in card
    assert (
        f"started from `{sentence_folder.name}`" in card and str(sentence_folder) not in card
    )  # no local path
    for recipe in ("info_nce", "pk", "adamw", "1ep", "2e-05"):
        assert recipe in card, recipe
    assert "| mrr | 0.7500 | 0.5000 |" in card and "| csn_mrr | 0.5000 | 0.2500 |" in card
    assert "Pooling: cls" in card and "max_seq_length: 20" in card
