"""Exporting text encoders: Hugging Face directories, sentence-transformers directories, round trips."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from composer_dynsample import EmbeddingModel
from composer_dynsample.export import (
    export_huggingface,
    export_sentence_transformers,
    load_exported_encoder,
    pretrained_tokenizer,
)
from composer_dynsample.models.text import BagOfTokensEncoder, TransformerEncoder, TwoTowerEncoder
from composer_dynsample.validation import InputTypeError
from tests.models.text_helpers import (
    PAD,
    TEXTS,
    TOKENIZER,
    VOCAB,
    bag,
    bert_config,
    cnn,
    features,
    transformer,
)

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("pooling", "embedding_dim", "normalize"),
    [("mean", None, True), ("cls", 6, False), ("mean", 6, None)],
    ids=["mean-normalized", "cls-projected-raw", "bare-encoder"],
)
def test_sentence_transformers_embeds_as_our_model(tmp_path, pooling, embedding_dim, normalize):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    encoder = transformer(pooling=pooling, embedding_dim=embedding_dim).eval()
    model = encoder if normalize is None else EmbeddingModel(encoder, normalize=normalize).eval()
    out = export_sentence_transformers(model, TOKENIZER, tmp_path / "st")
    modules = [entry["type"].rsplit(".", 1)[-1] for entry in json.loads((out / "modules.json").read_text())]
    expected_modules = ["Transformer", "Pooling"] + ["Dense"] * (embedding_dim is not None)
    assert modules == expected_modules + ["Normalize"] * (normalize is not False)
    loaded = sentence_transformers.SentenceTransformer(str(out), device="cpu")
    embeddings = loaded.encode(TEXTS, convert_to_tensor=True)
    with torch.no_grad():
        ours = EmbeddingModel(encoder, normalize=normalize is not False).eval()(
            {"features": features(TEXTS), "labels": torch.zeros(len(TEXTS), dtype=torch.long)}
        )
    torch.testing.assert_close(embeddings, ours, atol=1e-5, rtol=1e-5)


def test_two_towers_export_as_a_router_whose_routes_embed_as_each_tower(tmp_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    query = transformer(pooling="cls", embedding_dim=6)
    torch.manual_seed(1)
    passage = TransformerEncoder(vocab_size=VOCAB, config=bert_config(), pooling="mean", embedding_dim=6)
    model = EmbeddingModel(TwoTowerEncoder(query, passage), normalize=True).eval()
    out = export_sentence_transformers(model, TOKENIZER, tmp_path / "st")
    routes = json.loads((out / "router_config.json").read_text())["structure"]
    steps = ["Transformer", "Pooling", "Dense", "Normalize"]
    assert {route: [name.rsplit("_", 1)[-1] for name in names] for route, names in routes.items()} == {
        "query": steps,
        "document": steps,
    }
    loaded = sentence_transformers.SentenceTransformer(str(out), device="cpu")
    labels = torch.zeros(len(TEXTS), dtype=torch.long)
    for encode, is_query in ((loaded.encode_query, True), (loaded.encode_document, False)):
        batch = features(TEXTS, is_query=[is_query] * len(TEXTS))
        with torch.no_grad():
            ours = model({"features": batch, "labels": labels})
        torch.testing.assert_close(encode(TEXTS, convert_to_tensor=True), ours, atol=1e-5, rtol=1e-5)


def test_huggingface_directory_loads_with_auto_classes(tmp_path):
    encoder = transformer(embedding_dim=6).eval()
    out = export_huggingface(encoder, TOKENIZER, tmp_path / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    tokens = tokenizer(TEXTS, padding=True, return_tensors="pt")
    batch = features(TEXTS)
    assert torch.equal(tokens["input_ids"], batch["input_ids"])
    assert torch.equal(tokens["attention_mask"], batch["attention_mask"])
    assert tokenizer.pad_token == "[PAD]" and tokenizer.cls_token == "[CLS]" and len(tokenizer) == VOCAB
    assert tokenizer.model_max_length == 64  # the model's max_position_embeddings
    model = transformers.AutoModel.from_pretrained(str(out)).eval()
    with torch.no_grad():
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        expected = encoder.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    torch.testing.assert_close(hidden, expected.last_hidden_state)


ROUND_TRIPS = {
    "transformer": lambda: transformer(),
    "transformer-projected": lambda: transformer(pooling="cls", embedding_dim=6),
    "bag": lambda: bag(pooling="weighted_mean", embedding_dim=5),
    "cnn": lambda: cnn(num_layers=2, embedding_dim=5),
    "towers": lambda: TwoTowerEncoder(bag(embedding_dim=5), cnn(embedding_dim=5)),
}


@pytest.mark.parametrize("name", ROUND_TRIPS)
def test_export_and_load_give_the_same_embeddings(tmp_path, name):
    encoder = ROUND_TRIPS[name]().eval()
    with torch.no_grad():
        for param in encoder.parameters():  # not the initial weights: the export keeps trained ones
            param.add_(0.01 * torch.randn_like(param))
    out = export_huggingface(EmbeddingModel(encoder), TOKENIZER, tmp_path / "x")
    loaded = load_exported_encoder(out).eval()
    assert type(loaded) is type(encoder)
    batch = features(TEXTS, is_query=[i % 2 == 0 for i in range(len(TEXTS))])
    with torch.no_grad():
        torch.testing.assert_close(loaded(batch), encoder(batch))


def test_a_token_encoder_exports_its_state_dict_and_config(tmp_path):
    encoder = bag(pooling="max", embedding_dim=5)
    TOKENIZER.save(str(tmp_path / "tokenizer.json"))
    out = export_huggingface(encoder, tmp_path / "tokenizer.json", tmp_path / "bag")
    config = json.loads((out / "encoder_config.json").read_text())
    assert config["class"] == "BagOfTokensEncoder"
    assert config["arguments"] == {
        "vocab_size": VOCAB,
        "token_dim": 12,
        "pooling": "max",
        "embedding_dim": 5,
        "dropout": 0.0,
    }
    state = torch.load(out / "encoder_state.pt", weights_only=True)
    assert sorted(state) == sorted(encoder.state_dict())
    assert transformers.AutoTokenizer.from_pretrained(str(out)).pad_token == "[PAD]"


def test_sentence_transformers_needs_a_transformer(tmp_path):
    with pytest.raises(ValueError, match=r"needs a TransformerEncoder .* got BagOfTokensEncoder") as error:
        export_sentence_transformers(bag(), TOKENIZER, tmp_path / "st")
    assert "\n" not in str(error.value)
    towers = TwoTowerEncoder(transformer(), bag(embedding_dim=16))
    with pytest.raises(
        ValueError, match=r"got a TwoTowerEncoder of TransformerEncoder and BagOfTokensEncoder;"
    ):
        export_sentence_transformers(towers, TOKENIZER, tmp_path / "st")
    assert not (tmp_path / "st").exists()


def test_export_errors_are_named(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.txt").write_text("x")
    with pytest.raises(ValueError, match="exists and is not an empty directory"):
        export_huggingface(bag(), TOKENIZER, tmp_path / "full")
    with pytest.raises(ValueError, match=f"the tokenizer has {VOCAB} tokens but the encoder embeds 10"):
        export_huggingface(BagOfTokensEncoder(vocab_size=10, token_dim=4), TOKENIZER, tmp_path / "small")
    with pytest.raises(ValueError, match=f"the tokenizer has {VOCAB} tokens but the encoder embeds 10"):
        towers = TwoTowerEncoder(bag(), BagOfTokensEncoder(vocab_size=10, token_dim=12))
        export_huggingface(towers, TOKENIZER, tmp_path / "towers")
    small_transformer = TransformerEncoder(vocab_size=10, config=bert_config())
    with pytest.raises(ValueError, match=f"the tokenizer has {VOCAB} tokens but the encoder embeds 10"):
        export_sentence_transformers(small_transformer, TOKENIZER, tmp_path / "st")
    assert not any((tmp_path / name).exists() for name in ("small", "towers", "st"))  # nothing half-written
    with pytest.raises(InputTypeError, match=r"exports TransformerEncoder, .* got Linear"):
        export_huggingface(torch.nn.Linear(2, 2), TOKENIZER, tmp_path / "linear")
    with pytest.raises(InputTypeError, match=r"tokenizer must be a tokenizers\.Tokenizer"):
        export_huggingface(bag(), {"vocab": 1}, tmp_path / "dict")
    with pytest.raises(ValueError, match=r"is not a tokenizer\.json file"):
        export_huggingface(bag(), tmp_path / "absent.json", tmp_path / "absent")
    with pytest.raises(ValueError, match=r"holds no encoder_config\.json"):
        load_exported_encoder(tmp_path)


def test_special_tokens_are_found_or_given():
    tokenizer = pretrained_tokenizer(TOKENIZER, special_tokens={"mask_token": "[UNK]"})
    assert (tokenizer.unk_token, tokenizer.sep_token, tokenizer.mask_token) == ("[UNK]", "[SEP]", "[UNK]")
    with pytest.raises(ValueError, match="special_tokens has the role 'bos'"):
        pretrained_tokenizer(TOKENIZER, special_tokens={"bos": "[CLS]"})
    with pytest.raises(ValueError, match=r"special_tokens\['pad_token'\] is '<pad>', which is not in"):
        pretrained_tokenizer(TOKENIZER, special_tokens={"pad_token": "<pad>"})
    assert pretrained_tokenizer(tokenizer) is tokenizer


def test_max_length_truncates_as_the_training_data_did(tmp_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    encoder = transformer().eval()
    data_tokenizer = SimpleNamespace(tokenizer=TOKENIZER, pad_id=PAD)  # the text loaders' wrapper
    out = export_sentence_transformers(encoder, data_tokenizer, tmp_path / "st", max_length=6)
    loaded = sentence_transformers.SentenceTransformer(str(out), device="cpu")
    assert loaded.max_seq_length == 6
    with torch.no_grad():
        ours = torch.nn.functional.normalize(encoder(features(TEXTS, max_length=6)), dim=1)
    torch.testing.assert_close(loaded.encode(TEXTS, convert_to_tensor=True), ours, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="max_length is 65 but the model has only 64 positions"):
        export_huggingface(encoder, TOKENIZER, tmp_path / "long", max_length=65)
    with pytest.raises(ValueError, match="max_length must be an integer >= 1, got 0"):
        export_huggingface(bag(), TOKENIZER, tmp_path / "zero", max_length=0)
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    assert pretrained_tokenizer(hf, model_max_length=5).model_max_length == 5 and hf.model_max_length == 6


def test_the_padding_id_of_a_wrapped_tokenizer_names_the_pad_token():
    wrapped = SimpleNamespace(tokenizer=TOKENIZER, pad_id=TOKENIZER.token_to_id("[MASK]"))
    assert pretrained_tokenizer(wrapped).pad_token == "[MASK]"
