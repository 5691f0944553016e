"""``composer-dynsample export``: a checkpoint's text encoder as a folder other libraries load.

The command around :mod:`composer_dynsample.export` (which writes the folders): it checks ``--out``,
builds the model with the checkpoint's weights (without the data when the config allows), and writes a
sentence-transformers folder or Hugging Face files on rank 0.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from composer_dynsample.cli.commands import (
    OutputError,
    _build_model_run,
    _out_path,
    _prepare_model_run,
    _run_dir_of,
)
from composer_dynsample.cli.run_dir import is_rank_zero
from composer_dynsample.config.components import ConfigError
from composer_dynsample.validation import check_choice

__all__ = ["EXPORT_FORMATS", "export"]


#: The formats of ``export``: a sentence-transformers model directory, or Hugging Face files.
EXPORT_FORMATS = ("sentence-transformers", "huggingface")


def export(
    config: str | os.PathLike[str] | Mapping[str, Any],
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    *,
    export_format: str = "sentence-transformers",
    trust_checkpoint: bool = False,
) -> Path:
    """Write a checkpoint's text encoder and the run's tokenizer as a directory other libraries load.

    ``"sentence-transformers"`` (a transformer encoder): ``SentenceTransformer(out)`` embeds texts as the
    model does (pooling, projection and normalisation included, texts truncated to the data's
    ``max_length``); two towers of transformers are one ``Router``, whose ``encode_query`` embeds as the
    query tower and ``encode_document`` as the passage tower. ``"huggingface"`` (any text encoder):
    ``AutoModel``/``AutoTokenizer`` files, or for the bag-of-tokens and CNN encoders their state dict (of
    two towers, one folder each: ``query/`` and ``passage/``), read back by
    :func:`~composer_dynsample.export.load_exported_encoder`. See :mod:`composer_dynsample.export`.

    Args:
        config (str | os.PathLike | Mapping): The config the checkpoint was trained with.
        checkpoint (str | os.PathLike): The checkpoint file.
        out (str | os.PathLike): A new or empty directory.
        overrides (Sequence[str]): Dotted overrides. Default: none.
        export_format (str): ``--format``: ``"sentence-transformers"`` or ``"huggingface"``.
            Default: ``"sentence-transformers"``.
        trust_checkpoint (bool): Skip the safety check of the file. Default: ``False``.

    Returns:
        Path: The directory written.

    Raises:
        OutputError: If ``out`` exists and is not an empty directory, is under a file, or is in a folder
            that cannot be written in (before anything is loaded).
        ConfigError: If the data are not texts, or the encoder does not fit the format.
    """
    from composer_dynsample.config.model_folders import passage_tokenizer_of
    from composer_dynsample.config.model_only import build_model_only
    from composer_dynsample.config.prompts import exported_prompts
    from composer_dynsample.data import TextSplits
    from composer_dynsample.data.text.tokenizer import load_tokenizer
    from composer_dynsample.distributed import unwrap_model
    from composer_dynsample.export import export_huggingface, export_sentence_transformers, run_metrics

    export_format = check_choice("format", export_format, EXPORT_FORMATS)
    target = _out_path(out, directory=True)
    cfg, directory = _prepare_model_run(config, checkpoint, overrides, trust_checkpoint)
    passage = passage_tokenizer_of(cfg)
    run = build_model_only(cfg, checkpoint) or _build_model_run(cfg, directory)  # see model_only
    if not isinstance(run.splits, TextSplits):
        raise ConfigError(
            f"export writes text encoders, but {run.splits.name!r} holds feature tensors, not texts."
        )
    write = export_sentence_transformers if export_format == EXPORT_FORMATS[0] else export_huggingface
    if is_rank_zero():
        tokenizer, max_length = run.splits.info.load_tokenizer(), run.splits.info.max_length
        card = {}  # a sentence-transformers folder's model card: the run's data, recipe and metrics
        if write is export_sentence_transformers:
            card = {"config": run.config, "metrics": run_metrics(_run_dir_of(Path(checkpoint)))}
            card.update(exported_prompts(run.config, run.splits.info.prompts))
        else:
            card = {"prompts": run.splits.info.prompts}  # kept in encoder_config.json, and said below
        card.update({"passage_tokenizer": load_tokenizer(passage)} if passage is not None else {})
        try:
            write(unwrap_model(run.model), tokenizer, target, max_length=max_length, **card)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"export --format {export_format}: {error}") from error
        except OSError as error:  # the export wrote into a folder beside --out, removed: nothing is left
            raise OutputError(
                f"--out {str(out)!r} could not be written ({error.strerror or error}); nothing was left there: "
                "free some space or choose another --out."
            ) from None
        print(f"wrote the {export_format} model of {Path(checkpoint).name} to {target}")
        if write is export_huggingface and run.splits.info.prompts:
            print(_prompts_note(run.splits.info.prompts), file=sys.stderr)
    return target


def _prompts_note(prompts: Mapping[str, str]) -> str:
    """The line that says a Hugging Face export's texts need the run's prompts put before them."""
    import json

    said = json.dumps(dict(prompts), ensure_ascii=False)
    return (
        f"note: the huggingface format has no place for prompts; the run put {said} (by column) before its "
        "texts, kept in encoder_config.json: put them before texts yourself, or export --format "
        "sentence-transformers"
    )
