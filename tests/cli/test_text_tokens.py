"""Tokens on the text path: a cache folder that cannot be used, a multi-megabyte line, and a tokenizer
without a vocabulary, through the command line (exit 2, one line, no run folder) and the tokenizer."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from composer_dynsample.data.text import tokenized
from composer_dynsample.data.text._sources import check_unknown_tokens
from composer_dynsample.data.text.pairs import load_pairs
from composer_dynsample.data.text.tokenized import TokenStore, tokenize_texts
from composer_dynsample.data.text.tokenizer import load_tokenizer, train_tokenizer
from composer_dynsample.data.text.truncation import char_budget
from tests.cli.helpers import pairs_data, train_unevaluated
from tests.data.text.helpers import full_disk_open, pair_rows, read_only_folder, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ROWS = pair_rows(48, seed=0)
TEXTS = [row[column] for row in ROWS for column in ("anchor", "positive")]
PREFIX = "composer-dynsample train: error: data: "


@pytest.fixture
def folder(tmp_path):
    """Train and test pairs, and the config of a bag-of-tokens run on them."""
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "test.jsonl", pair_rows(12, seed=1))
    config = {
        "seed": 0,
        "data": pairs_data(tmp_path),
        "model": {"encoder": {"name": "bag_of_tokens", "token_dim": 8}, "loss": {"name": "info_nce"}},
        "sampler": {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2},
        "optimizer": {"name": "adamw", "lr": 0.01},
        "evaluation": {"ks": [1, 5]},
        "trainer": {"max_duration": "1ep", "progress_bar": False},
        "loggers": {},
    }
    (tmp_path / "pairs.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def _train_error(capsys, folder, *overrides: str) -> str:
    """The one line ``train`` exits with (code 2), having written no run folder."""
    with pytest.raises(SystemExit) as stop:
        main(["train", str(folder / "pairs.yaml"), *overrides, "--run-dir", str(folder / "run")])
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 2, error
    assert len(error.splitlines()) == 1, error
    assert error.startswith(PREFIX), error
    assert not (folder / "run").exists()
    return error[len(PREFIX) :]


# The cache folder.


def test_a_cache_dir_that_is_a_file_is_one_line(folder, capsys):
    (folder / "file").write_text("x")
    for cache in (folder / "file", folder / "file" / "text"):
        error = _train_error(capsys, folder, f"data.cache_dir={cache}")
        assert error == (
            f"cannot write the text cache in {cache}: {folder / 'file'} is a file, not a folder; set "
            "cache_dir to a folder, or move the file away."
        )


def test_a_read_only_cache_dir_is_one_line(folder, capsys):
    with read_only_folder(folder / "cache") as cache:
        error = _train_error(capsys, folder)
    assert error == (
        f"cannot write the text cache in {cache}: Permission denied; make it writable, or set cache_dir "
        "to a folder you can write."
    )


def test_a_cache_dir_that_cannot_be_written_is_one_line_for_any_user(folder, capsys, monkeypatch):
    """As the read-only case, where file modes do not apply (root): the write check is what fails."""
    cache = str(folder / "cache")
    make = tokenized.tempfile.mkstemp

    def denied(*args, dir=None, **kwargs):
        if str(dir).startswith(cache):
            raise PermissionError(errno.EACCES, "Permission denied", os.path.join(dir, "x"))
        return make(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tokenized.tempfile, "mkstemp", denied)
    error = _train_error(capsys, folder)
    assert error.startswith(f"cannot write the text cache in {cache}: Permission denied; make it writable")


def test_a_full_disk_while_tokenizing_is_one_line(folder, capsys, monkeypatch):
    monkeypatch.setattr(tokenized, "open", full_disk_open, raising=False)
    error = _train_error(capsys, folder)
    cache = folder / "cache"
    assert error == (
        f"cannot write the text cache in {cache}: No space left on device; free space there, or set "
        "cache_dir to a folder on a disk with room."
    )
    assert not [path for path in cache.iterdir() if path.name.startswith("tokens-")]


def test_a_truncated_cached_tokenizer_is_trained_again(folder, capsys):
    config = str(folder / "pairs.yaml")
    train_unevaluated(config, "1ep", folder / "first")
    [cached] = (folder / "cache").glob("tokenizer-*.json")
    original = cached.read_text()
    cached.write_text(original[:100])
    train_unevaluated(config, "1ep", folder / "second")
    assert cached.read_text() == original
    assert (folder / "second" / "tokenizer.json").read_text() == (
        folder / "first" / "tokenizer.json"
    ).read_text()


# A multi-megabyte line.


@pytest.fixture(scope="module")
def trained():
    return train_tokenizer(TEXTS, vocab_size=200)


def _tokenize(texts, tokenizer, cache, max_length=24):
    keys = {"data_sha256": "d" * 64, "tokenizer_sha256": "t" * 64, "layout": "test", "source": "t.jsonl"}
    return tokenize_texts(texts, tokenizer, max_length=max_length, cache_dir=cache, **keys)


def _reference(tokenizer, max_length=24):
    """The tokenizer as it was used on whole texts: truncating after encoding everything."""
    from tokenizers import Tokenizer

    reference = Tokenizer.from_str(tokenizer.to_str())
    reference.enable_truncation(max_length)
    return reference


@pytest.mark.parametrize("model", ["wordpiece", "bpe"])
def test_a_cut_text_gives_the_ids_of_the_whole_text_truncated(tmp_path, model):
    tokenizer = train_tokenizer(TEXTS, model=model, vocab_size=200)
    budget = char_budget(tokenizer, 24)
    words = " ".join(TEXTS)
    texts = [
        *TEXTS[:4],
        words,  # many words past the budget
        " " * (budget + 100) + words,  # the budget holds only whitespace: encoded again with more
        "sort " + " \n" * budget + words,  # one word, then whitespace past the budget
        "a" * (3 * budget) + " " + words,  # one word longer than the budget
        "x" * (budget - 3) + " sort list json",  # the cut splits a word
        " " * (budget - 60) + "x" * 150,  # the cut leaves 60 characters of a 150-character word
        " " * (budget - 60) + "x" * 150 + " " + words,
        "\ufdfa " * budget,  # NFKC makes 18 characters of each
    ]
    assert all(len(text) > budget for text in texts[4:])
    store = _tokenize(texts, tokenizer, tmp_path)
    encodings = [_reference(tokenizer).encode(text) for text in texts]
    assert [store.row(i).tolist() for i in range(len(texts))] == [encoding.ids for encoding in encodings]
    assert store.num_truncated == sum(1 for encoding in encodings if encoding.overflowing)


def test_a_long_text_that_fits_in_max_length_is_not_cut(tmp_path, trained):
    texts = [
        "sort " + " " * 50_000 + " list",
        "open" + "\u200b" * 30_000 + " file",
    ]  # spaces, dropped characters
    store = _tokenize(texts, trained, tmp_path)
    assert [store.row(i).tolist() for i in range(2)] == [_reference(trained).encode(t).ids for t in texts]
    assert store.num_truncated == 0


def test_a_multi_megabyte_line_is_cut_and_counted_as_truncated(tmp_path, trained):
    line = "".join(TEXTS) * 1000  # 3 MB on one line
    assert len(line) > 3_000_000
    store = _tokenize([*TEXTS, line], trained, tmp_path)
    assert store.row(len(TEXTS)).tolist() == _reference(trained).encode(line[:10_000]).ids
    assert store.lengths()[-1] == 24 and store.num_truncated == 1
    assert tokenized.text_hash(line) == store.text_hash[-1]  # the whole text, for duplicates


def test_memory_stays_bounded_by_max_length_for_a_huge_line(tmp_path):
    """Encoding a whole 5 MB line takes about 700 MB more at its peak: a cut one, a few. Measured in a
    new process, its peak reset just before (``/proc/self/clear_refs``), so nothing else counts."""
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from composer_dynsample.data.text.tokenizer import train_tokenizer
        from composer_dynsample.data.text.tokenized import tokenize_texts
        texts = {TEXTS!r}
        tokenizer = train_tokenizer(texts, vocab_size=200)
        line = " ".join(texts) * 1400
        keys = dict(data_sha256="d" * 64, tokenizer_sha256="t" * 64, layout="test", source="t.jsonl")
        def kb(name):
            status = Path("/proc/self/status").read_text().splitlines()
            return int(next(row for row in status if row.startswith(name + ":")).split()[1])
        Path("/proc/self/clear_refs").write_text("5")  # the peak resident size starts again from here
        start = kb("VmRSS")
        store = tokenize_texts([line], tokenizer, max_length=24, cache_dir={str(tmp_path)!r}, **keys)
        print(len(line), store.num_truncated, kb("VmHWM") - start)
        """
    )
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("no /proc/self/clear_refs to reset the peak memory with")
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    length, truncated, grown_kb = map(int, done.stdout.split())
    assert length > 4_000_000 and truncated == 1
    assert grown_kb < 100_000, f"tokenizing a {length}-character line took {grown_kb // 1024} MB more"


def test_a_tokenizer_is_trained_on_the_first_100000_characters_of_each_text():
    """Training on a whole 50 MB line takes gigabytes too; what lies past the cut is not learnt."""
    line = "sort list " * 10_000 + "ж" * 1000  # a character seen only past 100,000 characters
    tokenizer = train_tokenizer([*TEXTS, line], vocab_size=200)
    assert tokenizer.encode("ж sort").tokens == ["[CLS]", "[UNK]", "sort", "[SEP]"]
    assert train_tokenizer([*TEXTS, line[:100_000]], vocab_size=200).to_str() == tokenizer.to_str()


def test_a_loader_counts_a_huge_line_among_the_truncated(tmp_path):
    rows = [*ROWS, {"anchor": "minified bundle", "positive": "var a=b(c);" * 300_000}]
    write_jsonl(tmp_path / "train.jsonl", rows)
    splits = load_pairs(tmp_path / "train.jsonl", vocab_size=200, max_length=24, cache_dir=tmp_path / "c")
    assert splits.info.num_truncated >= 1
    [store] = [TokenStore(path) for path in splits.info.cache_dirs]
    assert store.lengths().max() == 24


# A tokenizer without a vocabulary.


def test_a_model_folder_without_a_vocabulary_is_one_line(folder, capsys):
    transformers = pytest.importorskip("transformers")
    bert = folder / "bert"
    transformers.BertConfig(
        vocab_size=1000, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    ).save_pretrained(bert)
    assert [path.name for path in bert.iterdir()] == ["config.json"]
    error = _train_error(capsys, folder, f"data.tokenizer={bert}")
    assert error.startswith(
        f"tokenizer {bert} has 5 tokens, all of them special ([PAD], [UNK], [CLS], [SEP], [MASK]): "
        "every word would encode as [UNK]. A model folder needs its vocabulary"
    ), error
    with pytest.raises(ValueError, match=r"has 5 tokens, all of them special"):
        load_tokenizer(bert)


def _few_words_tokenizer(path):
    """A WordPiece tokenizer.json that knows 'how' and 'to', and nothing else of the pairs."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "how", "to"])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.save(str(path))
    return path


def test_a_tokenizer_that_maps_most_of_the_data_to_unk_is_one_line(folder, capsys):
    file = _few_words_tokenizer(folder / "tokenizer.json")
    error = _train_error(capsys, folder, f"data.tokenizer={file}")
    train = folder / "train.jsonl"
    assert error.startswith(f"tokenizer {file} maps "), error
    assert (
        f"% of the tokens of a sample of 96 texts of {train} to [UNK]: its vocabulary does not fit" in error
    )
    percent = int(error.split(" maps ")[1].split("%")[0])
    assert 50 < percent < 100


@pytest.mark.parametrize("model", ["wordpiece", "bpe"])
def test_a_trained_tokenizer_passes_the_unknown_token_check(tmp_path, model):
    from composer_dynsample.data.text.tokenizer import resolve_tokenizer

    tokenizer = resolve_tokenizer(None, TEXTS, cache_dir=tmp_path, model=model, vocab_size=200)
    assert tokenizer.unknown_token == "[UNK]"
    other = [row[column] for row in pair_rows(12, seed=1) for column in ("anchor", "positive")]
    for texts in (TEXTS, other):
        store = _tokenize(texts, tokenizer.tokenizer, tmp_path / json.dumps(len(texts)))
        check_unknown_tokens(store, tokenizer, "pairs.jsonl")


def test_only_the_training_table_is_checked_for_unknown_tokens(tmp_path):
    """A tokenizer trained on tiny training pairs has never seen most characters of these test pairs."""
    write_jsonl(tmp_path / "train.jsonl", [{"anchor": f"q{i}", "positive": f"p{i}"} for i in range(4)])
    write_jsonl(tmp_path / "test.jsonl", [{"anchor": f"t{i}", "positive": f"u{i}"} for i in range(2)])
    splits = load_pairs(
        tmp_path / "train.jsonl", test_path=tmp_path / "test.jsonl", vocab_size=64, cache_dir=tmp_path / "c"
    )
    assert len(splits.test) == 4
