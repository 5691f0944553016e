"""load_pairs: the rows and labels layout with given negatives, the splits, the cache, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.data import IndexDataset
from composer_dynsample.data.text.pairs import load_pairs
from composer_dynsample.data.text.store import TextCollate, TextSplits
from composer_dynsample.data.text.tokenizer import train_tokenizer
from composer_dynsample.samplers import PKBatchSampler


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _pairs(n: int, groups: int = 10, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    words = ["sort", "list", "open", "file", "read", "json", "parse", "date", "time", "path", "join", "split"]
    rows = []
    for i in range(n):
        picked = " ".join(rng.choice(words, 3))
        rows.append(
            {
                "anchor": f"how to {picked} {i}",
                "positive": f"def f{i}(x): return {picked}(x)",
                "group": f"g{i % groups}",
            }
        )
    return rows


@pytest.fixture
def small(tmp_path):
    """Three training pairs with negatives (one missing, one the positive of another pair) and two test pairs."""
    train = _jsonl(
        tmp_path / "train.jsonl",
        [
            {"anchor": "q0", "positive": "p0", "negative_1": "n0a", "negative_2": "n0b"},
            {"anchor": "q1", "positive": "p1", "negative_1": "", "negative_2": None},
            {"anchor": "q2", "positive": "p2", "negative_1": "p0"},
        ],
    )
    test = _jsonl(
        tmp_path / "test.jsonl",
        [{"anchor": "t0", "positive": "u0", "negative": "v0"}, {"anchor": "t1", "positive": "u1"}],
    )
    return load_pairs(train, test_path=test, vocab_size=64, cache_dir=tmp_path / "cache")


def test_rows_labels_and_negatives_layout(small):
    train, test = small.train, small.test
    assert isinstance(small, TextSplits) and small.info.split == "test_path"
    assert len(train) == 6 and train.num_rows == 9  # the sampler sees anchors and positives only
    assert train.labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert train.row_labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 4, 5]  # a negative's label matches no row
    assert train.is_query.tolist() == [True, False] * 3 + [False] * 3
    assert train.negative_offsets.tolist() == [0, 2, 2, 2, 2, 3, 3]  # only anchors carry negatives
    assert train.negative_rows.tolist() == [6, 7, 8]
    assert train.text_ids[8] == train.text_ids[1]  # "p0" is stored once
    assert small.info.num_missing_negatives == 3 + 1 and small.info.num_negatives == (3, 1)  # + "t1" in test
    assert test.labels.tolist() == [6, 6, 7, 7] and test.row_labels.tolist() == [6, 6, 7, 7, 8]
    assert small.num_classes == 9 and small.info.num_train_classes == 6


def test_the_sampler_draws_no_negative_and_the_collate_appends_them(small):
    store = small.train
    sampler = PKBatchSampler(store.labels, classes_per_batch=3, samples_per_class=2, seed=0)
    batches = list(sampler)
    assert all(max(batch) < len(store) for batch in batches)
    collate = TextCollate(store)
    batch = collate([(0, 0), (1, 0), (4, 2), (5, 2)])
    assert batch["index"].tolist() == [0, 1, 4, 5, 6, 7]  # "p0", pair 2's negative, is already row 1
    assert batch["labels"].tolist() == [0, 0, 2, 2, 3, 4]
    assert batch["features"]["is_query"].tolist() == [True, False, True, False, False, False]
    assert collate([4, 5])["index"].tolist() == [4, 5, 8]  # without pair 0, "p0" is a negative again
    assert collate([2, 3])["index"].tolist() == [2, 3]
    assert TextCollate(store, negatives=False)([0, 1])["index"].tolist() == [0, 1]
    assert TextCollate(store, max_negatives_per_anchor=1)([0, 1])["index"].tolist() == [0, 1, 6]


def test_text_hash_marks_identical_texts(small):
    batch = TextCollate(small.train)([4, 5])
    hashes = batch["text_hash"].tolist()
    assert hashes[2] == small.train.text_hash[1]  # the negative "p0" and pair 0's positive
    assert len(set(hashes)) == 3


def _groups(store, rows):
    return {rows[r]["group"] for r in store.source_rows.tolist()}


def test_group_split_has_disjoint_groups(tmp_path):
    rows = _pairs(200, groups=10)
    file = _jsonl(tmp_path / "p.jsonl", rows)
    splits = load_pairs(file, group="group", test_fraction=0.3, vocab_size=100, cache_dir=tmp_path / "c")
    train_groups, test_groups = _groups(splits.train, rows), _groups(splits.test, rows)
    assert train_groups and test_groups and not train_groups & test_groups
    assert len(train_groups | test_groups) == 10
    assert len(splits.test) == 2 * 60  # 3 of 10 groups of 20 pairs: 30% of the pairs
    assert splits.info.split == "group"
    again = load_pairs(file, group="group", test_fraction=0.3, vocab_size=100, cache_dir=tmp_path / "c")
    assert _groups(again.test, rows) == test_groups
    other = load_pairs(
        file, group="group", test_fraction=0.3, seed=1, vocab_size=100, cache_dir=tmp_path / "c"
    )
    assert _groups(other.test, rows) != test_groups


def test_group_split_never_takes_every_group(tmp_path):
    rows = _pairs(20, groups=2)
    splits = load_pairs(
        _jsonl(tmp_path / "p.jsonl", rows),
        group="group",
        test_fraction=0.9,
        vocab_size=100,
        cache_dir=tmp_path,
    )
    assert len(_groups(splits.train, rows)) == 1 and len(_groups(splits.test, rows)) == 1
    with pytest.raises(ValueError, match="the group column holds 1 distinct value"):
        load_pairs(_jsonl(tmp_path / "one.jsonl", _pairs(20, groups=1)), group="group", cache_dir=tmp_path)


def test_random_split_is_seeded(tmp_path):
    file = _jsonl(tmp_path / "p.jsonl", _pairs(50))
    first = load_pairs(file, vocab_size=100, cache_dir=tmp_path / "c")
    assert first.info.split == "random" and len(first.test) == 2 * 10 and len(first.train) == 2 * 40
    same = load_pairs(file, vocab_size=100, cache_dir=tmp_path / "c")
    other = load_pairs(file, seed=3, vocab_size=100, cache_dir=tmp_path / "c")
    assert np.array_equal(first.test.source_rows, same.test.source_rows)
    assert not np.array_equal(first.test.source_rows, other.test.source_rows)
    assert not set(first.train.source_rows.tolist()) & set(first.test.source_rows.tolist())


def test_second_load_reads_the_cache_and_changes_miss_it(tmp_path):
    file = _jsonl(tmp_path / "p.jsonl", _pairs(30))

    def load(**changes):
        return load_pairs(
            file, **{"vocab_size": 100, "cache_dir": tmp_path / "c", "max_length": 64, **changes}
        )

    first = load()
    assert first.info.from_cache == (False,)
    second = load()
    assert second.info.from_cache == (True,) and second.info.cache_dirs == first.info.cache_dirs
    assert load(max_length=65).info.from_cache == (False,)
    assert load(vocab_size=90).info.from_cache == (False,)  # another trained tokenizer
    _jsonl(file, _pairs(30, seed=1))
    assert load().info.from_cache == (False,)


def test_a_given_tokenizer_serves_every_split_from_one_cache(tmp_path):
    file = _jsonl(tmp_path / "p.jsonl", _pairs(30))
    tokenizer_file = tmp_path / "tokenizer.json"
    train_tokenizer(["how to sort a list", "def f(x): return x"], vocab_size=64).save(str(tokenizer_file))
    first = load_pairs(file, tokenizer=tokenizer_file, cache_dir=tmp_path / "c")
    other_seed = load_pairs(file, tokenizer=tokenizer_file, seed=5, cache_dir=tmp_path / "c")
    assert other_seed.info.from_cache == (True,) and other_seed.info.cache_dirs == first.info.cache_dirs
    assert first.info.tokenizer_path == tokenizer_file


def test_trained_tokenizer_is_saved_with_the_run_and_sees_only_the_training_split(tmp_path):
    rows = _pairs(40, groups=4)
    rows[0]["anchor"] = "zebra " + rows[0]["anchor"]  # the only "z" of the data, in group g0
    file = _jsonl(tmp_path / "p.jsonl", rows)
    saved = tmp_path / "tok.json"
    seed = next(
        s
        for s in range(20)
        if 0
        in load_pairs(file, group="group", seed=s, cache_dir=tmp_path / "c", vocab_size=200).test.source_rows
    )
    splits = load_pairs(
        file, group="group", seed=seed, vocab_size=200, cache_dir=tmp_path / "c", save_tokenizer=saved
    )
    assert splits.info.tokenizer_path == saved and saved.is_file()
    from tokenizers import Tokenizer

    assert "z" not in Tokenizer.from_file(str(saved)).get_vocab()  # g0 is a test group
    whole = load_pairs(
        file, test_path=_jsonl(tmp_path / "t.jsonl", _pairs(4)), vocab_size=200, cache_dir=tmp_path / "c"
    )
    assert "z" in Tokenizer.from_file(str(whole.info.tokenizer_path)).get_vocab()  # trained on every row


def test_dataset_dict_folder_brings_its_test_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    train, test = _pairs(10), _pairs(4, seed=1)
    strip = lambda rows: {key: [row[key] for row in rows] for key in ("anchor", "positive")}  # noqa: E731
    folder = tmp_path / "dd"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(strip(train)), "test": datasets.Dataset.from_dict(strip(test))}
    ).save_to_disk(str(folder))
    splits = load_pairs(folder, vocab_size=100, cache_dir=tmp_path / "c")
    assert splits.info.split == "bundled" and len(splits.train) == 20 and len(splits.test) == 8
    assert len(set(splits.info.cache_dirs)) == 2
    with pytest.raises(
        ValueError, match="the test split is its test split; test_fraction and group split a single file"
    ):
        load_pairs(folder, test_fraction=0.5, cache_dir=tmp_path / "c")


def test_csv_with_quoted_newlines_and_numbered_negatives(tmp_path):
    file = tmp_path / "p.csv"
    file.write_text(
        'anchor,positive,negative_2,negative_1\n"multi\nline",b,n2,n1\nc,"d\nd",,\n', encoding="utf-8"
    )
    splits = load_pairs(file, test_path=file, vocab_size=64, cache_dir=tmp_path / "c")
    assert (
        splits.train.negative_rows.tolist() == [4, 5] and splits.info.num_missing_negatives == 4
    )  # 2 per file read
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(splits.info.tokenizer_path))
    stored = [splits.train.tokens.row(int(splits.train.text_ids[r])).tolist() for r in (0, 3, 4, 5)]
    assert stored == [
        tokenizer.encode(t).ids for t in ("multi\nline", "d\nd", "n1", "n2")
    ]  # negative_1 first


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_length": 1}, r"max_length must be an integer >= 2, got 1\."),
        ({"test_fraction": 1.0}, r"test_fraction must be"),
        ({"group": "team"}, r"p\.jsonl: missing column 'team'; expected columns 'anchor' and 'positive'"),
        (
            {"test_path": "SELF", "test_fraction": 0.2},
            r"the test split is test_path; test_fraction and group split a single file",
        ),
    ],
)
def test_bad_arguments_are_one_line(tmp_path, kwargs, message):
    file = _jsonl(tmp_path / "p.jsonl", _pairs(10))
    kwargs = {key: (file if value == "SELF" else value) for key, value in kwargs.items()}
    with pytest.raises(ValueError, match=message) as error:
        load_pairs(file, cache_dir=tmp_path, **kwargs)
    assert "\n" not in str(error.value)


def test_bad_content_names_file_line_and_column(tmp_path):
    rows = _pairs(5)
    rows[3]["positive"] = "   "
    with pytest.raises(ValueError, match=r"p\.jsonl: line 4, column 'positive': the text is blank"):
        load_pairs(_jsonl(tmp_path / "p.jsonl", rows), cache_dir=tmp_path)
    rows[3]["positive"], rows[2]["negative"] = "x", {"text": "y"}
    with pytest.raises(
        ValueError, match=r"line 3, column 'negative': expected a string or a list of strings, got dict"
    ):
        load_pairs(_jsonl(tmp_path / "p.jsonl", rows), cache_dir=tmp_path)
    with pytest.raises(ValueError, match=r"missing column 'positive'"):
        load_pairs(_jsonl(tmp_path / "q.jsonl", [{"anchor": "a", "answer": "b"}]), cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="tokenizer 'bert-base-uncased' is not a file or folder"):
        load_pairs(_jsonl(tmp_path / "p.jsonl", _pairs(5)), tokenizer="bert-base-uncased", cache_dir=tmp_path)


def test_a_list_of_negatives_in_one_cell(tmp_path):
    rows = [{"anchor": "a", "positive": "b", "negative": ["c", "d", ""]}, {"anchor": "e", "positive": "f"}]
    splits = load_pairs(
        _jsonl(tmp_path / "p.jsonl", rows),
        test_path=_jsonl(tmp_path / "t.jsonl", rows),
        vocab_size=64,
        cache_dir=tmp_path,
    )
    assert (
        splits.train.negative_offsets.tolist() == [0, 2, 2, 2, 2]
        and splits.info.num_missing_negatives == 2 * 2  # the file is read twice
    )


def test_getitem_is_an_index_and_the_collate_gathers(small):
    dataset = IndexDataset(small.train.labels)
    assert dataset[3] == (3, 1)  # the index and its label, nothing else
    batch = TextCollate(small.train)([dataset[i] for i in (2, 3)])
    expected = [small.train.tokens.row(int(small.train.text_ids[i])).tolist() for i in (2, 3)]
    got = [
        row[mask.bool()].tolist()
        for row, mask in zip(batch["features"]["input_ids"], batch["features"]["attention_mask"])
    ]
    assert got == expected
