"""``composer-dynsample mine``: the hard negatives a pairs config's ``mined_negatives`` sampler mines, written
as JSON Lines of ``anchor``, ``positive`` and ``negative`` texts.

The model (a checkpoint's, or the model as built) encodes the training pairs as the embedding table's warm
start does (``encode_training_set``: :func:`~composer_dynsample.models.embed.embed_store` in eval mode,
without gradients, each rank a share of the rows); the sampler's own corpus search
(:func:`~composer_dynsample.samplers.mined_negatives.corpus_candidates`, with the sampler's ``skip_top``,
``window``, ``max_relative_similarity``, ``absolute_margin``, ``search`` and text ids) ranks each anchor's
passages of other pairs and drops what its guards drop; the first N survivors of each anchor, nearest
first, are written, one line per anchor and negative. That is the layout of sentence-transformers'
``mine_hard_negatives(..., output_format="triplet")``: ``datasets.load_dataset("json", data_files=...)``
reads the file, and so does this package's ``pairs`` loader (``negative`` is a given negative).

The token store keeps token ids only, so the texts are read back from the training file, checked
against the store's text hashes (of the texts as the run prompted them); the lines hold the file's texts,
without the run's prompts, as sentence-transformers' trainer takes them. An existing ``--out`` is replaced
only with ``--overwrite``, and never when it is one of the run's data files; the file appears whole or
not at all.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from composer_dynsample.cli.commands import OutputError, _build_model_run, _out_path, _prepare_model_run
from composer_dynsample.cli.embed import written_whole
from composer_dynsample.cli.run_dir import is_rank_zero
from composer_dynsample.config.components import ConfigError, peek_entry
from composer_dynsample.config.loading import section
from composer_dynsample.config.mix_data import one_source
from composer_dynsample.config.names import DATASETS, SAMPLERS

__all__ = ["PAIR_DATA", "mine", "training_texts"]

#: The data loaders (``data.name``) whose training split is pairs, the data ``mine`` takes.
PAIR_DATA = ("pairs", "code_search")


def mine(
    config: str | os.PathLike[str] | Mapping[str, Any],
    checkpoint: str | os.PathLike[str] | None,
    out: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    *,
    negatives: int | None = None,
    overwrite: bool = False,
    source: str | None = None,
    trust_checkpoint: bool = False,
) -> Path:
    """Write the hard negatives the config's ``mined_negatives`` sampler would mine with a model, as JSON Lines.

    Args:
        config (str | os.PathLike | Mapping): A config of pairs data (``data.name`` ``pairs`` or
            ``code_search``) and ``sampler.name: mined_negatives``.
        checkpoint (str | os.PathLike, optional): The checkpoint whose model encodes the pairs. Default:
            ``None`` (the model the config builds, the one ``train`` starts from).
        out (str | os.PathLike): The JSON Lines file: ``{"anchor", "positive", "negative"}`` per line.
        overrides (Sequence[str]): Dotted overrides (e.g. ``sampler.window=8``). Default: none.
        negatives (int, optional): ``--negatives``: negatives per anchor, at most ``sampler.window``.
            Default: ``sampler.negatives_per_anchor``.
        overwrite (bool): ``--overwrite``: replace ``out`` when it exists. Default: ``False`` (refuse).
        source (str, optional): ``--source NAME``: of a mix of data sets, the source whose pairs and
            sampler are mined. Default: ``None`` (the data is one data set).
        trust_checkpoint (bool): Skip the safety check of the file. Default: ``False``.

    Returns:
        Path: The file written.

    Raises:
        OutputError: If ``out`` is a directory, exists without ``overwrite`` or cannot be written (before
            anything is loaded), is one of the run's data files, or writing it fails (a full disk).
        ConfigError: If the sampler is not ``mined_negatives``, the data are not pairs, ``negatives`` is
            below 1 or above the sampler's window, or the training file changed since it was read.
        CheckpointError: If ``checkpoint`` is unsafe, broken, or does not fit the config's model.
    """
    from composer_dynsample.algorithms.embedding_table._training_set import encode_training_set
    from composer_dynsample.samplers.mined_negatives import MinedNegativesPKBatchSampler

    if negatives is not None and (isinstance(negatives, bool) or negatives < 1):
        raise ConfigError(f"--negatives must be at least 1, got {negatives!r}.")
    path = _out_path(out, "triplets.jsonl", overwrite=overwrite)
    cfg, directory = _prepare_model_run(config, checkpoint, overrides, trust_checkpoint)
    cfg = one_source(cfg, source, "mine")  # a mix: the pairs and sampler of --source NAME
    _check_mine_config(cfg, MinedNegativesPKBatchSampler)
    run = _build_model_run(cfg, directory, trained=checkpoint is not None)
    sampler = getattr(run.train_dataloader, "batch_sampler", None)
    if not isinstance(sampler, MinedNegativesPKBatchSampler):
        raise ConfigError(
            f"mine takes the train loader's mined_negatives sampler, and this one is {type(sampler).__name__}."
        )
    count = sampler.negatives_per_anchor if negatives is None else int(negatives)
    if count > sampler.window:
        raise ConfigError(
            f"--negatives {count} is more than the sampler's window of {sampler.window} candidates per anchor; "
            f"add the override sampler.window={count}, or pass --negatives {sampler.window} or fewer."
        )
    _check_not_data(path, run.splits)
    store = run.splits.train
    _say(f"mine: reading the texts of the {len(store) // 2} training pairs back from the data file")
    texts = training_texts(run.splits)
    model = "the model as built" if checkpoint is None else Path(checkpoint).name
    _say(f"mine: encoding the {len(store)} training texts of {run.splits.name!r} with {model}")
    # As the embedding table's warm start: each rank a share of the rows, gathered on every rank.
    collate = run.train_dataloader.collate_fn
    rows, encoded = encode_training_set(run.trainer.state.model, collate, len(store), run.batch_sizes[1])
    embeddings = encoded[rows.argsort()]
    anchors = len(store) // 2
    _say(
        f"mine: searching the nearest passages of {anchors} anchors (search={sampler.search}, "
        f"skip_top={sampler.skip_top}, window={sampler.window})"
    )
    found = _search(sampler, embeddings)
    if is_rank_zero():
        written = _write(path, found, sampler, texts, count)
        dropped = ", ".join(f"{name} {total}" for name, total in _dropped(found).items() if total) or "none"
        _say(
            f"wrote {written} triplets ({int((found.survivors()[:, :count] >= 0).any(axis=1).sum())} of "
            f"{anchors} anchors with a negative, at most {count} each; the guards dropped {dropped}) to {path}"
        )
    return path


def _say(line: str) -> None:
    if is_rank_zero():
        print(line, flush=True)


def _check_mine_config(cfg: Any, sampler_class: type) -> None:
    """Refuse a config whose sampler is not ``mined_negatives`` or whose data are not pairs, before any data load."""
    sampler = section(cfg, "sampler", "sampler")
    target = peek_entry("sampler", sampler, SAMPLERS) if sampler else None
    if not (isinstance(target, type) and issubclass(target, sampler_class)):
        named = sampler.get("_component_", sampler.get("name")) if sampler else None
        raise ConfigError(
            f"mine writes what a mined_negatives sampler mines, and this config's sampler is {named!r}; use a "
            "mined_negatives config, or add the overrides 'sampler={name: mined_negatives, pairs_per_batch: 8, "
            "negatives_per_anchor: 1}' 'algorithms.embedding_table={}'."
        )
    data = section(cfg, "data", "data")
    if "_component_" not in data and data.get("name") not in PAIR_DATA:
        peek_entry("data", data, DATASETS)  # an unknown name is the registry's one line
        raise ConfigError(
            f"mine mines negatives among text pairs (data.name: {' or '.join(PAIR_DATA)}), and this config's "
            f"data are {data.get('name')!r}; use a pairs config."
        )


def _data_files(splits: Any) -> list[Path]:
    """The files a run's data were read from (``splits.info.files``, a ``datasets`` split's suffix removed)."""
    names = getattr(getattr(splits, "info", None), "files", None) or {}
    return [Path(re.sub(r" \(split '[^']*'\)$", "", name)) for name in names]


def _check_not_data(path: Path, splits: Any) -> None:
    """Refuse an ``--out`` that is one of the data files the triplets are read from, even with ``--overwrite``."""
    for file in _data_files(splits):
        if path.exists() and file.exists() and os.path.samefile(path, file):
            raise OutputError(
                f"--out {str(path)!r} is the run's data file {str(file)!r}; writing the triplets there would "
                "replace the pairs they are read from: choose another file."
            )


def training_texts(splits: Any) -> list[str]:
    """The text of every sampled row of a pairs training split, read back from its training file.

    The file is the first one the loader read (``splits.info.files``); row ``r`` is the ``anchor`` (a
    query) or the ``positive`` of the file's row ``store.source_rows[r]``, under the run's ``data.columns``,
    without the prompt the run put before it (``data.prompts``; the store's hashes are of the prompted text).

    Raises:
        ConfigError: If the data name no file, or the file or its texts changed since they were loaded.
    """
    from composer_dynsample.data.text.prompts import column_prompt
    from composer_dynsample.data.text.table import read_text_tables, text_column
    from composer_dynsample.data.text.tokenized import text_hash

    store, info = splits.train, getattr(splits, "info", None)
    name = next(iter(getattr(info, "files", None) or {}), None)
    file = next(iter(_data_files(splits)), None)
    if file is None:
        raise ConfigError(
            f"mine reads the pairs' texts back from the training file, and {splits.name!r} names none; use "
            "data.name: pairs with a data.path."
        )
    changed = ConfigError(f"{name} changed since it was loaded; run mine again.")
    try:
        table, _ = read_text_tables(file, lambda column: column in ("anchor", "positive"), info.columns)
    except (OSError, ValueError) as error:  # gone, or no longer pairs
        raise changed from error
    size = len(store)
    rows, is_query = store.source_rows[:size].tolist(), store.is_query[:size].tolist()
    if table.sha256 != info.files[name] or max(rows, default=-1) >= table.num_rows:
        raise changed
    columns = {True: text_column(table, "anchor"), False: text_column(table, "positive")}
    texts = [columns[query][row] for row, query in zip(rows, is_query)]
    prompts = {
        query: column_prompt(info.prompts or {}, "anchor" if query else "positive") for query in columns
    }
    hashes = np.fromiter(
        (text_hash(prompts[query] + text) for text, query in zip(texts, is_query)), dtype=np.int64, count=size
    )
    if not np.array_equal(hashes, store.text_hash[:size]):
        raise changed
    return texts  # type: ignore[return-value]


def _search(sampler: Any, embeddings: Any) -> Any:
    """The sampler's corpus search over ``embeddings``, with its options, on the embeddings' CUDA device if any."""
    if sampler.search_device is None and embeddings.device.type == "cuda":
        sampler.search_device = embeddings.device
    return sampler.search_corpus(embeddings)


def _dropped(found: Any) -> dict[str, int]:
    from composer_dynsample.samplers._candidates import GUARDS

    return {name: int(total) for name, total in zip(GUARDS, found.dropped.sum(axis=0).tolist())}


def _write(path: Path, found: Any, sampler: Any, texts: list[str], count: int) -> int:
    """Write the first ``count`` survivors of every anchor (pairs in sorted label order), atomically; the lines.

    Raises:
        OutputError: If the file cannot be written (a full disk): nothing is left at ``path`` or beside it.
    """
    from composer_dynsample.samplers._corpus_search import pair_layout

    anchors, positives, _ = pair_layout(sampler.labels, sampler.is_passage)
    chosen = found.survivors()[:, :count]
    written = 0
    with written_whole(path) as temporary, open(temporary, "w", encoding="utf-8") as handle:
        for anchor, positive, negatives in zip(anchors.tolist(), positives.tolist(), chosen.tolist()):
            for negative in negatives:
                if negative < 0:
                    break
                row = {"anchor": texts[anchor], "positive": texts[positive], "negative": texts[negative]}
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
                written += 1
    return written
