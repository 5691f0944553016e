"""The Hugging Face ``AutoModel`` a :class:`~composer_dynsample.models.transformer.TransformerEncoder` wraps.

:func:`_load_pretrained` loads it from a local model directory only (never a download), saying in one
line what of the folder's weights it leaves unused and warning of those the folder lacks;
:func:`_from_config` builds it randomly initialised from a ``model_type`` and its arguments, checked
against the model's config. Both ask for the attention implementation the encoder runs (``"sdpa"``
falls back to ``"eager"`` for a model without it) and drop the model's own pooler where it can be left
out. :func:`quiet_transformers` keeps ``transformers``' load reports and progress bars out of the output
(the exports use it too). ``transformers`` is imported only when a model is built.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from torch import nn

from composer_dynsample.distributed import get_rank
from composer_dynsample.models.sentence_folder import ModelFolder
from composer_dynsample.models.tokens import import_text_extra

__all__ = ["quiet_transformers"]


def _with_attention(build: Any, *args: Any, attn_implementation: str, **kwargs: Any) -> nn.Module:
    """``build(..., attn_implementation=...)``; ``"sdpa"`` falls back to ``"eager"`` for a model without it."""
    try:
        return _without_pooler(build, *args, attn_implementation=attn_implementation, **kwargs)
    except (ValueError, ImportError) as error:
        if attn_implementation != "sdpa" or "scaled_dot_product_attention" not in str(error):
            raise
    return _without_pooler(build, *args, attn_implementation="eager", **kwargs)


def _load_pretrained(
    path: str | os.PathLike[str], folder: ModelFolder, attn_implementation: str = "sdpa"
) -> nn.Module:
    """``AutoModel.from_pretrained`` from a local directory only; a one-line error for anything else."""
    directory = folder.model_dir
    if not (directory / "config.json").is_file():
        reason = "holds no config.json" if directory.is_dir() else "does not exist"
        raise ValueError(
            f"path must be a local directory holding a Hugging Face model (config.json and weights); "
            f"{str(path)!r} {reason}. TransformerEncoder never downloads: save the model there first."
        )
    auto_model = import_text_extra("transformers", "TransformerEncoder").AutoModel
    try:
        with quiet_transformers():
            model, info = _with_attention(
                auto_model.from_pretrained,
                str(directory),
                attn_implementation=attn_implementation,
                local_files_only=True,
                output_loading_info=True,
            )
    except (OSError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"path {str(path)!r}: the model could not be loaded: {first_line}") from error
    _report_loading(str(path), type(model).__name__, info)
    if folder.other_modules:
        warnings.warn(
            f"model {path}: modules.json lists {_listed(list(folder.other_modules))}, which "
            "TransformerEncoder does not build: its embeddings are not the folder's (sentence-transformers').",
            UserWarning,
            stacklevel=3,
        )
    return model


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """``transformers`` logs only errors and shows no progress bars inside; as before afterwards.

    Its load report (a table of unexpected and missing weights, with terminal colour codes) and its
    progress bars of loading and saving weights are left out: the callers say what matters in one line.
    """
    logging = import_text_extra("transformers", "TransformerEncoder").utils.logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _modules(keys: Any) -> list[str]:
    """The outermost modules of parameter names, sorted: ``pooler.dense.weight`` -> ``pooler.dense``."""
    names = sorted({str(key).rpartition(".")[0] or str(key) for key in keys or ()})
    return [name for name in names if not any(name.startswith(f"{other}.") for other in names)]


def _listed(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def _report_loading(path: str, model_name: str, info: Mapping[str, Any]) -> None:
    """One line on rank 0 for the folder's weights the encoder does not use; a warning for those it lacks."""
    unused = _modules(info.get("unexpected_keys"))
    pooler = [name for name in unused if "pooler" in name.split(".")]
    others = [name for name in unused if name not in pooler]
    notes = []
    if pooler:
        notes.append(f"its pooler ({_listed(pooler)}) is not used by mean/CLS pooling and was dropped")
    if others:
        notes.append(
            f"{_listed(others)} are not part of {model_name} (heads of another task) and were not loaded"
        )
    if notes and get_rank() == 0:
        print(f"model {path}: {'; '.join(notes)}.")
    missing = _modules(info.get("missing_keys"))
    if missing:
        warnings.warn(
            f"model {path}: the folder holds no weights for {_listed(missing)}; {model_name} initialised them "
            "randomly: train the model before use.",
            UserWarning,
            stacklevel=4,
        )


def _from_config(config: Any, vocab_size: int | None, attn_implementation: str = "sdpa") -> nn.Module:
    """A randomly initialised ``AutoModel`` of ``config``'s ``model_type`` and arguments (its own
    ``attn_implementation`` before the encoder's)."""
    if not isinstance(config, Mapping) or not isinstance(config.get("model_type"), str):
        raise ValueError(
            f"config must be a mapping with a 'model_type' (such as 'bert') and the model's sizes, got {config!r}."
        )
    transformers = import_text_extra("transformers", "TransformerEncoder")
    auto_config = transformers.AutoConfig
    arguments = {key: value for key, value in config.items() if key != "model_type"}
    model_type = config["model_type"]
    try:
        defaults = auto_config.for_model(model_type)
    except ValueError:
        raise ValueError(
            f"config['model_type'] must be a transformers model type such as 'bert', 'roberta' or "
            f"'distilbert', got {model_type!r}."
        ) from None
    known = set(defaults.to_dict()) | {"attn_implementation"}
    unknown = sorted(set(arguments) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"config: {model_type!r} has no argument {unknown[0]!r}{hint}")
    if vocab_size is None and "vocab_size" not in arguments:
        raise ValueError("TransformerEncoder with a config needs vocab_size (the tokenizer's).")
    if vocab_size is not None and arguments.setdefault("vocab_size", vocab_size) != vocab_size:
        raise ValueError(
            f"config['vocab_size'] is {arguments['vocab_size']} but vocab_size (the tokenizer's) is "
            f"{vocab_size}; leave vocab_size out of config."
        )
    model_config = auto_config.for_model(model_type, **arguments)
    if "attn_implementation" in arguments:
        return _without_pooler(transformers.AutoModel.from_config, model_config)
    return _with_attention(
        transformers.AutoModel.from_config, model_config, attn_implementation=attn_implementation
    )


def _without_pooler(build: Any, *args: Any, **kwargs: Any) -> nn.Module:
    """``build(*args, add_pooling_layer=False)`` where the model takes it (BERT, RoBERTa...), else ``build``."""
    try:
        return build(*args, add_pooling_layer=False, **kwargs)
    except TypeError as error:
        if "add_pooling_layer" not in str(error):
            raise
        return build(*args, **kwargs)
