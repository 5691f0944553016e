"""The memory-mapped token store, its atomic writer, and tokenizing into the cache."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.data.text import tokenized
from composer_dynsample.data.text.cache import TokenCacheError
from composer_dynsample.data.text.tokenized import (
    TextInterner,
    TokenStore,
    TokenStoreWriter,
    text_hash,
    tokenize_texts,
)
from composer_dynsample.data.text.tokenizer import train_tokenizer

TEXTS = ["the cat sat on the mat", "a dog", "the cat and the dog sat together on a long mat by the door"]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS * 5, vocab_size=64)


def _tokenize(texts, tokenizer, cache, **kwargs):
    options = {
        "max_length": 32,
        "data_sha256": "d" * 64,
        "tokenizer_sha256": "t" * 64,
        "layout": "test",
        "source": "test.jsonl",
    }
    options.update(kwargs)
    return tokenize_texts(texts, tokenizer, cache_dir=cache, **options)


def _store(folder, rows):
    with TokenStoreWriter(folder, {"max_length": 9}) as writer:
        writer.append(np.concatenate(rows), np.array([len(r) for r in rows]), np.arange(len(rows)))
    return TokenStore(folder)


def test_store_round_trip_and_memory_map(tmp_path):
    rows = [np.array([2, 5, 3]), np.array([2, 3]), np.array([2, 9, 9, 9, 3])]
    store = _store(tmp_path / "tokens", rows)
    assert len(store) == 3 and store.num_tokens == 10 and store.max_length == 9
    assert isinstance(store.ids, np.memmap) and store.ids.dtype == np.uint32
    assert [store.row(i).tolist() for i in range(3)] == [r.tolist() for r in rows]
    assert store.lengths().tolist() == [3, 2, 5]


def test_pad_pads_to_the_longest_row_of_the_batch(tmp_path):
    store = _store(tmp_path / "tokens", [np.array([2, 5, 3]), np.array([2, 3]), np.array([2, 9, 9, 9, 3])])
    ids, mask = store.pad(np.array([1, 0, 1]), pad_id=7)
    assert ids.dtype == np.int64 and mask.dtype == np.int64
    assert ids.tolist() == [
        [2, 3, 7],
        [2, 5, 3],
        [2, 3, 7],
    ]  # width 3, not max_length (9) nor the longest text (5)
    assert mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 0]]


def test_pickling_sends_the_path_not_the_ids(tmp_path):
    rows = [np.arange(1000) % 50 for _ in range(50)]
    store = _store(tmp_path / "tokens", rows)
    data = pickle.dumps(store)
    assert len(data) < 1000  # 50,000 ids would be 200 kB
    copy = pickle.loads(data)
    assert np.array_equal(copy.row(3), store.row(3)) and isinstance(copy.ids, np.memmap)


def test_writer_leaves_nothing_when_interrupted(tmp_path):
    with pytest.raises(KeyboardInterrupt), TokenStoreWriter(tmp_path / "tokens", {}) as writer:
        writer.append(np.array([1, 2]), np.array([2]), np.array([0]))
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_writer_keeps_a_store_that_won_the_race(tmp_path):
    first = _store(tmp_path / "tokens", [np.array([1, 2])])
    _store(tmp_path / "tokens", [np.array([3, 4, 5])])  # a second process finishing the same cache later
    assert TokenStore(tmp_path / "tokens").row(0).tolist() == first.row(0).tolist() == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["tokens"]


def test_writer_checks_its_input(tmp_path):
    with TokenStoreWriter(tmp_path / "tokens", {}) as writer:
        with pytest.raises(ValueError, match="append got 3 ids for lengths summing to 2"):
            writer.append(np.array([1, 2, 3]), np.array([2]), np.array([0]))
        with pytest.raises(ValueError, match="must fit in uint32"):
            writer.append(np.array([-1]), np.array([1]), np.array([0]))


def test_a_damaged_store_raises_one_line_with_the_fix(tmp_path):
    store = _store(tmp_path / "tokens", [np.array([1, 2])])
    (store.directory / "meta.json").write_text('{"num_texts": 5, "num_tokens": 2}')
    with pytest.raises(
        TokenCacheError, match=r"do not match meta\.json .* Delete .*tokens to tokenize again"
    ):
        TokenStore(store.directory)
    (store.directory / "offsets.npy").unlink()
    with pytest.raises(TokenCacheError, match=r"offsets\.npy is missing"):
        TokenStore(store.directory)


def test_text_hash_is_63_bits_of_the_normalised_text():
    assert text_hash("Hello\u00a0 World") == text_hash("hello world")  # NFKC, case, whitespace
    assert text_hash("hello world") != text_hash("hello  worlds")
    values = [text_hash(f"text {i}") for i in range(1000)]
    assert all(0 <= v < 2**63 for v in values) and len(set(values)) == 1000


def test_interner_numbers_distinct_texts():
    interner = TextInterner()
    assert interner.add_all(["b", "a", "b"]).tolist() == [0, 1, 0] and interner.texts == ["b", "a"]


def test_tokenize_writes_then_reads_the_cache(tmp_path, tokenizer, monkeypatch):
    first = _tokenize(TEXTS, tokenizer, tmp_path)
    assert not first.from_cache and first.meta["max_length"] == 32
    assert first.row(1).tolist() == tokenizer.encode("a dog").ids
    assert first.text_hash.tolist() == [text_hash(t) for t in TEXTS]

    def fail(*args):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(tokenized, "encode_chunk", fail)
    again = _tokenize(TEXTS, tokenizer, tmp_path)
    assert again.from_cache and again.directory == first.directory
    for change in (
        {"data_sha256": "e" * 64},
        {"tokenizer_sha256": "u" * 64},
        {"max_length": 31},
        {"layout": "other"},
    ):
        with pytest.raises(AssertionError, match="tokenized again"):
            _tokenize(TEXTS, tokenizer, tmp_path, **change)


def test_an_interrupted_tokenization_leaves_no_cache(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(tokenized, "_CHUNK", 1)
    calls = []
    original = tokenized.encode_chunk

    def interrupted(encoder, texts):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(encoder, texts)

    monkeypatch.setattr(tokenized, "encode_chunk", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _tokenize(TEXTS, tokenizer, tmp_path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(tokenized, "encode_chunk", original)
    assert not _tokenize(TEXTS, tokenizer, tmp_path).from_cache


def test_truncation_is_counted_and_reported_once_per_load(tmp_path, tokenizer):
    with pytest.warns(
        UserWarning, match=r"1 of 3 distinct texts in test\.jsonl are longer than max_length=8 tokens"
    ):
        store = _tokenize(TEXTS, tokenizer, tmp_path, max_length=8)
    assert store.num_truncated == 1 and store.lengths().tolist() == [
        8,
        4,
        8,
    ]  # exactly max_length is no truncation
    with pytest.warns(UserWarning, match="were truncated") as record:
        assert _tokenize(TEXTS, tokenizer, tmp_path, max_length=8).num_truncated == 1  # from the cache
    assert len(record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _tokenize(TEXTS, tokenizer, tmp_path, max_length=64)


def test_a_text_without_tokens_is_an_error_naming_it(tmp_path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    bare = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    bare.normalizer = normalizers.BertNormalizer(clean_text=True)  # drops format characters such as U+200B
    bare.pre_tokenizer = pre_tokenizers.Whitespace()
    with pytest.raises(ValueError, match=r"WHERE 1: the text encodes to no tokens"):
        _tokenize(["a", "\u200b"], bare, tmp_path, locate=lambda i: f"WHERE {i}")
    assert list(tmp_path.iterdir()) == []


def test_a_cache_with_another_text_count_is_refused(tmp_path, tokenizer):
    _tokenize(TEXTS, tokenizer, tmp_path)
    with pytest.raises(TokenCacheError, match=r"holds 3 texts but test\.jsonl has 2"):
        _tokenize(TEXTS[:2], tokenizer, tmp_path)


def test_progress_bar_only_when_asked_or_on_a_terminal(tmp_path, tokenizer, capfd):
    _tokenize(TEXTS, tokenizer, tmp_path / "a")  # stderr is not a terminal under pytest
    assert capfd.readouterr().err == ""
    _tokenize(TEXTS, tokenizer, tmp_path / "b", progress=True)
    assert "tokenizing test.jsonl" in capfd.readouterr().err
