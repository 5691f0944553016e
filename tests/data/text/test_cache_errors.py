"""A text cache folder that cannot be used is one line naming it and what to do; a damaged cached
tokenizer is trained again."""

from __future__ import annotations

import errno
import os

import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.data.text import cache, text_identity, tokenized
from composer_dynsample.data.text import tokenizer as text_tokenizer
from composer_dynsample.data.text.cache import TokenCacheError, check_cache_dir
from composer_dynsample.data.text.tokenized import tokenize_texts
from composer_dynsample.data.text.tokenizer import resolve_tokenizer
from tests.data.text.helpers import full_disk_open, read_only_folder

TEXTS = ["the cat sat on the mat", "a dog", "the cat and the dog sat together on a long mat by the door"]
TOKENIZER = text_tokenizer.train_tokenizer(TEXTS * 5, vocab_size=64)


def _tokenize(cache, texts=TEXTS):
    options = {"data_sha256": "d" * 64, "tokenizer_sha256": "t" * 64, "layout": "test", "source": "t.jsonl"}
    return tokenize_texts(texts, TOKENIZER, max_length=32, cache_dir=cache, **options)


def _resolve(cache):
    return resolve_tokenizer(None, TEXTS * 5, cache_dir=cache, vocab_size=64)


@pytest.fixture
def no_training(monkeypatch):
    """Fail if a tokenizer is trained: the cache folder must be checked first."""

    def refuse(*args, **kwargs):
        raise AssertionError("trained a tokenizer before checking the cache folder")

    monkeypatch.setattr(text_tokenizer, "train_tokenizer", refuse)


def test_a_cache_dir_that_is_a_file_is_refused_before_training(tmp_path, no_training):
    file = tmp_path / "cache"
    file.write_text("not a folder")
    expected = rf"cannot write the text cache in {file}: {file} is a file, not a folder; set cache_dir"
    with pytest.raises(TokenCacheError, match=expected):
        _resolve(file)
    with pytest.raises(TokenCacheError, match=expected):
        _tokenize(file)
    with pytest.raises(TokenCacheError, match=rf"{file} is a file, not a folder"):  # a parent that is a file
        check_cache_dir(file / "text")
    assert file.read_text() == "not a folder"


def test_a_read_only_cache_dir_is_refused_before_training(tmp_path, no_training):
    with read_only_folder(tmp_path / "cache") as folder:
        with pytest.raises(TokenCacheError, match=rf"in {folder}: Permission denied; make it writable"):
            _resolve(folder)
        with pytest.raises(TokenCacheError, match=rf"in {folder}: Permission denied; make it writable"):
            _tokenize(folder)
        assert list(folder.iterdir()) == []


def test_a_folder_that_cannot_be_written_is_refused_for_any_user(tmp_path, monkeypatch, no_training):
    """As the read-only case, where file modes do not apply (root): the write check is what fails."""

    def denied(*args, dir=None, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", os.path.join(dir, "x"))

    monkeypatch.setattr(cache.tempfile, "mkstemp", denied)
    with pytest.raises(TokenCacheError, match=rf"in {tmp_path}: Permission denied; make it writable"):
        _resolve(tmp_path)
    with pytest.raises(TokenCacheError, match=rf"in {tmp_path}: Permission denied; make it writable"):
        _tokenize(tmp_path)


def test_a_full_disk_while_writing_a_store_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenized, "open", full_disk_open, raising=False)
    with pytest.raises(TokenCacheError) as caught:
        _tokenize(tmp_path)
    message = str(caught.value)
    assert message == (
        f"cannot write the text cache in {tmp_path}: No space left on device; free space there, or set "
        "cache_dir to a folder on a disk with room."
    )
    assert list(tmp_path.iterdir()) == []  # the temporary folder is removed
    monkeypatch.undo()
    assert len(_tokenize(tmp_path)) == 3  # and a later run with room builds it


def test_a_full_disk_while_caching_a_trained_tokenizer_is_one_line(tmp_path, monkeypatch):
    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(text_tokenizer, "_atomic_write_text", full)
    with pytest.raises(TokenCacheError, match=rf"in {tmp_path}: No space left on device; free space there"):
        _resolve(tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_a_damaged_cached_tokenizer_is_trained_again_and_replaced(tmp_path, damage):
    first = _resolve(tmp_path)
    cached = first.path
    original = cached.read_text()
    cached.write_text(original[: len(original) // 2] if damage == "truncated" else "")
    again = _resolve(tmp_path)
    assert again.sha256 == first.sha256 and again.path == cached
    assert cached.read_text() == original
    assert [path.name for path in tmp_path.iterdir()] == [cached.name]  # no temporary file left


def test_a_damaged_token_store_is_still_named_for_deletion(tmp_path):
    store = _tokenize(tmp_path)
    (store.directory / "offsets.npy").write_bytes(b"garbage")
    with pytest.raises(TokenCacheError, match=rf"{store.directory}: unreadable token store .*Delete "):
        _tokenize(tmp_path)


def test_a_save_path_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    target = tmp_path / "file" / "tokenizer.json"
    with pytest.raises(ValueError, match=rf"cannot write the tokenizer to {target}: .*; give save_tokenizer"):
        resolve_tokenizer(None, TEXTS * 5, cache_dir=tmp_path / "cache", vocab_size=64, save_path=target)


def test_text_hash_of_a_long_text_is_its_normalised_form_hashed_a_chunk_at_a_time():
    import hashlib

    import numpy as np

    def whole(text: str) -> int:
        digest = hashlib.blake2b(
            tokenized.normalise_text(text).encode("utf-8", "surrogatepass"), digest_size=8
        )
        return int.from_bytes(digest.digest(), "little") >> 1

    rng = np.random.default_rng(0)
    pieces = [
        "Straße",
        "\uff21\uff22\uff23",
        "x\u00a0y",
        "ﬁle",
        "  ",
        " \n\t ",
        "e\u0301",
        "Σ",
        "word",
        "\u2003",
    ]
    text = "".join(rng.choice(pieces, 4000).tolist())
    for chunk in (1, 7, 64, 1 << 20):
        parts = list(text_identity._normalised_parts(text, chunk))
        assert "".join(parts) == tokenized.normalise_text(text), chunk
    assert tokenized.text_hash(text) == whole(text)
    long = ("Ab  " * 600_000) + "\uff38\uff39\u00a0 end "  # 2.4M characters: hashed in chunks of 2**20
    assert tokenized.text_hash(long) == whole(long) and tokenized.text_hash(" ") == whole(" ")
