"""The text loaders' tokenizer: deterministic training, local loading only, one-line errors."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.data.text import tokenizer as text_tokenizer
from composer_dynsample.data.text.tokenizer import load_tokenizer, resolve_tokenizer, train_tokenizer

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "naïve",
    "Ünïcødé",
    "def",
    "return",
    "self",
    "x_1",
    "foo.bar",
    "sort",
]


def _corpus(n: int = 3000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    suffixes = ["", "s", "ing", "ed", "er", "_id"]
    return [
        " ".join(rng.choice(WORDS) + rng.choice(suffixes) for _ in range(rng.randint(1, 20)))
        for _ in range(n)
    ]


@pytest.mark.parametrize("model", ["wordpiece", "bpe"])
def test_training_twice_gives_the_same_json(model):
    texts = _corpus()
    serialised = {train_tokenizer(texts, model=model, vocab_size=400).to_str() for _ in range(4)}
    assert len(serialised) == 1


def test_wordpiece_without_the_fixed_continuations_is_not_deterministic(monkeypatch):
    """The library's WordPiece trainer numbers '##x' in hash-map order: what the fixed alphabet prevents."""
    monkeypatch.setattr(text_tokenizer, "_alphabet", lambda texts, normalizer: [])
    texts = _corpus()
    serialised = {train_tokenizer(texts, model="wordpiece", vocab_size=400).to_str() for _ in range(6)}
    assert len(serialised) > 1


def test_trained_tokenizer_layout():
    tokenizer = train_tokenizer(_corpus(), vocab_size=400)
    assert [tokenizer.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [
        0,
        1,
        2,
        3,
        4,
    ]
    encoding = tokenizer.encode("Alpha betas")
    assert encoding.tokens[0] == "[CLS]" and encoding.tokens[-1] == "[SEP]"
    assert len(tokenizer.get_added_tokens_decoder()) == 5  # only the real special tokens are special
    cased = train_tokenizer(_corpus(), vocab_size=400, lowercase=False)
    assert cased.encode("Alpha").tokens != tokenizer.encode("Alpha").tokens


def test_training_options_are_checked():
    with pytest.raises(ValueError, match="tokenizer_model must be one of"):
        train_tokenizer(["a"], model="unigram")
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 64"):
        train_tokenizer(["a"], vocab_size=10)


def test_load_tokenizer_json_and_pad_id(tmp_path):
    file = tmp_path / "tokenizer.json"
    trained = train_tokenizer(_corpus(), vocab_size=400)
    trained.enable_padding(pad_id=0, pad_token="[PAD]", length=50)
    trained.enable_truncation(7)
    trained.save(str(file))
    loaded = load_tokenizer(file)
    assert loaded.pad_id == 0 and loaded.path == file
    assert (
        loaded.tokenizer.padding is None and loaded.tokenizer.truncation is None
    )  # the collate pads, the loader truncates
    assert loaded.vocab_size == trained.get_vocab_size(with_added_tokens=True)


def test_load_model_folder_with_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(_corpus(), vocab_size=400), pad_token="[PAD]"
    )
    fast.save_pretrained(str(tmp_path / "model"))
    loaded = load_tokenizer(tmp_path / "model")
    assert loaded.pad_id == 0
    assert loaded.tokenizer.encode("alpha beta").ids == fast("alpha beta")["input_ids"]


def test_a_hub_name_is_refused_in_one_line():
    with pytest.raises(
        FileNotFoundError, match=r"'bert-base-uncased' is not a file or folder; .*nothing is downloaded"
    ) as error:
        load_tokenizer("bert-base-uncased")
    assert "\n" not in str(error.value)


def test_a_tokenizer_file_that_does_not_parse(tmp_path):
    file = tmp_path / "tokenizer.json"
    file.write_text('{"version": "1.0", "model": ')
    with pytest.raises(ValueError, match=r"tokenizer\.json: not a tokenizers JSON file \(") as error:
        load_tokenizer(file)
    assert "\n" not in str(error.value)
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="folder: transformers could not load a tokenizer") as error:
        load_tokenizer(tmp_path / "folder")
    assert "\n" not in str(error.value)


def test_resolve_trains_once_caches_and_saves(tmp_path, monkeypatch):
    texts = _corpus(500)
    first = resolve_tokenizer(
        None, texts, cache_dir=tmp_path / "cache", vocab_size=200, save_path=tmp_path / "run"
    )
    assert first.path == tmp_path / "run"  # not a folder: the file itself
    assert load_tokenizer(first.path).sha256 == first.sha256

    def fail(*args, **kwargs):
        raise AssertionError("trained again instead of reading the cache")

    monkeypatch.setattr(text_tokenizer, "train_tokenizer", fail)
    (tmp_path / "run_dir").mkdir()
    again = resolve_tokenizer(
        None, texts, cache_dir=tmp_path / "cache", vocab_size=200, save_path=tmp_path / "run_dir"
    )
    assert again.sha256 == first.sha256 and again.path == tmp_path / "run_dir" / "tokenizer.json"
    with pytest.raises(AssertionError, match="trained again"):
        resolve_tokenizer(
            None, texts[:-1], cache_dir=tmp_path / "cache", vocab_size=200
        )  # other texts: a new key
