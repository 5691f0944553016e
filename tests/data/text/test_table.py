"""Reading text tables: formats, and one error line naming the file, line and column for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from composer_dynsample.data.text.columns import require_columns
from composer_dynsample.data.text.table import hashable_column, read_text_tables, sort_key, text_column


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


def _read_error(file: Path, content: str | bytes, match: str) -> str:
    """Write ``content`` to ``file``: reading it fails with ``match``, in one line, which is returned."""
    if isinstance(content, bytes):
        file.write_bytes(content)
    else:
        file.write_text(content)
    with pytest.raises(ValueError, match=match) as error:
        read_text_tables(file)
    return _one_line(error)


def test_jsonl_columns_lines_and_missing_keys(tmp_path):
    file = tmp_path / "p.jsonl"
    file.write_text('{"anchor": "a", "positive": "b"}\n\n{"anchor": "c", "positive": "d", "negative": "e"}\n')
    table, test = read_text_tables(file)
    assert test is None
    assert table.columns == {"anchor": ["a", "c"], "positive": ["b", "d"], "negative": [None, "e"]}
    assert table.lines == [1, 3]  # the blank line 2 is no row
    assert table.where(1, "negative") == f"{file}: line 3, column 'negative'"


def test_csv_quoted_newlines_delimiters_and_quotes_parse(tmp_path):
    file = tmp_path / "p.csv"
    file.write_text(
        'anchor,positive\n"first\nquery, with comma","say ""hi"""\nplain,"two\n\nblank lines"\n',
        encoding="utf-8",
    )
    table, _ = read_text_tables(file)
    assert table.columns["anchor"] == ["first\nquery, with comma", "plain"]
    assert table.columns["positive"] == ['say "hi"', "two\n\nblank lines"]
    assert table.lines == [2, 4]  # each record's first line


def test_tsv_and_byte_order_mark(tmp_path):
    file = tmp_path / "t.tsv"
    file.write_bytes("\ufefftext\tlabel\nhello, world\tgreet\n".encode())
    table, _ = read_text_tables(file)
    assert table.columns == {"text": ["hello, world"], "label": ["greet"]}


def test_csv_wrong_field_count_names_the_line(tmp_path):
    content = "anchor,positive\na,b\nc,d,e\n"
    _read_error(tmp_path / "p.csv", content, r"p\.csv: line 3: 3 fields, but the header has 2")


def test_csv_bad_quoting_names_the_line(tmp_path):
    _read_error(tmp_path / "p.csv", 'anchor,positive\na,b\n"c"x,d\n', r"p\.csv: line 3: not valid CSV")


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_non_utf8_line_is_named(tmp_path, suffix):
    file = tmp_path / f"p{suffix}"
    if suffix == ".jsonl":
        lines = [
            b'{"anchor": "a", "positive": "b"}',
            b'{"anchor": "c", "positive": "d"}',
            b'{"anchor": "caf\xe9"}',
        ]
    else:
        lines = [b"anchor,positive", b"a,b", b"caf\xe9,b"]
    message = _read_error(file, b"\n".join(lines) + b"\n", r"line 3 is not valid UTF-8 \(byte 0xe9")
    assert str(file) in message


def test_invalid_json_and_non_object_lines(tmp_path):
    file = tmp_path / "p.jsonl"
    _read_error(
        file, '{"anchor": "a"}\n{"anchor": \n', r"line 2 is not valid JSON .*one JSON object per line"
    )
    file.write_text('["a", "b"]\n')
    with pytest.raises(ValueError, match=r"line 1 holds a JSON list; expected one object per line"):
        read_text_tables(file)


def test_missing_file_unknown_suffix_and_empty_table(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_text_tables(tmp_path / "absent.jsonl")
    (tmp_path / "p.txt").write_text("x")
    with pytest.raises(ValueError, match=r"unsupported file type '\.txt'; expected a \.jsonl"):
        read_text_tables(tmp_path / "p.txt")
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match=r"e\.jsonl: holds no rows"):
        read_text_tables(tmp_path / "e.jsonl")
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(ValueError, match="expected a header line"):
        read_text_tables(tmp_path / "e.csv")


def test_missing_column_names_the_file_and_what_was_expected(tmp_path):
    table, _ = read_text_tables(_jsonl(tmp_path / "p.jsonl", [{"anchor": "a", "answer": "b"}]))
    with pytest.raises(
        ValueError, match=r"p\.jsonl: missing column 'positive'; expected X, found \['anchor', 'answer'\]"
    ):
        require_columns(table, ["anchor", "positive"], "X")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (None, "the text is missing"),
        ("", "the text is empty"),
        ("  \n", "the text is blank"),
        (3, "expected a string, got int 3"),
    ],
)
def test_bad_text_values_name_line_and_column(tmp_path, value, problem):
    rows = [{"anchor": "a", "positive": "b"}, {"anchor": "c", "positive": value}]
    table, _ = read_text_tables(_jsonl(tmp_path / "p.jsonl", rows))
    with pytest.raises(ValueError, match=rf"p\.jsonl: line 2, column 'positive': {problem}") as error:
        text_column(table, "positive")
    _one_line(error)


def test_optional_text_column_reads_missing_cells_as_none(tmp_path):
    rows = [{"negative": "x"}, {"negative": ""}, {"negative": None}, {}]
    table, _ = read_text_tables(_jsonl(tmp_path / "p.jsonl", rows))
    assert text_column(table, "negative", optional=True) == ["x", None, None, None]


def test_label_values_must_be_present_and_hashable(tmp_path):
    table, _ = read_text_tables(_jsonl(tmp_path / "t.jsonl", [{"label": "a"}, {"label": ["x"]}]))
    with pytest.raises(ValueError, match=r"line 2, column 'label': expected a string or a number, got list"):
        hashable_column(table, "label")
    table, _ = read_text_tables(_jsonl(tmp_path / "u.jsonl", [{"label": 1}, {"label": None}]))
    with pytest.raises(ValueError, match=r"line 2, column 'label': the label is missing"):
        hashable_column(table, "label")


def test_sort_key_orders_mixed_types():
    assert sorted(["b", 2, True, "a", 1.5], key=sort_key) == [True, 1.5, 2, "a", "b"]


def test_parquet_is_read_by_row_index(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as parquet

    file = tmp_path / "p.parquet"
    parquet.write_table(pyarrow.table({"anchor": ["a", "b"], "positive": ["c", None], "other": [1, 2]}), file)
    table, _ = read_text_tables(file, keep=lambda name: name != "other")
    assert table.columns == {"anchor": ["a", "b"], "positive": ["c", None]} and table.lines is None
    with pytest.raises(ValueError, match=r"p\.parquet: row index 1, column 'positive': the text is missing"):
        text_column(table, "positive")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet: not a readable Parquet file"):
        read_text_tables(tmp_path / "bad.parquet")


def test_datasets_folder_and_dataset_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    single = datasets.Dataset.from_dict({"anchor": ["a", "b"], "positive": ["c", "d"]})
    single.save_to_disk(str(tmp_path / "single"))
    table, test = read_text_tables(tmp_path / "single")
    assert table.columns["anchor"] == ["a", "b"] and test is None
    both = datasets.DatasetDict(
        {"train": single, "test": datasets.Dataset.from_dict({"anchor": ["e"], "positive": ["f"]})}
    )
    both.save_to_disk(str(tmp_path / "both"))
    train, test = read_text_tables(tmp_path / "both")
    assert train.columns["anchor"] == ["a", "b"] and test.columns["anchor"] == ["e"]
    assert train.sha256 != test.sha256 and test.where(0) == f"{tmp_path / 'both'} (split 'test'): row index 0"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty: not a datasets folder written by save_to_disk"):
        read_text_tables(tmp_path / "empty")


def test_columns_are_mapped_in_every_format_and_a_missing_one_names_the_file_columns(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as parquet

    names = {"anchor": "query", "positive": "pos"}
    parquet.write_table(
        pyarrow.table({"query": ["a", "b"], "pos": ["c", "d"], "x": [1, 2]}), tmp_path / "p.parquet"
    )
    _jsonl(tmp_path / "p.jsonl", [{"query": "a", "pos": "c", "anchor": "own"}, {"query": "b", "pos": "d"}])
    for file in (tmp_path / "p.parquet", tmp_path / "p.jsonl"):
        table, _ = read_text_tables(file, lambda name: name in ("anchor", "positive"), names)
        assert table.columns == {"anchor": ["a", "b"], "positive": ["c", "d"]}, (
            file
        )  # the file's own 'anchor' gives way
        assert table.where(1, "positive").endswith("column 'pos'") and table.renamed == names
    # without the mapping the rows are still counted: the missing column is named, not "no rows"
    table, _ = read_text_tables(tmp_path / "p.parquet", lambda name: name in ("anchor", "positive"))
    assert table.num_rows == 2 and table.found == ("query", "pos", "x")
    with pytest.raises(ValueError, match=r"missing column 'anchor'.*found \['query', 'pos', 'x'\]") as error:
        require_columns(table, ["anchor", "positive"], "X")
    assert "columns={anchor: query, positive: pos}" in _one_line(error)
