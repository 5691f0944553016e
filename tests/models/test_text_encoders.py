"""The text encoders: shapes, masking, pooling, projection, towers, AMP, chunking and the Trainer.

The shared pieces (a WordPiece tokenizer built from a few sentences, a tiny BERT config, the text batch of
the collate's contract) are in tests/models/text_helpers.py, which tests/test_export.py and
tests/distributed/ use too.
"""

from __future__ import annotations

import pytest
import torch

from composer_dynsample import EmbeddingModel, InfoNCELoss
from composer_dynsample.models.text import (
    TransformerEncoder,
    TwoTowerEncoder,
    masked_max_pool,
    masked_mean_pool,
)
from composer_dynsample.validation import InputTypeError
from tests.models.text_helpers import (
    TEXTS,
    VOCAB,
    PairDataset,
    bag,
    bert_config,
    cnn,
    features,
    fit_transformer,
    transformer,
)

ENCODERS = {
    "transformer-mean": lambda: transformer(),
    "transformer-cls-projected": lambda: transformer(pooling="cls", embedding_dim=6),
    "bag-mean": lambda: bag(),
    "bag-max-projected": lambda: bag(pooling="max", embedding_dim=6),
    "bag-weighted_mean": lambda: bag(pooling="weighted_mean"),
    "cnn": lambda: cnn(),
    "cnn-3-layers-projected": lambda: cnn(num_layers=3, kernel_size=5, embedding_dim=6),
}


@pytest.mark.parametrize("name", ENCODERS)
def test_shapes_and_dimensions(name):
    encoder = ENCODERS[name]().eval()
    embeddings = encoder(features(TEXTS[:5]))
    assert embeddings.shape == (5, encoder.embedding_dim)
    assert encoder.embedding_dim == (6 if "projected" in name else {"t": 16, "b": 12, "c": 10}[name[0]])


@pytest.mark.parametrize("name", ENCODERS)
def test_padding_does_not_change_an_embedding(name):
    encoder = ENCODERS[name]().eval()
    text = TEXTS[3]
    alone = encoder(features([text]))
    batched = encoder(features([TEXTS[7], text, TEXTS[0]], length=30))[1:2]
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)
    # Whatever the padding ids hold: the mask alone decides.
    noisy = features([text], length=20)
    noisy["input_ids"][noisy["attention_mask"] == 0] = 7
    torch.testing.assert_close(encoder(noisy), alone, atol=1e-5, rtol=1e-5)


def test_mean_pooling_is_the_average_over_the_mask_and_cls_the_first_position():
    encoder = transformer().eval()
    batch = features(TEXTS[:3], length=25)
    hidden = encoder.model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
    ).last_hidden_state
    for row in range(3):
        tokens = int(batch["attention_mask"][row].sum())
        torch.testing.assert_close(encoder(batch)[row], hidden[row, :tokens].mean(0))
    cls = transformer(pooling="cls").eval()
    torch.testing.assert_close(cls(batch), hidden[:, 0])


def test_masked_pooling_functions():
    hidden = torch.tensor([[[1.0, -1.0], [3.0, 5.0], [9.0, 9.0]], [[2.0, 2.0], [4.0, 4.0], [6.0, 6.0]]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert masked_mean_pool(hidden, mask).tolist() == [[2.0, 2.0], [0.0, 0.0]]
    assert masked_max_pool(hidden, mask).tolist() == [[3.0, 5.0], [0.0, 0.0]]


def test_bag_of_tokens_pooling_modes_match_their_definitions():
    batch = features(TEXTS[:2], length=20)
    mask = batch["attention_mask"].bool()
    for pooling in ("mean", "max", "weighted_mean"):
        encoder = bag(pooling=pooling)
        tokens = encoder.embedding(batch["input_ids"])
        for row in range(2):
            kept = tokens[row][mask[row]]
            if pooling == "mean":
                expected = kept.mean(0)
            elif pooling == "max":
                expected = kept.amax(0)
            else:
                weights = torch.sigmoid(encoder.token_weight(kept))
                expected = (kept * weights).sum(0) / weights.sum()
            torch.testing.assert_close(encoder(batch)[row], expected)


def test_projection_is_the_linear_layer_on_the_pooled_tokens():
    plain, projected = bag(), bag(embedding_dim=5)
    projected.embedding.load_state_dict(plain.embedding.state_dict())
    batch = features(TEXTS[:4])
    torch.testing.assert_close(projected(batch), projected.projection(plain(batch)))


@pytest.mark.parametrize("factory", [bag, cnn])
def test_token_encoders_are_deterministic_given_the_seed(factory):
    batch = features(TEXTS)
    first, second = factory(dropout=0.2), factory(dropout=0.2)
    for a, b in zip(first.state_dict().values(), second.state_dict().values()):
        assert torch.equal(a, b)
    torch.manual_seed(3)
    out = first(batch)
    torch.manual_seed(3)
    assert torch.equal(second(batch), out)


@pytest.mark.parametrize("name", ["transformer-mean", "bag-mean", "cnn"])
def test_an_id_outside_the_vocabulary_is_named(name):
    encoder = ENCODERS[name]()
    batch = features(TEXTS[:2])
    batch["input_ids"][1, 1] = VOCAB
    with pytest.raises(ValueError, match=rf"input_ids hold token id {VOCAB} but vocab_size is {VOCAB}"):
        encoder(batch)
    batch["input_ids"][1, 1] = -1
    with pytest.raises(ValueError, match="token id -1"):
        encoder(batch)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"attention_mask": torch.ones(2, 3)}, "missing 'input_ids'"),
        ({"input_ids": torch.ones(2, 3)}, r"input_ids must be a \(B, L\) integer tensor"),
        ({"input_ids": torch.ones(6, dtype=torch.long)}, "integer tensor, got a tensor of shape"),
        (
            {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.ones(2, 4)},
            "attention_mask",
        ),
    ],
)
def test_malformed_features_are_named(bad, match):
    with pytest.raises(InputTypeError, match=match):
        bag()(bad)


def test_transformer_arguments_are_checked():
    with pytest.raises(ValueError, match=r"exactly one of path .* got neither"):
        TransformerEncoder(vocab_size=10)
    with pytest.raises(ValueError, match="got both"):
        TransformerEncoder(vocab_size=10, path="x", config=bert_config())
    with pytest.raises(ValueError, match=r"model_type'\] must be a transformers model type .* got 'bort'"):
        TransformerEncoder(vocab_size=10, config=bert_config(model_type="bort"))
    with pytest.raises(
        ValueError, match="has no argument 'num_hidden_layer'; did you mean 'num_hidden_layers'"
    ):
        TransformerEncoder(vocab_size=10, config={**bert_config(), "num_hidden_layer": 1})
    with pytest.raises(ValueError, match=r"config\['vocab_size'\] is 99 but vocab_size .* is 10"):
        TransformerEncoder(vocab_size=10, config=bert_config(vocab_size=99))
    with pytest.raises(ValueError, match="needs vocab_size"):
        TransformerEncoder(config=bert_config())
    with pytest.raises(ValueError, match="pooling must be one of"):
        TransformerEncoder(vocab_size=10, config=bert_config(), pooling="avg")
    assert TransformerEncoder(config=bert_config(vocab_size=30)).vocab_size == 30


def test_a_missing_model_directory_is_refused_in_one_line(tmp_path):
    for path, reason in ((tmp_path / "absent", "does not exist"), (tmp_path, "holds no config.json")):
        with pytest.raises(ValueError, match=f"{reason}. TransformerEncoder never downloads") as error:
            TransformerEncoder(vocab_size=10, path=path)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="does not exist"):
        TransformerEncoder(path="bert-base-uncased")  # a Hub name is not fetched


def test_a_local_model_directory_loads_and_its_vocabulary_bounds_vocab_size(tmp_path):
    source = transformer()
    source.model.save_pretrained(tmp_path)
    loaded = TransformerEncoder(path=tmp_path).eval()
    assert loaded.vocab_size == VOCAB and loaded.model.pooler is None
    batch = features(TEXTS[:3])
    torch.testing.assert_close(loaded(batch), source.eval()(batch))
    assert TransformerEncoder(path=tmp_path, vocab_size=VOCAB - 5).vocab_size == VOCAB - 5
    with pytest.raises(ValueError, match=f"vocab_size is {VOCAB + 1} .* embeds only {VOCAB} tokens"):
        TransformerEncoder(path=tmp_path, vocab_size=VOCAB + 1)


def test_every_transformer_parameter_gets_a_gradient():
    # The model's own pooler is dropped: DDP without find_unused_parameters needs every gradient.
    encoder = transformer(embedding_dim=4)
    encoder(features(TEXTS)).sum().backward()
    missing = [name for name, param in encoder.named_parameters() if param.grad is None]
    assert missing == []


def test_two_towers_route_rows_by_is_query_and_keep_their_order():
    torch.manual_seed(0)
    towers = TwoTowerEncoder(bag(embedding_dim=6), cnn(embedding_dim=6))
    flags = [i % 3 == 0 for i in range(len(TEXTS))]
    batch = features(TEXTS, is_query=flags)
    embeddings = towers(batch)
    queries = [i for i, flag in enumerate(flags) if flag]
    passages = [i for i, flag in enumerate(flags) if not flag]
    expected_queries = towers.query_encoder(
        features([TEXTS[i] for i in queries], length=batch["input_ids"].shape[1])
    )
    expected_passages = towers.passage_encoder(
        features([TEXTS[i] for i in passages], length=batch["input_ids"].shape[1])
    )
    torch.testing.assert_close(embeddings[queries], expected_queries)
    torch.testing.assert_close(embeddings[passages], expected_passages)


def test_an_idle_tower_still_gets_a_zero_gradient():
    towers = TwoTowerEncoder(bag(), bag())
    towers(features(TEXTS[:4], is_query=[False] * 4)).sum().backward()
    grads = [param.grad for param in towers.query_encoder.parameters()]
    assert all(grad is not None and not grad.any() for grad in grads)
    assert towers.passage_encoder.embedding.weight.grad.any()


def test_two_tower_errors_are_named():
    with pytest.raises(ValueError, match="query_encoder embeds to 12 dimensions but passage_encoder to 6"):
        TwoTowerEncoder(bag(), bag(embedding_dim=6))
    with pytest.raises(InputTypeError, match=r"passage_encoder must be a torch\.nn\.Module"):
        TwoTowerEncoder(bag(), "bag")
    towers = TwoTowerEncoder(bag(), bag())
    batch = features(TEXTS[:3])
    with pytest.raises(InputTypeError, match=r"is_query'\], a \(B,\) bool tensor, got a tensor"):
        towers({**batch, "is_query": torch.tensor([1, 0, 1])})
    with pytest.raises(InputTypeError, match="got no is_query"):
        towers({"input_ids": batch["input_ids"]})
    with pytest.raises(ValueError, match="one batch size"):
        towers({**batch, "is_query": torch.tensor([True, False])})


@pytest.mark.parametrize("name", ["transformer-cls-projected", "bag-max-projected", "cnn"])
def test_bf16_autocast_on_cpu_through_the_embedding_model(name):
    model = EmbeddingModel(ENCODERS[name](), InfoNCELoss(temperature=0.1))
    batch = {"features": features(TEXTS), "labels": torch.arange(len(TEXTS)) // 2}
    reference = model(batch).detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        embeddings = model(batch)
        loss = model.loss(embeddings, batch)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert (embeddings.float() - reference).abs().max() < 0.1  # bf16 keeps about 3 digits


def _gradients(model: EmbeddingModel, batch: dict) -> list[torch.Tensor]:
    model.zero_grad()
    model.loss(model(batch), batch).backward()
    return [param.grad.clone() for param in model.parameters()]


@pytest.mark.parametrize("name", ["transformer-mean", "cnn", "towers"])
def test_forward_chunk_size_gives_the_unchunked_gradient(name):
    torch.manual_seed(0)
    encoder = TwoTowerEncoder(transformer(), transformer()) if name == "towers" else ENCODERS[name]()
    flags = [i % 2 == 0 for i in range(len(TEXTS))]
    batch = {"features": features(TEXTS, is_query=flags), "labels": torch.arange(len(TEXTS)) // 2}
    model = EmbeddingModel(encoder, InfoNCELoss(temperature=0.1))
    expected = _gradients(model, batch)
    model.forward_chunk_size = 5
    for grad, want in zip(_gradients(model, batch), expected):
        torch.testing.assert_close(grad, want, atol=1e-6, rtol=1e-5)
    assert sum(g.abs().sum() for g in expected) > 0


def test_transformer_dropout_is_replayed_by_the_chunk_recomputation():
    torch.manual_seed(0)
    encoder = TransformerEncoder(vocab_size=VOCAB, config=bert_config(hidden_dropout_prob=0.3))
    batch = {"features": features(TEXTS), "labels": torch.arange(len(TEXTS)) // 2}
    model = EmbeddingModel(encoder, InfoNCELoss(temperature=0.1), forward_chunk_size=6)
    torch.manual_seed(5)
    reference = torch.cat([model._embed(part) for part in _chunks(batch["features"], 3)])
    model.loss(reference, batch).backward()
    expected = [param.grad.clone() for param in model.parameters()]
    model.zero_grad()
    torch.manual_seed(5)
    embeddings = model(batch)
    torch.testing.assert_close(embeddings, reference)
    model.loss(embeddings, batch).backward()
    for param, want in zip(model.parameters(), expected):
        torch.testing.assert_close(param.grad, want)


def _chunks(values: dict, count: int) -> list[dict]:
    parts = {key: value.tensor_split(count) for key, value in values.items()}
    return [dict(zip(parts, chunk)) for chunk in zip(*parts.values())]


def test_the_transformer_trains_through_the_composer_trainer():
    start = transformer(embedding_dim=8)
    batch = PairDataset().collate([(i, 0) for i in range(len(TEXTS))])
    model = fit_transformer()
    before = EmbeddingModel(start, InfoNCELoss(temperature=0.1)).eval()
    model.eval()
    with torch.no_grad():
        loss_before = before.loss(before(batch), batch)
        loss_after = model.loss(model(batch), batch)
    assert loss_after < loss_before  # training fitted the pairs
    assert not torch.equal(model.encoder.projection.weight, start.projection.weight)
