"""The Hugging Face export of a text encoder: :func:`export_huggingface` and :func:`load_exported_encoder`.

:func:`export_huggingface` writes a directory that :func:`load_exported_encoder` reads back: for a
:class:`~composer_dynsample.models.text.TransformerEncoder`, the ``AutoModel``'s ``save_pretrained`` files
(so ``transformers.AutoModel.from_pretrained(out_dir)`` loads it, nothing newly initialised: the pooler
the encoder dropped is written back, the model folder's weights) and the tokenizer
(``AutoTokenizer.from_pretrained(out_dir)``); for the other text encoders, their state dict
(``encoder_state.pt``) beside the tokenizer; for a
:class:`~composer_dynsample.models.text.TwoTowerEncoder`, one such directory per tower (``query/``,
``passage/``). ``encoder_config.json`` names the class and its arguments.

The folder is written whole or not at all (:mod:`~composer_dynsample.export.staging`); ``transformers``'
load reports and progress bars are left out. ``transformers`` is imported when a function runs.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from composer_dynsample.export.model_card import unwrap_encoder
from composer_dynsample.export.staging import new_file_modes, prepare_dir, staged
from composer_dynsample.export.tokenizer import pretrained_tokenizer, tower_tokenizer
from composer_dynsample.models.auto_model import quiet_transformers
from composer_dynsample.models.text import (
    BagOfTokensEncoder,
    TextCNNEncoder,
    TransformerEncoder,
    TwoTowerEncoder,
    import_text_extra,
)
from composer_dynsample.validation import InputTypeError, check_int

__all__ = ["CONFIG_FILE", "STATE_FILE", "encoder_tokenizer", "export_huggingface", "load_exported_encoder"]

#: The file naming an exported encoder's class and arguments.
CONFIG_FILE = "encoder_config.json"
#: The file of an exported encoder's weights that ``save_pretrained`` does not hold.
STATE_FILE = "encoder_state.pt"
_TOKEN_ENCODERS: dict[str, type[nn.Module]] = {
    "BagOfTokensEncoder": BagOfTokensEncoder,
    "TextCNNEncoder": TextCNNEncoder,
}


def export_huggingface(
    model: nn.Module,
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    *,
    special_tokens: Mapping[str, str] | None = None,
    max_length: int | None = None,
    passage_tokenizer: Any = None,
    prompts: Mapping[str, str] | None = None,
) -> Path:
    """Write a text encoder and its tokenizer to ``out_dir`` (see the module docstring for the layout).

    Args:
        model (torch.nn.Module): A text encoder of :mod:`composer_dynsample.models.text`, or an
            ``EmbeddingModel`` around one.
        tokenizer: The tokenizer the encoder was trained with (see :func:`pretrained_tokenizer`).
        passage_tokenizer: Two towers of two tokenizers: the passage tower's, which ``passage/`` holds.
            Default: ``None`` (``tokenizer`` for both).
        out_dir (str | os.PathLike): A new or empty directory.
        special_tokens (Mapping[str, str], optional): See :func:`pretrained_tokenizer`. Default: ``None``.
        max_length (int, optional): The longest input in tokens, as the data's ``max_length`` truncated
            it in training. Default: the tokenizer's truncation length, else a transformer's
            ``max_position_embeddings``.
        prompts (Mapping[str, str], optional): The prompt the training data put before each column's texts
            (``anchor``, ``positive``, ...), kept as ``prompts`` in the top ``encoder_config.json`` (the
            Hugging Face format has no place for them: ``AutoModel`` users put them before texts
            themselves). Default: ``None`` (none).

    Returns:
        Path: ``out_dir``.

    Raises:
        ValueError: If ``out_dir`` holds files, the tokenizer has more tokens than the encoder embeds, or
            ``max_length`` exceeds a transformer's positions.
        InputTypeError: If the encoder is not one of the text encoders.
    """
    encoder, _ = unwrap_encoder(model, None)
    if isinstance(encoder, TwoTowerEncoder):
        towers = [("query", encoder.query_encoder), ("passage", encoder.passage_encoder)]
    else:
        towers = [("", encoder)]
    # Every check before the first file is written: a failed export leaves no directory behind.
    chosen = {name: tower_tokenizer(name, tokenizer, passage_tokenizer) for name, _ in towers}
    plan = [
        (name, tower, encoder_tokenizer(tower, chosen[name], special_tokens, max_length))
        for name, tower in towers
    ]
    with staged(out_dir) as directory:
        for name, tower, hf_tokenizer in plan:
            _write_encoder(prepare_dir(directory / name) if name else directory, tower, hf_tokenizer)
        if isinstance(encoder, TwoTowerEncoder):
            _write_config(directory, "TwoTowerEncoder", {})
        if prompts:
            config = json.loads((directory / CONFIG_FILE).read_text())
            (directory / CONFIG_FILE).write_text(
                json.dumps({**config, "prompts": dict(prompts)}, indent=2) + "\n"
            )
        new_file_modes(directory)
    return Path(out_dir).expanduser()


def encoder_tokenizer(
    encoder: nn.Module, tokenizer: Any, special_tokens: Mapping[str, str] | None, max_length: int | None
) -> Any:
    """The ``transformers`` tokenizer to save beside ``encoder`` (:func:`pretrained_tokenizer`), checked
    against its vocabulary and positions.

    Raises:
        InputTypeError: If the encoder is not one of the text encoders this export writes.
        ValueError: If ``max_length`` exceeds a transformer's positions, or the tokenizer has more tokens
            than the encoder embeds.
    """
    if not isinstance(encoder, (TransformerEncoder, *_TOKEN_ENCODERS.values())):
        raise InputTypeError(
            "export_huggingface exports TransformerEncoder, BagOfTokensEncoder, TextCNNEncoder and "
            f"TwoTowerEncoder (of those), got {type(encoder).__name__}."
        )
    max_length = check_int("max_length", max_length, minimum=1, allow_none=True)
    config = encoder.model.config if isinstance(encoder, TransformerEncoder) else None
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and max_length is not None and max_length > positions:
        raise ValueError(f"max_length is {max_length} but the model has only {positions} positions.")
    hf_tokenizer = pretrained_tokenizer(tokenizer, special_tokens=special_tokens, model_max_length=max_length)
    if positions is not None and hf_tokenizer is not tokenizer and hf_tokenizer.model_max_length > positions:
        hf_tokenizer.model_max_length = positions  # a longer input has no position embedding
    size = len(hf_tokenizer)
    if size > encoder.vocab_size:
        raise ValueError(
            f"the tokenizer has {size} tokens but the encoder embeds {encoder.vocab_size}; export the "
            "tokenizer the encoder was trained with."
        )
    return hf_tokenizer


def _write_encoder(directory: Path, encoder: nn.Module, hf_tokenizer: Any) -> None:
    """The tokenizer, the weights (``save_pretrained`` or the state dict) and ``encoder_config.json``."""
    with quiet_transformers():
        hf_tokenizer.save_pretrained(str(directory))
        if isinstance(encoder, TransformerEncoder):
            with _pooler_put_back(encoder):
                encoder.model.save_pretrained(str(directory))
    if isinstance(encoder, TransformerEncoder):
        state = {} if encoder.projection is None else encoder.projection.state_dict()
    else:
        state = encoder.state_dict()
    if state:
        torch.save({key: value.detach().cpu() for key, value in state.items()}, directory / STATE_FILE)
    _write_config(directory, type(encoder).__name__, encoder.arguments)


@contextlib.contextmanager
def _pooler_put_back(encoder: TransformerEncoder) -> Iterator[None]:
    """Inside, the encoder's model has the pooler it dropped (BERT's ``pooler``), so that its saved files
    hold every weight ``AutoModel.from_pretrained`` builds and nothing is newly initialised on load: the
    model folder's pooler (training leaves it as it was: the pooling does not use it), or for a model
    built from a config (or a folder without one) the model's own initialisation, seeded with 0."""
    model = encoder.model
    if not hasattr(model, "pooler") or model.pooler is not None:
        yield
        return
    auto_model = import_text_extra("transformers", "export").AutoModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        if encoder.folder is not None:
            whole = auto_model.from_pretrained(str(encoder.folder.model_dir), local_files_only=True)
        else:
            whole = auto_model.from_config(model.config)
    weight = next(model.parameters())
    pooler = getattr(whole, "pooler", None)
    model.pooler = None if pooler is None else pooler.to(weight.device, weight.dtype)
    try:
        yield
    finally:
        model.pooler = None


def _write_config(directory: Path, name: str, arguments: Mapping[str, Any]) -> None:
    config = {"format": "composer_dynsample.encoder", "class": name, "arguments": dict(arguments)}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def load_exported_encoder(directory: str | os.PathLike[str]) -> nn.Module:
    """The encoder :func:`export_huggingface` wrote to ``directory``, with its weights.

    Raises:
        ValueError: If ``directory`` holds no ``encoder_config.json`` or names an unknown class.
    """
    path = Path(directory).expanduser()
    if not (path / CONFIG_FILE).is_file():
        raise ValueError(
            f"directory {str(directory)!r} holds no {CONFIG_FILE}; export it with export_huggingface."
        )
    config = json.loads((path / CONFIG_FILE).read_text())
    name, arguments = config.get("class"), config.get("arguments", {})
    if name == "TwoTowerEncoder":
        return TwoTowerEncoder(load_exported_encoder(path / "query"), load_exported_encoder(path / "passage"))
    state = torch.load(path / STATE_FILE, weights_only=True) if (path / STATE_FILE).is_file() else {}
    if name == "TransformerEncoder":
        encoder = TransformerEncoder(path=path, **arguments)
        if encoder.projection is not None:
            encoder.projection.load_state_dict(state)
        return encoder
    if name not in _TOKEN_ENCODERS:
        valid = sorted([*_TOKEN_ENCODERS, "TransformerEncoder", "TwoTowerEncoder"])
        raise ValueError(f"{path / CONFIG_FILE}: class must be one of {valid}, got {name!r}.")
    encoder = _TOKEN_ENCODERS[name](**arguments)
    encoder.load_state_dict(state)
    return encoder
