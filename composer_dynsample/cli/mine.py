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
against the store's text hashes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from composer_dynsample.cli.commands import _build_model_run, _out_path, _prepare_model_run
from composer_dynsample.cli.run_dir import is_rank_zero
from composer_dynsample.config.components import ConfigError, peek_entry
from composer_dynsample.config.loading import section
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
        trust_checkpoint (bool): Skip the safety check of the file. Default: ``False``.

    Returns:
        Path: The file written.

    Raises:
        OutputError: If ``out`` is a directory or cannot be written (before anything is loaded).
        ConfigError: If the sampler is not ``mined_negatives``, the data are not pairs, ``negatives`` is
            below 1 or above the sampler's window, or the training file changed since it was read.
        CheckpointError: If ``checkpoint`` is unsafe, broken, or does not fit the config's model.
    """
    from composer_dynsample.algorithms.embedding_table._training_set import encode_training_set
    from composer_dynsample.samplers.mined_negatives import MinedNegativesPKBatchSampler

    if negatives is not None and (isinstance(negatives, bool) or negatives < 1):
        raise ConfigError(f"--negatives must be at least 1, got {negatives!r}.")
    path = _out_path(out, "triplets.jsonl")
    cfg, directory = _prepare_model_run(config, checkpoint, overrides, trust_checkpoint)
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


def training_texts(splits: Any) -> list[str]:
    """The text of every sampled row of a pairs training split, read back from its training file.

    The file is the first one the loader read (``splits.info.files``); row ``r`` is the ``anchor`` (a
    query) or the ``positive`` of the file's row ``store.source_rows[r]``, under the run's ``data.columns``.

    Raises:
        ConfigError: If the data name no file, or the file or its texts changed since they were loaded.
    """
    from composer_dynsample.data.text.table import read_text_tables, text_column
    from composer_dynsample.data.text.tokenized import text_hash

    store, info = splits.train, getattr(splits, "info", None)
    name = next(iter(getattr(info, "files", None) or {}), None)
    file = None if name is None else re.sub(r" \(split '[^']*'\)$", "", name)
    if file is None or not Path(file).exists():
        raise ConfigError(
            f"mine reads the pairs' texts back from the training file, and {splits.name!r} names none; use "
            "data.name: pairs with a data.path."
        )
    table, _ = read_text_tables(file, lambda column: column in ("anchor", "positive"), info.columns)
    size = len(store)
    rows, is_query = store.source_rows[:size].tolist(), store.is_query[:size].tolist()
    columns = {True: text_column(table, "anchor"), False: text_column(table, "positive")}
    texts = [columns[query][row] for row, query in zip(rows, is_query)]
    hashes = np.fromiter((text_hash(text) for text in texts), dtype=np.int64, count=size)
    if table.sha256 != info.files[name] or not np.array_equal(hashes, store.text_hash[:size]):
        raise ConfigError(f"{name} changed since it was loaded; run mine again.")
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
    """Write the first ``count`` survivors of every anchor (pairs in sorted label order), atomically; the lines."""
    from composer_dynsample.samplers._corpus_search import pair_layout

    anchors, positives, _ = pair_layout(sampler.labels, sampler.is_passage)
    chosen = found.survivors()[:, :count]
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    written = 0
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            for anchor, positive, negatives in zip(anchors.tolist(), positives.tolist(), chosen.tolist()):
                for negative in negatives:
                    if negative < 0:
                        break
                    row = {"anchor": texts[anchor], "positive": texts[positive], "negative": texts[negative]}
                    handle.write(json.dumps(row, ensure_ascii=False) + "\n")
                    written += 1
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return written
