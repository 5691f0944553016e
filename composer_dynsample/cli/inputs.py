"""What ``composer-dynsample embed --input`` embeds: a file of the config's kind, read as training read its data.

- **Texts** (a config whose data are texts): a JSON Lines, CSV, TSV or Parquet file or a ``datasets``
  folder with a ``text`` column (passages), an ``anchor`` column (queries), or ``anchor`` and
  ``positive`` columns (pairs), under the names the run's ``data.columns`` maps too, tokenized with the
  run's tokenizer and truncated to its ``max_length``. Rows of a ``text`` file are passages
  (``is_query`` false), rows of an ``anchor`` file queries (``is_query`` true: a two-tower encoder
  embeds them with its query tower); a pair file gives each pair's anchor (a query) and positive, in
  that order (anchor 0, positive 0, anchor 1, ...). ``--column NAME`` (``text``, ``anchor`` or
  ``positive``, or the file's own name for a column ``data.columns`` maps) embeds that column alone,
  one row per file row in file order. Other columns are ignored. The file must be a regular file or a
  ``datasets`` folder. Each column's texts get the run's prompt of that column (``data.prompts``; a
  ``text`` column the passages' prompt), or the one ``--prompt`` / ``--prompt-name`` gives
  (:func:`embed_prompt`).
- **Images** (a config whose items are ``(C, H, W)`` images): a folder of image files, read and resized
  to the training images' size and channels.

The result is a store to embed and the arrays written beside the embeddings: ``indices``, each
embedding's row in the file (0-based, in file order), and for texts ``is_query``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from composer_dynsample.config.components import ConfigError
from composer_dynsample.data import DatasetSplits, TensorStore, TextSplits, TextStore
from composer_dynsample.data.images import read_images
from composer_dynsample.data.text.prompts import column_prompt, prompt_layout, prompt_token_count
from composer_dynsample.data.text.table import map_columns, read_text_tables, text_column
from composer_dynsample.data.text.tokenized import TextInterner, tokenize_texts
from composer_dynsample.data.text.tokenizer import load_tokenizer
from composer_dynsample.validation import check_choice, did_you_mean

__all__ = ["EMBED_COLUMNS", "check_embed_source", "embed_prompt", "read_embed_input", "split_arrays"]

#: The columns of a text file that ``embed --input`` reads, by the run's names: passages, queries, pairs.
EMBED_COLUMNS = ("text", "anchor", "positive")


def check_embed_source(
    split: str | None, input_path: object, column: str | None, prompt: str | None = None
) -> str:
    """The split ``embed`` reads when it reads no ``--input`` (``"test"`` unless given), once the options
    are checked to go together: a split or an ``--input``, and ``--column`` and ``--prompt`` (or
    ``--prompt-name``, given as ``prompt``) only with ``--input``.

    Raises:
        ConfigError: One line naming the options that do not go together, or a split that is not one.
    """
    if split is not None and input_path is not None:
        raise ConfigError(
            f"embed takes a split or an --input, not both: got split={split!r} and --input {str(input_path)!r}."
        )
    if column is not None and input_path is None:
        raise ConfigError(
            f"--column {column!r} picks a column of an --input file; add --input FILE (a split is embedded "
            "whole: its is_query array tells the queries from the passages)."
        )
    if prompt is not None and input_path is None:
        raise ConfigError(
            f"--prompt/--prompt-name {prompt!r} prompts the texts of an --input file; a split is embedded with "
            "the prompts it was tokenized with (data.prompts): add --input FILE."
        )
    return check_choice("split", split or "test", ("test", "train"))


def embed_prompt(cfg: Any, prompt: str | None, prompt_name: str | None) -> str | None:
    """The prompt ``--prompt`` gives, or the model folder's prompt ``--prompt-name`` names; ``None``: the
    run's own prompts.

    Raises:
        ConfigError: If both are given, or the name is not one of the folder's prompts (one line naming
            those it has), or the model has no folder.
    """
    if prompt_name is None:
        return prompt
    if prompt is not None:
        raise ConfigError(f"give --prompt or --prompt-name, not both: got {prompt!r} and {prompt_name!r}.")
    from composer_dynsample.config.prompts import data_prompts

    return data_prompts(cfg, None, prompt_name, key="--prompt-name")


def read_embed_input(
    path: str | os.PathLike[str],
    splits: DatasetSplits,
    column: str | None = None,
    prompt: str | None = None,
    passage_tokenizer: str | None = None,
) -> tuple[TensorStore | TextStore, dict[str, np.ndarray]]:
    """Read ``path`` as items of the kind ``splits`` holds: ``(store to embed, arrays for the .npz)``.

    Args:
        path (str | os.PathLike): The file (texts) or folder (images).
        splits (DatasetSplits): The run's data, for its tokenizer and ``max_length``, or its image size.
        column (str, optional): ``--column``: embed only this column of a text file, in file order.
            Default: ``None`` (``text``, else ``anchor`` and, when there, ``positive``, row by row).
        prompt (str, optional): Put this before every text (``""``: none). Default: ``None``: each
            column's prompt of the run (``text`` takes the passages', ``positive``'s).
        passage_tokenizer (str, optional): Two towers of two tokenizers: the passage tower's, by which the
            texts that are not queries are tokenized. Default: ``None`` (the run's tokenizer for all).

    Returns:
        tuple: The store (every sampled row is embedded, in order) and ``indices`` (and ``is_query``).

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        ValueError: One line naming the file (and line and column) of bad content, a ``column`` the
            file does not have (with those it has), or data of a kind that takes no ``--input`` (or no
            ``--column``).
    """
    file = Path(path).expanduser()
    if not file.exists():
        raise FileNotFoundError(f"--input {str(path)!r}: no such file or directory.")
    if isinstance(splits, TextSplits):
        return _read_texts(file, splits, column, prompt, passage_tokenizer)
    if column is not None or prompt is not None:
        option = "--column" if column is not None else "--prompt"
        raise ValueError(
            f"{option} applies to a text file, but {splits.name!r} is not text data; leave it out."
        )
    shape = splits.train.feature_shape
    if len(shape) != 3:
        raise ValueError(
            f"--input reads texts (for text data) or a folder of images (for image data), but "
            f"{splits.name!r} holds feature vectors of shape {shape}; embed one of its splits with --split."
        )
    if not file.is_dir():
        raise ValueError(f"--input {str(path)!r}: for image data, give a folder of images.")
    images, _ = read_images(file, size=(shape[1], shape[2]), grayscale=shape[0] == 1)
    store = TensorStore(images, torch.zeros(len(images), dtype=torch.int64))
    return store, {"indices": np.arange(len(images), dtype=np.int64)}


def _read_texts(
    file: Path,
    splits: TextSplits,
    column: str | None,
    prompt: str | None,
    passage_tokenizer: str | None = None,
) -> tuple[TextStore, dict[str, np.ndarray]]:
    table = map_columns(read_text_tables(file)[0], splits.info.columns)
    if column is not None and any(name in table.columns for name in EMBED_COLUMNS):
        columns = [_chosen_column(table, column)]
    elif "text" in table.columns:
        columns = ["text"]
    elif "anchor" in table.columns:
        columns = ["anchor", "positive"] if "positive" in table.columns else ["anchor"]
    else:
        raise ValueError(
            f"{table.name}: expected a column 'text' (passages), 'anchor' (queries), or 'anchor' and "
            f"'positive' (pairs), found {list(table.found)}; rename one, or map it with the config's "
            "data.columns (e.g. data.columns={anchor: query})."
        )
    run_prompts = splits.info.prompts
    prompts = {
        column: (
            prompt
            if prompt is not None
            else run_prompts.get("text")
            or column_prompt(run_prompts, "positive" if column == "text" else column)
        )
        for column in columns
    }
    prompts = {column: value for column, value in prompts.items() if value}
    layout = "embed:" + ",".join(columns) + prompt_layout(prompts)
    texts = [[prompts.get(column, "") + text for text in text_column(table, column)] for column in columns]
    ordered: list[Any] = [text for row in zip(*texts) for text in row]  # row by row: anchor, positive
    interner = TextInterner()
    text_ids = interner.add_all(ordered)
    tokenizer = splits.info.load_tokenizer()

    def locate(text_id: int) -> str:
        position = ordered.index(interner.texts[text_id])
        return table.where(position // len(columns), columns[position % len(columns)])

    def tokenized(by: Any) -> Any:
        return tokenize_texts(
            interner.texts, by.tokenizer, max_length=splits.info.max_length,
            cache_dir=splits.info.cache_dirs[0].parent, data_sha256=table.sha256, tokenizer_sha256=by.sha256,
            layout=layout, source=str(file), locate=locate, progress=False,
        )  # fmt: skip

    passage = load_tokenizer(passage_tokenizer) if passage_tokenizer is not None else None
    by_column = {
        column: tokenizer if column == "anchor" or passage is None else passage for column in columns
    }
    rows = np.repeat(np.arange(table.num_rows, dtype=np.int64), len(columns))
    is_query = np.tile(np.array([column == "anchor" for column in columns]), table.num_rows)
    store = TextStore(
        tokenized(tokenizer),
        text_ids,
        np.zeros(len(rows), np.int64),
        pad_id=tokenizer.pad_id,
        vocab_size=tokenizer.vocab_size,
        is_query=is_query,
        source_rows=rows,
        prompt_lengths=np.tile(
            [prompt_token_count(prompts.get(column, ""), by_column[column]) for column in columns],
            table.num_rows,
        )
        if prompts
        else None,
        passage_tokens=tokenized(passage) if passage is not None else None,
        passage_pad_id=passage.pad_id if passage is not None else None,
    )
    return store, {"indices": rows, "is_query": is_query}


def _chosen_column(table: Any, column: str) -> str:
    """The run's name of the column ``--column`` names (the run's name, or the file's own name of a mapped
    column), or a ``ValueError`` naming the columns the file has to embed."""
    present = [name for name in EMBED_COLUMNS if name in table.columns]
    own = {table.renamed[name]: name for name in present if name in table.renamed}
    if column in present or column in own:
        return own.get(column, column)
    named = [
        f"{name!r}" + (f" (the file's {table.renamed[name]!r})" if name in table.renamed else "")
        for name in present
    ]
    listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + f" or {named[-1]}"
    raise ValueError(
        f"--column {column!r}: {table.name} has no such column to embed; choose {listed} "
        f"(e.g. --column {present[0]}).{did_you_mean(column, [*present, *own])}"
    )


def split_arrays(store: TensorStore | TextStore) -> dict[str, np.ndarray]:
    """The arrays written beside a split's embeddings: ``labels``, ``indices`` (its rows) and, for texts,
    ``is_query`` and ``source_rows`` (each row's row in the data file)."""
    arrays = {"labels": store.labels.numpy(), "indices": np.arange(len(store), dtype=np.int64)}
    if isinstance(store, TextStore):
        arrays["is_query"] = store.is_query[: len(store)]
        arrays["source_rows"] = store.source_rows[: len(store)]
    return arrays
