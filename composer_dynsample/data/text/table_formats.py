"""The file formats a table of texts is read from, parsed to columns: JSON Lines, CSV and TSV, and Parquet.

:func:`~composer_dynsample.data.text.table.read_text_tables` picks the format from the path and reads the
file through these: :func:`_decode` (UTF-8, a leading byte-order mark dropped), :func:`_read_json_lines`
and :func:`_read_csv` (each row's line, for the error messages) and :func:`_read_parquet` (only the columns
asked for, with every column's name and the row count). Each returns plain columns (name to values in row
order); a problem is one ``ValueError`` line naming the file (and the line, for JSON Lines and CSV), with
:func:`_first_line` of a library's error. A ``datasets`` folder and the column mapping are
:mod:`~composer_dynsample.data.text.table`'s.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


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
    start = 1
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
        # A quote left open runs on to the end of the file: name the line its record started on.
        if "unexpected end of data" in str(error):
            raise ValueError(
                f"{path}: line {start}: a quoted field opened in the record that starts on this line is "
                "never closed (the file ended inside it); close the quote, or double a quote inside a "
                'field ("").'
            ) from None
        raise ValueError(
            f"{path}: line {start}: not valid CSV ({error}); check the quotes of the record that starts on "
            'this line (a quote inside a quoted field is written "").'
        ) from None
    finally:
        csv.field_size_limit(limit)
    return {name: [record[i] for record in records] for i, name in enumerate(header)}, lines


def _read_parquet(path: Path, keep: Callable[[str], bool]) -> tuple[dict[str, list[Any]], list[str], int]:
    """``(the kept columns, every column's name, the number of rows)``."""
    try:
        import pyarrow.parquet as parquet

        names = parquet.read_schema(path).names
        table = parquet.read_table(path, columns=[name for name in names if keep(name)])
        rows = parquet.read_metadata(path).num_rows
    except ImportError:
        raise
    except Exception as error:  # pyarrow raises ArrowInvalid, OSError, ...
        raise ValueError(f"{path}: not a readable Parquet file ({_first_line(error)}).") from None
    return table.to_pydict(), list(names), int(rows)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
