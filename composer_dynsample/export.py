"""Export a trained text encoder for use outside this project: Hugging Face and sentence-transformers.

* :func:`export_huggingface` writes a directory that :func:`load_exported_encoder` reads back: for a
  :class:`~composer_dynsample.models.text.TransformerEncoder`, the ``AutoModel``'s ``save_pretrained``
  files (so ``transformers.AutoModel.from_pretrained(out_dir)`` loads it) and the tokenizer
  (``AutoTokenizer.from_pretrained(out_dir)``); for the other text encoders, their state dict
  (``encoder_state.pt``) beside the tokenizer; for a
  :class:`~composer_dynsample.models.text.TwoTowerEncoder`, one such directory per tower
  (``query/``, ``passage/``). ``encoder_config.json`` names the class and its arguments.
* :func:`export_sentence_transformers` writes a sentence-transformers model directory (Transformer,
  Pooling in the encoder's mode, Dense for the projection, Normalize when the model normalises) that
  ``SentenceTransformer(out_dir)`` loads and that embeds texts as the encoder does. Its model card,
  ``README.md`` (:func:`model_card`), says the pooling, normalisation and ``max_seq_length`` (a
  folder's unless the config chose otherwise) and, given the run's config and metrics
  (:func:`run_metrics`), the training data, the recipe and the scores.

Every file written is readable as any new file is (``0o666`` less the umask; ``safetensors`` alone
would leave its weights ``0o600``). ``transformers``' load reports and progress bars are left out.

The tokenizer may be a ``tokenizers.Tokenizer``, the path of its ``tokenizer.json``, or a ``transformers``
tokenizer; its special tokens (``[PAD]``, ``[CLS]``, ...) are found in its vocabulary unless given.
``transformers`` and ``sentence-transformers`` (the ``[text]`` extra) are imported when a function runs.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn

from composer_dynsample.models.text import (
    BagOfTokensEncoder,
    TextCNNEncoder,
    TransformerEncoder,
    TwoTowerEncoder,
    import_text_extra,
)
from composer_dynsample.models.transformer import quiet_transformers
from composer_dynsample.validation import InputTypeError, check_bool, check_int, is_int

__all__ = [
    "export_huggingface",
    "export_sentence_transformers",
    "load_exported_encoder",
    "model_card",
    "pretrained_tokenizer",
    "run_metrics",
]

CONFIG_FILE = "encoder_config.json"
STATE_FILE = "encoder_state.pt"
# The config keys a model card calls the recipe.
_RECIPE = ("model.encoder", "model.loss", "model.normalize", "sampler", "optimizer", "scheduler")
_RECIPE_OF_THE_RUN = ("algorithms", "trainer.max_duration", "seed")
_TOKEN_ENCODERS: dict[str, type[nn.Module]] = {
    "BagOfTokensEncoder": BagOfTokensEncoder,
    "TextCNNEncoder": TextCNNEncoder,
}
# Each special token's role and the spellings looked up in the vocabulary (BERT's, then RoBERTa's).
_SPECIAL_TOKENS = {
    "unk_token": ("[UNK]", "<unk>"),
    "pad_token": ("[PAD]", "<pad>"),
    "cls_token": ("[CLS]", "<s>"),
    "sep_token": ("[SEP]", "</s>"),
    "mask_token": ("[MASK]", "<mask>"),
}


def pretrained_tokenizer(
    tokenizer: Any, *, special_tokens: Mapping[str, str] | None = None, model_max_length: int | None = None
) -> Any:
    """A ``transformers`` fast tokenizer for ``tokenizer``, ready for ``save_pretrained``.

    Args:
        tokenizer: A ``tokenizers.Tokenizer``; an object holding one as ``.tokenizer`` and its padding id
            as ``.pad_id`` (the text loaders' tokenizer); the path of a ``tokenizer.json``; or a
            ``transformers`` tokenizer (returned as it is, or as a copy with ``model_max_length``).
        special_tokens (Mapping[str, str], optional): Roles (``unk_token``, ``pad_token``, ``cls_token``,
            ``sep_token``, ``mask_token``) to tokens, over those found in the vocabulary (BERT's ``[PAD]``
            ... or RoBERTa's ``<pad>`` ...; the token the tokenizer pads with comes first).
            Default: ``None``.
        model_max_length (int, optional): The longest input in tokens (longer ones are truncated).
            Default: the tokenizer's truncation length, if any.

    Returns:
        A ``PreTrainedTokenizerFast`` sharing ``tokenizer``'s vocabulary, normalizer and post-processor.

    Raises:
        InputTypeError: If ``tokenizer`` is none of the above.
        ValueError: If a path does not exist, or a special token is not in the vocabulary.
    """
    transformers = import_text_extra("transformers", "pretrained_tokenizer")
    if model_max_length is not None:
        model_max_length = check_int("model_max_length", model_max_length, minimum=1)
    if isinstance(tokenizer, transformers.PreTrainedTokenizerBase):
        if model_max_length is None:
            return tokenizer
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.model_max_length = model_max_length
        return tokenizer
    backend, pad_id = _backend_tokenizer(tokenizer)
    roles = _found_special_tokens(backend, pad_id)
    for role, token in (special_tokens or {}).items():
        if role not in _SPECIAL_TOKENS:
            raise ValueError(f"special_tokens has the role {role!r}; valid roles: {sorted(_SPECIAL_TOKENS)}.")
        if backend.token_to_id(token) is None:
            raise ValueError(
                f"special_tokens[{role!r}] is {token!r}, which is not in the tokenizer's vocabulary."
            )
        roles[role] = token
    if model_max_length is None and backend.truncation is not None:
        model_max_length = backend.truncation["max_length"]
    extra = {} if model_max_length is None else {"model_max_length": int(model_max_length)}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **roles, **extra)


def _backend_tokenizer(tokenizer: Any) -> tuple[Any, int | None]:
    """The ``tokenizers.Tokenizer`` and the padding id, if the wrapper names one."""
    tokenizer_class = import_text_extra("tokenizers", "export").Tokenizer
    if isinstance(tokenizer, tokenizer_class):
        return tokenizer, None
    if isinstance(getattr(tokenizer, "tokenizer", None), tokenizer_class):
        pad_id = getattr(tokenizer, "pad_id", None)
        return tokenizer.tokenizer, pad_id if is_int(pad_id) else None
    if isinstance(tokenizer, (str, os.PathLike)):
        path = Path(tokenizer).expanduser()
        if not path.is_file():
            raise ValueError(f"tokenizer: {str(tokenizer)!r} is not a tokenizer.json file.")
        return tokenizer_class.from_file(str(path)), None
    raise InputTypeError(
        "tokenizer must be a tokenizers.Tokenizer, the path of a tokenizer.json or a transformers tokenizer, "
        f"got {type(tokenizer).__name__}."
    )


def _found_special_tokens(backend: Any, pad_id: int | None) -> dict[str, str]:
    roles = {
        role: next(token for token in spellings if backend.token_to_id(token) is not None)
        for role, spellings in _SPECIAL_TOKENS.items()
        if any(backend.token_to_id(token) is not None for token in spellings)
    }
    if backend.padding is not None:
        roles["pad_token"] = backend.padding["pad_token"]
    if pad_id is not None and backend.id_to_token(pad_id) is not None:
        roles["pad_token"] = backend.id_to_token(pad_id)
    return roles


def _unwrap(model: nn.Module, normalize: bool | None) -> tuple[nn.Module, bool]:
    """The encoder and whether embeddings are normalised: an EmbeddingModel's own, else ``normalize``."""
    if not isinstance(model, nn.Module):
        raise InputTypeError(
            f"model must be an EmbeddingModel or a text encoder, got {type(model).__name__}."
        )
    wrapped = isinstance(getattr(model, "encoder", None), nn.Module) and hasattr(model, "normalize")
    encoder = model.encoder if wrapped else model
    if normalize is None:
        return encoder, bool(model.normalize) if wrapped else True
    return encoder, check_bool("normalize", normalize)


def _prepare(out_dir: str | os.PathLike[str]) -> Path:
    directory = Path(out_dir).expanduser()
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ValueError(f"out_dir {str(out_dir)!r} exists and is not an empty directory; choose a new one.")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def export_huggingface(
    model: nn.Module,
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    *,
    special_tokens: Mapping[str, str] | None = None,
    max_length: int | None = None,
) -> Path:
    """Write a text encoder and its tokenizer to ``out_dir`` (see the module docstring for the layout).

    Args:
        model (torch.nn.Module): A text encoder of :mod:`composer_dynsample.models.text`, or an
            ``EmbeddingModel`` around one.
        tokenizer: The tokenizer the encoder was trained with (see :func:`pretrained_tokenizer`).
        out_dir (str | os.PathLike): A new or empty directory.
        special_tokens (Mapping[str, str], optional): See :func:`pretrained_tokenizer`. Default: ``None``.
        max_length (int, optional): The longest input in tokens, as the data's ``max_length`` truncated
            it in training. Default: the tokenizer's truncation length, else a transformer's
            ``max_position_embeddings``.

    Returns:
        Path: ``out_dir``.

    Raises:
        ValueError: If ``out_dir`` holds files, the tokenizer has more tokens than the encoder embeds, or
            ``max_length`` exceeds a transformer's positions.
        InputTypeError: If the encoder is not one of the text encoders.
    """
    encoder, _ = _unwrap(model, None)
    if isinstance(encoder, TwoTowerEncoder):
        towers = [("query", encoder.query_encoder), ("passage", encoder.passage_encoder)]
    else:
        towers = [("", encoder)]
    # Every check before the first file is written: a failed export leaves no directory behind.
    plan = [
        (name, tower, _tokenizer_for(tower, tokenizer, special_tokens, max_length)) for name, tower in towers
    ]
    directory = _prepare(out_dir)
    for name, tower, hf_tokenizer in plan:
        _write_encoder(_prepare(directory / name) if name else directory, tower, hf_tokenizer)
    if isinstance(encoder, TwoTowerEncoder):
        _write_config(directory, "TwoTowerEncoder", {})
    _new_file_modes(directory)
    return directory


def _new_file_modes(directory: Path) -> None:
    """Give every file under ``directory`` the mode of a newly created file: ``0o666`` less the umask."""
    umask = os.umask(0o022)
    os.umask(umask)  # reading the umask sets it: set it back at once
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)


def _tokenizer_for(
    encoder: nn.Module, tokenizer: Any, special_tokens: Mapping[str, str] | None, max_length: int | None
) -> Any:
    """The ``transformers`` tokenizer to save beside ``encoder``, checked against its vocabulary."""
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
            encoder.model.save_pretrained(str(directory))
    if isinstance(encoder, TransformerEncoder):
        state = {} if encoder.projection is None else encoder.projection.state_dict()
    else:
        state = encoder.state_dict()
    if state:
        torch.save({key: value.detach().cpu() for key, value in state.items()}, directory / STATE_FILE)
    _write_config(directory, type(encoder).__name__, encoder.arguments)


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


def export_sentence_transformers(
    model: nn.Module,
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    *,
    normalize: bool | None = None,
    special_tokens: Mapping[str, str] | None = None,
    max_length: int | None = None,
    config: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
) -> Path:
    """Write a :class:`TransformerEncoder` as a sentence-transformers model directory, with a model card.

    The modules are the encoder's own steps: ``Transformer`` (the ``AutoModel`` and the tokenizer),
    ``Pooling`` in the encoder's mode (``mean`` or ``cls``), ``Dense`` with the projection's weights and
    an identity activation (when the encoder projects), and ``Normalize`` when the embeddings are
    L2-normalised: ``SentenceTransformer(out_dir).encode(texts)`` embeds as the encoder does. BERT-like
    models load there with their pooler, which the encoder dropped: it is written with random weights
    (the pooling does not use it), and a line says so. ``README.md`` is :func:`model_card`'s.

    Args:
        model (torch.nn.Module): A :class:`TransformerEncoder` or an ``EmbeddingModel`` around one.
        tokenizer: The tokenizer the encoder was trained with (see :func:`pretrained_tokenizer`).
        out_dir (str | os.PathLike): A new or empty directory.
        normalize (bool, optional): Add ``Normalize``. Default: ``None``, the ``EmbeddingModel``'s
            ``normalize``, or ``True`` (``EmbeddingModel``'s default) for a bare encoder.
        special_tokens (Mapping[str, str], optional): See :func:`pretrained_tokenizer`. Default: ``None``.
        max_length (int, optional): See :func:`export_huggingface` (sentence-transformers' ``max_seq_length``).
        config (Mapping[str, Any], optional): The run's config, for the model card.
        metrics (Mapping[str, Any], optional): The run's ``metrics.json``, for the model card.

    Returns:
        Path: ``out_dir``.

    Raises:
        ValueError: If the encoder is not a :class:`TransformerEncoder` (the format holds a transformer),
            or as :func:`export_huggingface`.
    """
    encoder, normalized = _unwrap(model, normalize)
    card = {"max_length": max_length, "normalize": normalized, "config": config, "metrics": metrics}
    if not isinstance(encoder, TransformerEncoder):
        raise ValueError(
            f"export_sentence_transformers needs a TransformerEncoder (the format holds a Hugging Face "
            f"transformer), got {type(encoder).__name__}; export_huggingface writes its state dict and config."
        )
    library = import_text_extra("sentence_transformers", "export_sentence_transformers")
    _tokenizer_for(encoder, tokenizer, special_tokens, max_length)  # checked before out_dir is created
    directory = _prepare(out_dir)
    with tempfile.TemporaryDirectory() as staging:
        staged = Path(staging) / "model"
        export_huggingface(encoder, tokenizer, staged, special_tokens=special_tokens, max_length=max_length)
        steps = _sentence_transformers_steps(_sentence_transformers_modules(), encoder, staged, normalized)
        with quiet_transformers():
            saved = library.SentenceTransformer(modules=steps, device="cpu")
            saved.save(str(directory), create_model_card=False)
    (directory / "README.md").write_text(model_card(model, title=directory.name, **card), encoding="utf-8")
    _new_file_modes(directory)
    _say_added_pooler(directory, steps[0], encoder)
    return directory


def _sentence_transformers_steps(
    modules: Any, encoder: TransformerEncoder, staged: Path, normalized: bool
) -> list[nn.Module]:
    """The modules of the encoder's steps: Transformer (of ``staged``), Pooling, Dense and Normalize."""
    with quiet_transformers():
        transformer = modules.Transformer(str(staged))
    steps: list[nn.Module] = [transformer, modules.Pooling(encoder.model.config.hidden_size, encoder.pooling)]
    if encoder.projection is not None:
        dense = modules.Dense(
            encoder.projection.in_features,
            encoder.projection.out_features,
            bias=True,
            activation_function=nn.Identity(),
        )
        dense.linear.load_state_dict(encoder.projection.state_dict())
        steps.append(dense)
    if normalized:
        steps.append(modules.Normalize())
    return steps


def _say_added_pooler(directory: Path, transformer: nn.Module, encoder: TransformerEncoder) -> None:
    """One line when sentence-transformers' model has a pooler that the encoder dropped (random weights)."""
    model = getattr(transformer, "auto_model", None)
    model = getattr(transformer, "model", None) if model is None else model
    pooler = getattr(model, "pooler", None)
    if not isinstance(pooler, nn.Module) or getattr(encoder.model, "pooler", None) is not None:
        return
    names = sorted({name.rpartition(".")[0] for name, _ in pooler.named_parameters(prefix="pooler")})
    print(
        f"export {directory}: sentence-transformers loads {type(encoder.model).__name__} with a pooler "
        f"({', '.join(names)}) of random weights, which its {encoder.pooling} pooling does not use."
    )


def _sentence_transformers_modules() -> Any:
    """sentence-transformers' module classes: ``sentence_transformer.modules`` from 6.0, else ``models``."""
    try:
        from sentence_transformers.sentence_transformer import modules
    except ImportError:
        from sentence_transformers import models as modules
    return modules


def run_metrics(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``metrics.json`` of a run directory as a dict; ``None`` when it has none that reads as one."""
    try:
        values = json.loads((Path(run_dir).expanduser() / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return values if isinstance(values, dict) else None


def model_card(
    model: nn.Module,
    *,
    max_length: int | None = None,
    normalize: bool | None = None,
    config: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    title: str = "model",
) -> str:
    """The ``README.md`` of an exported model, in plain Markdown: the model, and the run when given.

    Args:
        model (torch.nn.Module): A :class:`TransformerEncoder`, or an ``EmbeddingModel`` around one.
        max_length (int, optional): The longest input in tokens (``max_seq_length``). Default: ``None``.
        normalize (bool, optional): Whether embeddings are L2-normalised. Default: ``None``, the model's.
        config (Mapping[str, Any], optional): The run's config: its ``data``, and the recipe (encoder, loss,
            sampler, optimizer, schedule, duration, seed).
        metrics (Mapping[str, Any], optional): The run's ``metrics.json``: its scores (fractional numbers),
            beside the starting model's (``at_start``).
        title (str): The card's heading. Default: ``"model"``.

    Returns:
        str: The card.
    """
    encoder, normalized = _unwrap(model, normalize)
    config = OmegaConf.create(dict(config or {}))
    data = {k: v for k, v in (config.get("data") or {}).items() if k not in ("cache_dir", "progress")}
    recipe = {key: OmegaConf.select(config, key) for key in _RECIPE + _RECIPE_OF_THE_RUN}
    sections = {
        "Model": _model_lines(encoder, normalized, max_length),
        "Training data": [f"data.{key}: `{_shown(value)}`" for key, value in data.items()],
        "Recipe": [f"{key}: `{_shown(value)}`" for key, value in recipe.items() if value is not None],
    }
    lines = [f"# {title}", "", "A text embedding model trained with composer-dynsample.", "", "## Use", ""]
    lines += ["```python", "from sentence_transformers import SentenceTransformer", ""]
    lines += [f"model = SentenceTransformer({title!r})", 'embeddings = model.encode(["a text"])', "```"]
    for heading, items in sections.items():
        lines += ["", f"## {heading}", "", *(f"- {item}" for item in items)] if items else []
    return "\n".join(lines + _metric_lines(metrics or {})) + "\n"


def _model_lines(encoder: nn.Module, normalized: bool, max_length: int | None) -> list[str]:
    """The card's list of the model: the encoder, where it started, pooling, projection, normalisation."""
    folder, config, projection = getattr(encoder, "folder", None), encoder.model.config, encoder.projection
    start = f"started from `{folder.path}`" if folder is not None else "randomly initialised"
    return [
        f"Encoder: {type(encoder.model).__name__} ({config.model_type}, hidden size {config.hidden_size}), {start}",
        f"Pooling: {encoder.pooling}",
        f"Projection: linear to {projection.out_features}" if projection is not None else "Projection: none",
        f"Normalisation: {'L2 (Normalize)' if normalized else 'none'}",
        f"max_seq_length: {max_length if max_length is not None else encoder.max_tokens}",
    ]


def _metric_lines(metrics: Mapping[str, Any]) -> list[str]:
    """The card's table of scores, beside the starting model's when given; seconds (``*_s``) left out."""
    start = metrics.get("at_start") if isinstance(metrics.get("at_start"), Mapping) else {}
    cols = [metrics, start] if start else [metrics]
    keys = [key for key, value in metrics.items() if isinstance(value, float) and not key.endswith("_s")]
    rows = [[key, *(f"{c[key]:.4f}" if isinstance(c.get(key), float) else "" for c in cols)] for key in keys]
    head = [["metric", "value", "at start"][: len(cols) + 1], ["---"] * (len(cols) + 1)]
    return ["", "## Metrics", "", *("| " + " | ".join(row) + " |" for row in head + rows)] if rows else []


def _shown(value: Any) -> str:
    """A config value as the card shows it: mappings and lists as JSON (an OmegaConf node's too)."""
    value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)
