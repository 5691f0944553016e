"""load_texts: labels numbered in sorted order with their names kept, and an unseen-label test split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.data.text.texts import load_texts, split_labels


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _rows(labels, per_label: int = 4) -> list[dict]:
    return [
        {"text": f"mention {i} of {label!s} entity", "label": label}
        for label in labels
        for i in range(per_label)
    ]


def test_labels_are_numbered_in_sorted_order_and_split_unseen(tmp_path):
    labels = [f"Q{n}" for n in range(10)]
    rows = _rows(labels)
    splits = load_texts(
        _jsonl(tmp_path / "t.jsonl", rows), test_fraction=0.3, vocab_size=100, cache_dir=tmp_path
    )
    info = splits.info
    assert info.split == "labels" and info.num_train_classes == 7 and splits.num_classes == 10
    train_names, test_names = info.label_names[:7], info.label_names[7:]
    assert list(train_names) == sorted(train_names) and list(test_names) == sorted(test_names)
    assert not set(train_names) & set(test_names)
    assert splits.train.labels.unique().tolist() == list(range(7))
    assert sorted(set(splits.test.labels.tolist())) == [7, 8, 9]
    for store in (splits.train, splits.test):  # each row's label names its original label
        assert [info.label_names[label] for label in store.row_labels] == [
            rows[r]["label"] for r in store.source_rows
        ]
        assert not store.is_query.any() and store.num_rows == len(store)
    assert len(splits.train) + len(splits.test) == len(rows)


def test_split_is_seeded(tmp_path):
    file = _jsonl(tmp_path / "t.jsonl", _rows(range(20)))
    first = load_texts(file, vocab_size=100, cache_dir=tmp_path)
    assert first.info.label_names == load_texts(file, vocab_size=100, cache_dir=tmp_path).info.label_names
    assert (
        first.info.label_names
        != load_texts(file, seed=1, vocab_size=100, cache_dir=tmp_path).info.label_names
    )
    assert split_labels(list(range(20)), 0.2, 0)[1] == list(first.info.label_names[16:])


def test_mixed_label_types_sort_numbers_before_strings(tmp_path):
    rows = _rows([10, 9, "b", "a"])
    splits = load_texts(
        _jsonl(tmp_path / "t.jsonl", rows),
        test_path=_jsonl(tmp_path / "u.jsonl", _rows(["c", 9])),
        vocab_size=100,
        cache_dir=tmp_path,
    )
    assert splits.info.split == "test_path"
    assert splits.info.label_names == (9, 10, "a", "b", "c")  # test-only labels follow the training ones
    assert splits.test.row_labels.tolist() == [4] * 4 + [0] * 4


def test_csv_labels_are_strings(tmp_path):
    file = tmp_path / "t.csv"
    file.write_text("text,label\n" + "".join(f'"line one\nof {i}",{i % 3}\n' for i in range(12)))
    splits = load_texts(file, test_path=file, vocab_size=64, cache_dir=tmp_path)
    assert splits.info.label_names == ("0", "1", "2")
    assert np.array_equal(splits.train.row_labels, np.arange(12) % 3)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"text": "a", "label": 1}, {"text": "b"}], r"line 2, column 'label': the label is missing"),
        (
            [{"text": "a", "label": 1}, {"text": "b", "label": [1]}],
            r"line 2, column 'label': expected a string or a number, got list",
        ),
        ([{"text": "a", "label": 1}, {"text": "", "label": 2}], r"line 2, column 'text': the text is empty"),
        (
            [{"text": "a", "label": 1}, {"body": "b", "label": 2}],
            r"t\.jsonl: line 2, column 'text': the text is missing \(null\)",
        ),
        (
            [{"text": "a", "label": 1}, {"text": "b", "label": 1}],
            r"an unseen-label split needs at least 2 distinct labels, got 1",
        ),
    ],
)
def test_bad_content_is_one_line(tmp_path, rows, message):
    with pytest.raises(ValueError, match=message) as error:
        load_texts(_jsonl(tmp_path / "t.jsonl", rows), cache_dir=tmp_path)
    assert "\n" not in str(error.value)


def test_bad_arguments(tmp_path):
    file = _jsonl(tmp_path / "t.jsonl", _rows("ab"))
    with pytest.raises(ValueError, match=r"max_length must be an integer >= 2, got 0\."):
        load_texts(file, max_length=0, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="test_fraction splits a single file and must be None"):
        load_texts(file, test_path=file, test_fraction=0.5, cache_dir=tmp_path)
