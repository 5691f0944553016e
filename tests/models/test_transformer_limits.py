"""The transformer encoder's limits and loading: positions read off a config, texts too long for them,
and what a model folder's load says (one line, no report of ``transformers``)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from composer_dynsample.models.transformer import (
    PositionLimit,
    TransformerEncoder,
    position_limit,
    quiet_transformers,
)

BERT = {"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 32, "max_position_embeddings": 12}  # fmt: skip


def test_positions_are_read_off_a_config_or_a_folder_without_building_the_model(tmp_path):
    assert position_limit(config=BERT) == PositionLimit(12, 12, "bert")
    assert position_limit(config={"model_type": "bert"}) == PositionLimit(512, 512, "bert", default=True)
    # RoBERTa numbers positions from padding_idx + 1: 514 positions take 512 tokens.
    assert position_limit(config={"model_type": "roberta", "max_position_embeddings": 514}).tokens == 512
    assert position_limit(config={"model_type": "xlm-roberta", "max_position_embeddings": 514}).tokens == 512
    assert position_limit(config={"model_type": "deberta-v2", "position_biased_input": False}) is None
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "distilbert", "max_position_embeddings": 64})
    )
    assert position_limit(path=tmp_path) == PositionLimit(64, 64, "distilbert")
    assert position_limit(path=tmp_path / "absent") is None
    assert position_limit(config={"model_type": "no-such-model"}) is None


def test_texts_longer_than_the_positions_are_one_line():
    encoder = TransformerEncoder(vocab_size=30, config=BERT)
    assert encoder.max_tokens == 12
    fits = {
        "input_ids": torch.ones(2, 12, dtype=torch.long),
        "attention_mask": torch.ones(2, 12, dtype=torch.long),
    }
    assert encoder(fits).shape == (2, 16)
    long = {
        "input_ids": torch.ones(2, 13, dtype=torch.long),
        "attention_mask": torch.ones(2, 13, dtype=torch.long),
    }
    with pytest.raises(
        ValueError, match="the texts are 13 tokens long but the model has positions for 12"
    ) as error:
        encoder(long)
    assert "\n" not in str(error.value)


def test_a_model_folder_loads_quietly_saying_what_it_dropped(tmp_path, capfd, transformers_log):
    import transformers

    config = transformers.BertConfig(**{key: value for key, value in BERT.items() if key != "model_type"})
    with quiet_transformers():
        transformers.BertForPreTraining(config).save_pretrained(tmp_path / "pretraining")
        transformers.BertModel(config).save_pretrained(tmp_path / "bert")
    capfd.readouterr()
    TransformerEncoder(path=tmp_path / "bert")
    out, err = capfd.readouterr()
    assert (
        out
        == f"model {tmp_path / 'bert'}: its pooler (pooler.dense) is not used by mean/CLS pooling and was dropped.\n"
    )
    assert err == "" and transformers_log.getvalue() == ""
    TransformerEncoder(path=tmp_path / "pretraining")
    out, err = capfd.readouterr()
    assert (
        "its pooler (bert.pooler.dense) is not used" in out and "cls.predictions, cls.seq_relationship" in out
    )
    assert "heads of another task) and were not loaded" in out and len(out.splitlines()) == 1
    logged = out + err + transformers_log.getvalue()
    assert "\x1b" not in logged and "UNEXPECTED" not in logged and "LOAD REPORT" not in logged


def test_weights_a_folder_lacks_are_a_warning(tmp_path, capfd, transformers_log):
    import transformers

    config = transformers.BertConfig(**{key: value for key, value in BERT.items() if key != "model_type"})
    with quiet_transformers():
        transformers.BertModel(config, add_pooling_layer=False).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "num_hidden_layers": 2}))
    capfd.readouterr()
    with pytest.warns(
        UserWarning, match=r"holds no weights for encoder\.layer\.1.*initialised them randomly"
    ):
        TransformerEncoder(path=tmp_path)
    out, err = capfd.readouterr()
    logged = out + err + transformers_log.getvalue()
    assert "MISSING" not in logged and "newly initialized" not in logged


def test_quiet_transformers_restores_the_logging_it_found():
    logging = pytest.importorskip("transformers").utils.logging
    before = logging.get_verbosity(), logging.is_progress_bar_enabled()
    with quiet_transformers():
        assert logging.get_verbosity() == logging.ERROR and not logging.is_progress_bar_enabled()
    assert (logging.get_verbosity(), logging.is_progress_bar_enabled()) == before
