"""Read a table of texts, column by column: JSON Lines, CSV, Parquet or a Hugging Face ``datasets`` folder.

The text loaders (:func:`~composer_dynsample.data.pairs.load_pairs`,
:func:`~composer_dynsample.data.texts.load_texts`) read their input through :func:`read_text_tables`,
which picks the format from the path:

* ``.jsonl`` / ``.json``: JSON Lines, one object per line (blank lines are skipped); a key missing
  from a line reads as ``null``.
* ``.csv`` (``,``) and ``.tsv`` (tab): a header line, then one record per row, parsed with the
  :mod:`csv` module, so quoted fields may hold the delimiter, quotes (``""``) and newlines.
* ``.parquet``: read with ``pyarrow`` (installed with ``datasets``).
* a directory written by ``datasets.Dataset.save_to_disk`` (or a ``DatasetDict`` holding a ``train``
  split, whose ``test`` split, if any, comes back as the bundled test table).

Files are decoded as UTF-8 (a leading byte-order mark is dropped). Every problem raises one
``ValueError`` line naming the file, the line (text formats) or row index (Parquet, ``datasets``), the
column, and what was expected. The SHA-256 of the file's bytes (of every file of a ``datasets``
folder, and the split's name) is kept as the table's identity for caches.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from composer_dynsample.validation import check_float, check_int

__all__ = [
    "TextTable",
    "check_loader_options",
    "hashable_column",
    "read_text_tables",
    "require_columns",
    "sort_key",
    "text_column",
]

_JSON_SUFFIXES = (".jsonl", ".json")
_DELIMITERS = {".csv": ",", ".tsv": "\t"}
_FORMATS = "a .jsonl/.json (JSON Lines), .csv, .tsv or .parquet file, or a datasets folder (save_to_disk)"


def check_loader_options(max_length: int, test_fraction: float | None, seed: int) -> None:
    """The options every text loader shares: ``max_length`` >= 2, ``seed`` >= 0, ``test_fraction`` in (0, 1)."""
    check_int("max_length", max_length, minimum=2)
    check_int("seed", seed, minimum=0)
    if test_fraction is not None:
        check_float(
            "test_fraction", test_fraction, minimum=0, maximum=1, strict_minimum=True, strict_maximum=True
        )


@dataclasses.dataclass(frozen=True, eq=False)
class TextTable:
    """The columns of one table, with what is needed to name a row in an error message.

    Attributes:
        path (Path): The file or folder it was read from.
        columns (dict[str, list]): Each column's values in row order; ``None`` where a JSON line lacks
            the key.
        lines (list[int] | None): The line on which each row starts (JSON Lines, CSV), or ``None``
            for Parquet and ``datasets`` tables, whose rows are named by index.
        sha256 (str): SHA-256 of the file's bytes (of a ``datasets`` folder's files and the split name).
        split (str | None): The ``DatasetDict`` split it came from, else ``None``.

    Example:
        >>> table = TextTable(Path("a.jsonl"), {"text": ["x", "y"]}, [1, 3], "0" * 64)
        >>> table.num_rows, table.where(1, "text")
        (2, "a.jsonl: line 3, column 'text'")
    """

    path: Path
    columns: dict[str, list[Any]]
    lines: list[int] | None
    sha256: str
    split: str | None = None

    @property
    def num_rows(self) -> int:
        """The number of rows."""
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def where(self, row: int, column: str | None = None) -> str:
        """``"FILE: line N, column 'c'"`` (or ``row index N``) for error messages."""
        source = f"{self.path}" + (f" (split {self.split!r})" if self.split else "")
        place = f"line {self.lines[row]}" if self.lines is not None else f"row index {row}"
        return f"{source}: {place}" + (f", column {column!r}" if column is not None else "")


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise ValueError(
            f"{path}: line {line} is not valid UTF-8 (byte 0x{data[error.start]:02x} at byte {column} of "
            "the line); save the file as UTF-8."
        ) from None


def _read_json_lines(path: Path, text: str) -> tuple[dict[str, list[Any]], list[int]]:
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    keys: dict[str, None] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}: line {number} is not valid JSON ({error.msg} at column {error.colno}); "
                "expected one JSON object per line."
            ) from None
        if not isinstance(row, dict):
            raise ValueError(
                f"{path}: line {number} holds a JSON {type(row).__name__}; expected one object per line, "
                'e.g. {"anchor": "...", "positive": "..."}.'
            )
        keys.update(dict.fromkeys(row))
        rows.append(row)
        lines.append(number)
    return {key: [row.get(key) for row in rows] for key in keys}, lines


def _read_csv(path: Path, text: str, delimiter: str) -> tuple[dict[str, list[Any]], list[int]]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    limit = csv.field_size_limit()
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # source files and documents exceed the 128 KiB default
    try:
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file; expected a header line naming the columns.")
        duplicates = sorted({name for name in header if header.count(name) > 1})
        if duplicates or "" in header:
            raise ValueError(f"{path}: line 1: the header must name every column once, got {header}.")
        records: list[list[str]] = []
        lines: list[int] = []
        start = reader.line_num + 1
        for record in reader:
            if record:  # a blank line is no record
                if len(record) != len(header):
                    raise ValueError(
                        f"{path}: line {start}: {len(record)} fields, but the header has {len(header)} "
                        f"({header}); quote fields that hold {delimiter!r}, quotes or newlines."
                    )
                records.append(record)
                lines.append(start)
            start = reader.line_num + 1
    except csv.Error as error:
        raise ValueError(f"{path}: line {reader.line_num}: not valid CSV ({error}).") from None
    finally:
        csv.field_size_limit(limit)
    return {name: [record[i] for record in records] for i, name in enumerate(header)}, lines


def _read_parquet(path: Path, keep: Callable[[str], bool]) -> dict[str, list[Any]]:
    try:
        import pyarrow.parquet as parquet

        names = parquet.read_schema(path).names
        table = parquet.read_table(path, columns=[name for name in names if keep(name)])
    except ImportError:
        raise
    except Exception as error:  # pyarrow raises ArrowInvalid, OSError, ...
        raise ValueError(f"{path}: not a readable Parquet file ({_first_line(error)}).") from None
    return table.to_pydict()


def _folder_sha256(directory: Path, split: str | None) -> str:
    digest = hashlib.sha256(f"split:{split}".encode())
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(directory)).encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _dataset_columns(dataset: Any, keep: Callable[[str], bool]) -> dict[str, list[Any]]:
    return {name: list(dataset[name]) for name in dataset.column_names if keep(name)}


def _read_dataset_folder(directory: Path, keep: Callable[[str], bool]) -> tuple[TextTable, TextTable | None]:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(directory))
    except Exception as error:  # FileNotFoundError, ValueError, ... from datasets
        raise ValueError(
            f"{directory}: not a datasets folder written by save_to_disk ({_first_line(error)}); "
            f"expected {_FORMATS}."
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise ValueError(
                f"{directory}: a DatasetDict needs a 'train' split (and optionally 'test'), got {sorted(loaded)}."
            )
        tables = [
            TextTable(
                directory,
                _dataset_columns(loaded[split], keep),
                None,
                _folder_sha256(directory, split),
                split,
            )
            for split in ("train", "test")
            if split in loaded
        ]
        return tables[0], (tables[1] if len(tables) > 1 else None)
    return TextTable(directory, _dataset_columns(loaded, keep), None, _folder_sha256(directory, None)), None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def read_text_tables(
    path: str | Path, keep: Callable[[str], bool] | None = None
) -> tuple[TextTable, TextTable | None]:
    """Read a table of texts; see the module docstring for the formats.

    Args:
        path (str | Path): The file or ``datasets`` folder.
        keep (Callable[[str], bool], optional): Which columns to keep (Parquet and ``datasets`` read only
            those). Default: all.

    Returns:
        tuple[TextTable, TextTable | None]: The table, and the ``test`` split of a ``DatasetDict`` folder
        (``None`` for everything else).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If the format is unknown, or the content is not valid for it, or it holds no rows.

    Example:
        >>> import tempfile
        >>> file = Path(tempfile.mkdtemp()) / "pairs.csv"
        >>> _ = file.write_text('anchor,positive\\n"two\\nlines",b\\n')
        >>> table, _ = read_text_tables(file)
        >>> table.columns["anchor"], table.lines
        (['two\\nlines'], [2])
    """
    file = Path(path).expanduser()
    keep = keep or (lambda name: True)
    if not file.exists():
        raise FileNotFoundError(f"{file}: no such file or directory.")
    if file.is_dir():
        table, test = _read_dataset_folder(file, keep)
    else:
        suffix = file.suffix.lower()
        if suffix not in (*_JSON_SUFFIXES, *_DELIMITERS, ".parquet"):
            raise ValueError(f"{file}: unsupported file type {suffix!r}; expected {_FORMATS}.")
        data = file.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if suffix == ".parquet":
            table, test = TextTable(file, _read_parquet(file, keep), None, digest), None
        else:
            text = _decode(file, data)
            if suffix in _JSON_SUFFIXES:
                columns, lines = _read_json_lines(file, text)
            else:
                columns, lines = _read_csv(file, text, _DELIMITERS[suffix])
            kept = {name: values for name, values in columns.items() if keep(name)}
            table, test = TextTable(file, kept, lines, digest), None
    for each in (table, test):
        if each is not None and each.num_rows == 0:
            where = each.path if each.split is None else f"{each.path} (split {each.split!r})"
            raise ValueError(f"{where}: holds no rows.")
    return table, test


def require_columns(table: TextTable, required: Sequence[str], expected: str) -> None:
    """Raise one ``ValueError`` line if ``table`` lacks a column of ``required``.

    Args:
        table (TextTable): The table.
        required (Sequence[str]): The column names that must be present.
        expected (str): How to describe the valid columns, e.g. ``"'text' and 'label'"``.
    """
    missing = [name for name in required if name not in table.columns]
    if missing:
        where = table.path if table.split is None else f"{table.path} (split {table.split!r})"
        raise ValueError(
            f"{where}: missing column {missing[0]!r}; expected {expected}, found {sorted(table.columns)}."
        )


def text_column(table: TextTable, column: str, *, optional: bool = False) -> list[str | None]:
    """The texts of a column, checked: strings that are not empty or blank.

    Args:
        table (TextTable): The table.
        column (str): The column, which must exist.
        optional (bool): Read a missing (``null``) or blank cell as ``None`` instead of raising (a
            missing negative). Default: ``False``.

    Returns:
        list[str | None]: The texts, unchanged (not stripped).

    Raises:
        ValueError: Naming the line and column of the first value that is not a string, or empty.
    """
    values = table.columns[column]
    for row, value in enumerate(values):
        if isinstance(value, str) and value.strip():
            continue
        if optional and (value is None or (isinstance(value, str) and not value.strip())):
            continue
        if value is None or isinstance(value, str):
            what = "missing (null)" if value is None else "empty" if not value else "blank"
            raise ValueError(
                f"{table.where(row, column)}: the text is {what}; every {column} must hold text."
            )
        raise ValueError(
            f"{table.where(row, column)}: expected a string, got {type(value).__name__} {_short(value)}."
        )
    return [value if isinstance(value, str) and value.strip() else None for value in values]


def hashable_column(table: TextTable, column: str) -> list[Any]:
    """The values of a label or group column, checked: present and hashable (strings, numbers, booleans).

    Raises:
        ValueError: Naming the line and column of the first missing or unhashable value.
    """
    values = table.columns[column]
    for row, value in enumerate(values):
        if value is None or (isinstance(value, str) and not value.strip()):
            raise ValueError(f"{table.where(row, column)}: the {column} is missing; every row needs one.")
        try:
            hash(value)
        except TypeError:
            raise ValueError(
                f"{table.where(row, column)}: expected a string or a number, got {type(value).__name__} "
                f"{_short(value)}."
            ) from None
    return values


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def sort_key(value: Any) -> tuple[int, Any, str]:
    """A key that sorts labels or groups of mixed types: booleans, then numbers, then strings, then others.

    Example:
        >>> sorted(["b", 10, "a", 9.5], key=sort_key)
        [9.5, 10, 'a', 'b']
    """
    if isinstance(value, bool):
        return (0, int(value), "")
    if isinstance(value, (int, float)):
        return (1, value, "")
    if isinstance(value, str):
        return (2, 0, value)
    return (3, 0, repr(value))
