"""Read a table of texts, column by column: JSON Lines, CSV, Parquet or a Hugging Face ``datasets`` folder.

The text loaders (:func:`~composer_dynsample.data.text.pairs.load_pairs`,
:func:`~composer_dynsample.data.text.texts.load_texts`) read their input through :func:`read_text_tables`,
which picks the format from the path:

* ``.jsonl`` / ``.json``: JSON Lines, one object per line (blank lines are skipped); a key missing
  from a line reads as ``null``.
* ``.csv`` (``,``) and ``.tsv`` (tab): a header line, then one record per row, parsed with the
  :mod:`csv` module, so quoted fields may hold the delimiter, quotes (``""``) and newlines.
* ``.parquet``: read with ``pyarrow`` (installed with ``datasets``).
* a directory written by ``datasets.Dataset.save_to_disk`` (or a ``DatasetDict`` holding a ``train``
  split, whose ``test`` split, if any, comes back as the bundled test table).

Only regular files and folders are opened: a named pipe (which would block) or a device such as
``/dev/zero`` (endless bytes) is refused before it is opened, also behind a symbolic link. Files are
decoded as UTF-8 (a leading byte-order mark is dropped); a JSON ``\ud800`` escape that leaves a lone
surrogate (not Unicode text) is refused at its line. Every problem raises one ``ValueError`` line
naming the file, the line (text formats) or row index (Parquet, ``datasets``), the column, and what was
expected; a quoted CSV field that never closes is named at the line where its record starts. The text
formats are parsed by :mod:`~composer_dynsample.data.text.table_formats`.

Columns under other names are mapped with ``columns`` (``data.columns`` in a config): ``{"anchor":
"query", "positive": "pos"}`` reads the file's ``query`` column as ``anchor``; the mapping is checked,
and a missing column named, by :mod:`~composer_dynsample.data.text.columns`. The SHA-256 of the file's
bytes (of every file of a ``datasets`` folder, and the split's name) is kept as the table's identity
for caches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from composer_dynsample.data.text.table_formats import (
    _decode,
    _first_line,
    _read_csv,
    _read_json_lines,
    _read_parquet,
)
from composer_dynsample.file_checks import check_path_kind
from composer_dynsample.validation import did_you_mean

__all__ = [
    "TextTable",
    "check_unicode",
    "hashable_column",
    "map_columns",
    "read_text_tables",
    "sort_key",
    "text_column",
]

_JSON_SUFFIXES = (".jsonl", ".json")
_DELIMITERS = {".csv": ",", ".tsv": "\t"}
_FORMATS = "a .jsonl/.json (JSON Lines), .csv, .tsv or .parquet file, or a datasets folder (save_to_disk)"
_SURROGATE = re.compile("[\ud800-\udfff]")


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
        found (tuple[str, ...]): Every column of the file, under its own name, kept or not.
        renamed (dict[str, str]): The columns read under another name: the name in ``columns`` to the
            file's name.
        rows (int | None): The number of rows of the file, whichever columns were kept (``None``: as
            many as ``columns`` holds).

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
    found: tuple[str, ...] = ()
    renamed: dict[str, str] = dataclasses.field(default_factory=dict)
    rows: int | None = None

    @property
    def num_rows(self) -> int:
        """The number of rows."""
        if self.rows is not None:
            return self.rows
        return len(next(iter(self.columns.values()))) if self.columns else 0

    @property
    def name(self) -> str:
        """The file, and the ``DatasetDict`` split when it came from one, for messages."""
        return f"{self.path}" + (f" (split {self.split!r})" if self.split else "")

    def where(self, row: int, column: str | None = None) -> str:
        """``"FILE: line N, column 'c'"`` (or ``row index N``) for error messages; a mapped column is
        named as the file names it."""
        place = f"line {self.lines[row]}" if self.lines is not None else f"row index {row}"
        named = f", column {self.renamed.get(column, column)!r}" if column is not None else ""
        return f"{self.name}: {place}{named}"


def _folder_sha256(directory: Path, split: str | None) -> str:
    digest = hashlib.sha256(f"split:{split}".encode())
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(directory)).encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _dataset_table(
    directory: Path, dataset: Any, split: str | None, keep: Callable[[str], bool], names: Mapping[str, str]
) -> TextTable:
    read = {name: list(dataset[name]) for name in dataset.column_names if keep(name)}
    return _mapped(
        TextTable(directory, read, None, _folder_sha256(directory, split), split, rows=len(dataset)),
        list(dataset.column_names),
        names,
    )


def _read_dataset_folder(
    directory: Path, keep: Callable[[str], bool], names: Mapping[str, str]
) -> tuple[TextTable, TextTable | None]:
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
            _dataset_table(directory, loaded[split], split, keep, names)
            for split in ("train", "test")
            if split in loaded
        ]
        return tables[0], (tables[1] if len(tables) > 1 else None)
    return _dataset_table(directory, loaded, None, keep, names), None


def _source_keep(keep: Callable[[str], bool], names: Mapping[str, str]) -> Callable[[str], bool]:
    """Which of the file's columns to read: the mapped ones, and those ``keep`` wants by their own name."""
    sources = set(names.values())

    def wanted(column: str) -> bool:
        return column in sources or keep(column)

    return wanted


def _mapped(
    table: TextTable, found: Sequence[str], names: Mapping[str, str], *, own_names: bool = False
) -> TextTable:
    """``table`` with its mapped columns under the loader's names, and every column name of the file.

    A mapped column the file lacks is refused, unless ``own_names`` and the file has the loader's own
    name for it (a test file of ``anchor`` and ``positive`` beside a training file of ``query`` and ``pos``).
    """
    for role, column in names.items():
        if column not in found and not (own_names and role in found):
            raise ValueError(
                f"{table.name}: columns maps {role!r} to {column!r}, which this file does not have; found "
                f"{list(found)}.{did_you_mean(column, found)}"
            )
    applied = {role: column for role, column in names.items() if column in found}
    role_of = {column: role for role, column in applied.items()}
    columns = {
        role_of.get(name, name): values
        for name, values in table.columns.items()
        if name in role_of or name not in applied  # a file's own 'anchor' gives way to the mapped one
    }
    rows = table.rows if table.rows is not None else (len(table.lines) if table.lines is not None else None)
    return dataclasses.replace(table, columns=columns, found=tuple(found), renamed=applied, rows=rows)


def map_columns(table: TextTable, columns: Mapping[str, str]) -> TextTable:
    """``table`` with the file's columns that ``columns`` names read under the loader's names; mapped
    columns the file lacks are left out (unlike :func:`read_text_tables`, which refuses them).

    Example:
        >>> table = TextTable(Path("q.jsonl"), {"query": ["x"]}, [1], "0" * 64, found=("query",))
        >>> mapped = map_columns(table, {"anchor": "query", "positive": "pos"})
        >>> list(mapped.columns), mapped.where(0, "anchor")
        (['anchor'], "q.jsonl: line 1, column 'query'")
    """
    found = table.found or tuple(table.columns)
    return _mapped(table, found, {role: column for role, column in columns.items() if column in found})


def read_text_tables(
    path: str | Path,
    keep: Callable[[str], bool] | None = None,
    columns: Mapping[str, str] | None = None,
    *,
    own_names: bool = False,
) -> tuple[TextTable, TextTable | None]:
    """Read a table of texts; see the module docstring for the formats.

    Args:
        path (str | Path): The file or ``datasets`` folder.
        keep (Callable[[str], bool], optional): Which columns to keep, by the loader's names (Parquet and
            ``datasets`` read only those). Default: all.
        columns (Mapping[str, str], optional): Columns to read under another name: the loader's name to
            the file's (checked by :func:`~composer_dynsample.data.text.columns.check_column_map`).
            Default: ``None`` (the file's names).
        own_names (bool): A mapped column the file lacks may be read under the loader's own name (a
            test file that keeps the standard names). Default: ``False`` (refused).

    Returns:
        tuple[TextTable, TextTable | None]: The table, and the ``test`` split of a ``DatasetDict`` folder
        (``None`` for everything else).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: If it is neither a regular file nor a folder, the format is unknown, the content is
            not valid for it, a mapped column is missing, or it holds no rows.

    Example:
        >>> import tempfile
        >>> file = Path(tempfile.mkdtemp()) / "pairs.csv"
        >>> _ = file.write_text('query,pos\\n"two\\nlines",b\\n')
        >>> table, _ = read_text_tables(file, columns={"anchor": "query", "positive": "pos"})
        >>> table.columns["anchor"], table.lines, table.where(0, "anchor").endswith("line 2, column 'query'")
        (['two\\nlines'], [2], True)
    """
    file = Path(path).expanduser()
    names = dict(columns or {})
    keep = _source_keep(keep or (lambda name: True), names)
    if check_path_kind(file, _FORMATS, directory=True):
        table, test = _read_dataset_folder(file, keep, names)
    else:
        suffix = file.suffix.lower()
        if suffix not in (*_JSON_SUFFIXES, *_DELIMITERS, ".parquet"):
            raise ValueError(f"{file}: unsupported file type {suffix!r}; expected {_FORMATS}.")
        data = file.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if suffix == ".parquet":
            kept, found, rows = _read_parquet(file, keep)
            table = _mapped(TextTable(file, kept, None, digest, rows=rows), found, names, own_names=own_names)
        else:
            text = _decode(file, data)
            if suffix in _JSON_SUFFIXES:
                read, lines = _read_json_lines(file, text)
            else:
                read, lines = _read_csv(file, text, _DELIMITERS[suffix])
            kept = {name: values for name, values in read.items() if keep(name)}
            table = _mapped(TextTable(file, kept, lines, digest), list(read), names, own_names=own_names)
        test = None
    for each in (table, test):
        if each is not None and each.num_rows == 0:
            raise ValueError(f"{each.name}: holds no rows.")
    return table, test


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
            check_unicode(table, row, column, value)
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


def check_unicode(table: TextTable, row: int, column: str, text: str) -> None:
    """Refuse a text holding a lone surrogate (``"\\ud800"`` in JSON): no tokenizer can encode it.

    Raises:
        ValueError: Naming the line, the column and the character's position in the text.
    """
    found = _SURROGATE.search(text)
    if found is not None:
        raise ValueError(
            f"{table.where(row, column)}: the text holds a lone surrogate \\u{ord(found.group()):04x} at "
            f"character {found.start() + 1}, which is not Unicode text; remove it or write the character "
            "it stands for."
        )


def hashable_column(table: TextTable, column: str) -> list[Any]:
    """The values of a label or group column, checked: present, not NaN, and hashable (strings, numbers,
    booleans). A NaN (JSON's ``NaN``, a Parquet null read as a float) would make each row a class of its
    own, as NaN equals nothing.

    Raises:
        ValueError: Naming the line and column of the first missing, NaN or unhashable value.
    """
    values = table.columns[column]
    for row, value in enumerate(values):
        if value is None or (isinstance(value, str) and not value.strip()):
            raise ValueError(f"{table.where(row, column)}: the {column} is missing; every row needs one.")
        if isinstance(value, float) and math.isnan(value):
            raise ValueError(
                f"{table.where(row, column)}: the {column} is NaN, which equals no other value (each such "
                f"row would be a {column} of its own); give every row a {column}."
            )
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
