"""The Hugging Face ``transformers`` encoder: token ids and an attention mask to ``(B, embedding_dim)``.

:class:`TransformerEncoder` wraps any ``AutoModel``, from a local directory or from a config (random
init), with mean or CLS pooling and an optional projection. A sentence-transformers folder gives its
pooling (its ``Pooling`` module's mode) unless one is given; its model may sit in a subfolder
(``0_Transformer``), as :mod:`~composer_dynsample.models.sentence_folder` reads it. It reads the same
features as the other text encoders (see :mod:`composer_dynsample.models.text`); ``transformers`` is
imported only when one is built. It is importable from :mod:`composer_dynsample.models.text` too.

:func:`position_limit` reads how long a text such a model takes off its config, without building it
(the config checks compare it with the data's ``max_length``); :func:`folder_pooling` is the pooling a
folder gives, or a one-line error for one the encoder lacks; :func:`quiet_transformers` keeps
``transformers``' load reports and progress bars out of the output.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import torch
from torch import nn

from composer_dynsample.distributed import get_rank
from composer_dynsample.models.sentence_folder import ModelFolder, read_model_folder
from composer_dynsample.models.tokens import (
    _positive,
    _projection,
    import_text_extra,
    length_groups,
    masked_mean_pool,
    token_inputs,
)
from composer_dynsample.validation import InputTypeError, check_bool, check_choice

__all__ = [
    "PADDING_OFFSET_MODEL_TYPES",
    "TRANSFORMER_POOLINGS",
    "PositionLimit",
    "TransformerEncoder",
    "folder_pooling",
    "position_limit",
    "quiet_transformers",
]

TRANSFORMER_POOLINGS = ("mean", "cls")
# Model types that number positions from ``padding_idx + 1`` as RoBERTa does: two of their
# ``max_position_embeddings`` never hold a token (RoBERTa's 514 positions take texts of 512 tokens).
PADDING_OFFSET_MODEL_TYPES = frozenset(
    {
        "camembert",
        "data2vec-text",
        "esm",
        "ibert",
        "layoutlmv3",
        "lilt",
        "longformer",
        "luke",
        "markuplm",
        "mpnet",
        "roberta",
        "roberta-prelayernorm",
        "xlm-roberta",
        "xlm-roberta-xl",
        "xmod",
    }
)


class TransformerEncoder(nn.Module):
    """A Hugging Face ``transformers`` encoder (``AutoModel``) with mean or CLS pooling.

    Built from a local model directory (``path``: ``from_pretrained`` with ``local_files_only``; never a
    download; of a sentence-transformers folder, its ``Transformer`` module's, at its root or in a
    subfolder such as ``0_Transformer``) or from a config (``config``: ``{"model_type": "bert",
    "hidden_size": ..., ...}``, random init through ``AutoConfig.for_model``). The model's own pooler (BERT's ``pooler``, unused by mean
    or CLS pooling of the hidden states) is removed, so that every parameter takes part in the loss, as
    DDP requires. ``"mean"`` pooling averages the last hidden states over ``attention_mask``; ``"cls"``
    takes the first position's. An optional linear projection maps them to ``embedding_dim``.
    :func:`~composer_dynsample.export.export_sentence_transformers` writes the same model as a
    sentence-transformers directory.

    Dropout comes from the model's config (``hidden_dropout_prob`` and ``attention_probs_dropout_prob``
    for BERT); with ``EmbeddingModel(forward_chunk_size=N)`` the recomputation replays its masks.

    Args:
        vocab_size (int, optional): The tokenizer's vocabulary size (the data's). With ``config`` it sets
            the embedding table's size (a ``vocab_size`` in ``config`` must agree); with ``path`` it must
            not exceed the model's. Input ids are checked against it. Default: ``None``, the model's.
        path (str | os.PathLike, optional): A local directory holding a Hugging Face model. Default: ``None``.
        config (Mapping[str, Any], optional): ``model_type`` and the config's other arguments.
            Default: ``None``. Exactly one of ``path`` and ``config`` is given.
        pooling (str, optional): ``"mean"`` or ``"cls"``. Default: ``None``: the mode of the ``Pooling``
            module of a sentence-transformers ``path`` (its ``1_Pooling/config.json``), else ``"mean"``.
        embedding_dim (int, optional): Project to this dimension. Default: ``None``, the hidden size.
        trim_padding (bool): Run a batch's shorter and longer rows as two groups, each cut to its own
            longest row, when that saves a quarter of the positions or more
            (:func:`~composer_dynsample.models.tokens.length_groups`): a batch of short queries and long
            passages no longer runs the queries' padding through every layer. The embeddings are those of
            the whole batch (the padding is masked out either way) up to float rounding. Default: ``True``.

    Attributes:
        max_tokens (int | None): The longest text, in tokens (special tokens included), the model has
            position embeddings for (see :func:`position_limit`); ``None`` when it does not say.
        folder (ModelFolder | None): What ``path`` says of its model (pooling, normalisation, length),
            read by :func:`~composer_dynsample.models.sentence_folder.read_model_folder`; ``None`` with
            ``config``.

    Loading from ``path`` prints no report of ``transformers``: a line says what of the folder's weights
    was not loaded (its pooler, heads of other tasks), and a ``UserWarning`` names weights the folder
    lacks (randomly initialised) and modules of a sentence-transformers folder the encoder does not
    build (a ``Dense`` after the pooling).

    Raises:
        ValueError: If ``path`` is not a local model directory, its folder pools otherwise than by mean
            or CLS and ``pooling`` is not given, ``config`` names an unknown model type or argument,
            ``vocab_size`` disagrees with the model, or an argument is out of range.

    Example:
        >>> config = {"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32}
        >>> encoder = TransformerEncoder(vocab_size=50, config=config, embedding_dim=8)
        >>> features = {"input_ids": torch.tensor([[1, 7, 9, 0]]), "attention_mask": torch.tensor([[1, 1, 1, 0]])}
        >>> encoder(features).shape
        torch.Size([1, 8])
    """

    def __init__(
        self,
        *,
        vocab_size: int | None = None,
        path: str | os.PathLike[str] | None = None,
        config: Mapping[str, Any] | None = None,
        pooling: str | None = None,
        embedding_dim: int | None = None,
        trim_padding: bool = True,
    ) -> None:
        super().__init__()
        self.trim_padding = check_bool("trim_padding", trim_padding)
        self.folder = _read_folder(path) if path is not None and config is None else None
        if pooling is None:
            pooling = "mean" if self.folder is None else folder_pooling(self.folder)
        self.pooling = check_choice("pooling", pooling, TRANSFORMER_POOLINGS)
        if vocab_size is not None:
            vocab_size = _positive("vocab_size", vocab_size)
        if (path is None) == (config is None):
            given = "both" if path is not None else "neither"
            raise ValueError(
                "TransformerEncoder needs exactly one of path (a local model directory) and config "
                f"(a model_type and its sizes), got {given}."
            )
        model = (
            _load_pretrained(path, self.folder)
            if self.folder is not None
            else _from_config(config, vocab_size)
        )
        self.max_tokens = _token_positions(model.config.to_dict())
        table = model.get_input_embeddings().num_embeddings
        if vocab_size is not None and vocab_size > table:
            raise ValueError(
                f"vocab_size is {vocab_size} (the tokenizer's) but the model at {str(path)!r} embeds only "
                f"{table} tokens; use the model's own tokenizer."
            )
        self.vocab_size = table if vocab_size is None else vocab_size
        if getattr(model, "pooler", None) is not None:
            model.pooler = None  # its output is never used: DDP would wait for its gradients forever
        self.model = model
        self.projection, self.embedding_dim = _projection(model.config.hidden_size, embedding_dim)
        self.arguments = {
            "vocab_size": self.vocab_size,
            "pooling": self.pooling,
            "embedding_dim": embedding_dim,
        }

    def forward(self, features: Any) -> torch.Tensor:
        """Embed the text features (see the module docstring) to ``(B, embedding_dim)``.

        Raises:
            ValueError: If the features are malformed, an id is outside the vocabulary, or the texts are
                longer than the model has positions for (:attr:`max_tokens`).
        """
        ids, mask = token_inputs(features, type(self).__name__, self.vocab_size)
        if self.max_tokens is not None and ids.shape[-1] > self.max_tokens:
            raise ValueError(
                f"{type(self).__name__}: the texts are {ids.shape[-1]} tokens long but the model has positions "
                f"for {self.max_tokens} (max_position_embeddings {self.model.config.max_position_embeddings}); "
                f"truncate them to at most {self.max_tokens} tokens (the data's max_length)."
            )
        extra = {}
        if isinstance(features, Mapping) and "token_type_ids" in features:
            extra["token_type_ids"] = features["token_type_ids"]
        groups = length_groups(mask) if self.trim_padding else None
        if groups is None:
            pooled = self._pooled(ids, mask, extra)
        else:  # short and long rows apart, each group cut to its own longest row
            parts = []
            for rows in groups:
                width = int(mask[rows].sum(dim=1).max())
                cut = {key: value[rows, :width] for key, value in extra.items()}
                parts.append(self._pooled(ids[rows, :width], mask[rows, :width], cut))
            order = torch.cat(groups)
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(len(order), device=order.device)
            pooled = torch.cat(parts)[inverse]
        return pooled if self.projection is None else self.projection(pooled)

    def _pooled(self, ids: torch.Tensor, mask: torch.Tensor, extra: dict[str, torch.Tensor]) -> torch.Tensor:
        """The model's pooled last hidden states of ``ids`` (``(B, hidden)``)."""
        outputs = self.model(input_ids=ids, attention_mask=mask, **extra)
        hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]
        return hidden[:, 0] if self.pooling == "cls" else masked_mean_pool(hidden, mask)


def _read_folder(path: Any) -> ModelFolder:
    """What the folder ``path`` says (see :mod:`~composer_dynsample.models.sentence_folder`).

    Raises:
        InputTypeError: If ``path`` is not a string or path.
        ValueError: If its ``modules.json`` or a module's settings cannot be read.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InputTypeError(f"path must be a local directory (a string), got {type(path).__name__}.")
    return read_model_folder(path)


def folder_pooling(folder: ModelFolder, key: str = "pooling", path_key: str = "path") -> str:
    """The pooling of ``folder`` for a :class:`TransformerEncoder`: its ``Pooling`` module's, else mean.

    Args:
        folder (ModelFolder): What the model folder says.
        key (str): The key the error names for choosing the pooling (``"model.encoder.pooling"`` in a
            config). Default: ``"pooling"``.
        path_key (str): The key the error names for the folder. Default: ``"path"``.

    Returns:
        str: ``"mean"`` or ``"cls"``.

    Raises:
        ValueError: If the folder pools otherwise (``max``, ``lasttoken``, several modes together).
    """
    if folder.pooling is None or folder.pooling in TRANSFORMER_POOLINGS:
        return folder.pooling or "mean"
    where = folder.pooling_file.relative_to(folder.path) if folder.pooling_file is not None else "?"
    raise ValueError(
        f"{path_key} {str(folder.path)!r} pools by {folder.pooling!r} ({where}), which TransformerEncoder "
        f"does not do; set {key}='mean' or 'cls' to train with one of those (its embeddings then differ "
        "from the folder's)."
    )


def _load_pretrained(path: str | os.PathLike[str], folder: ModelFolder) -> nn.Module:
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
            model, info = _without_pooler(
                auto_model.from_pretrained, str(directory), local_files_only=True, output_loading_info=True
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


class PositionLimit(NamedTuple):
    """How long a text a transformer takes, read off its config (see :func:`position_limit`).

    Attributes:
        tokens (int): The most tokens a text may have, special tokens included.
        max_position_embeddings (int): The config's value.
        model_type (str): The config's ``model_type``.
        default (bool): Whether ``max_position_embeddings`` is the model type's default (not given).
    """

    tokens: int
    max_position_embeddings: int
    model_type: str
    default: bool = False


def _token_positions(config: Mapping[str, Any]) -> int | None:
    """The most tokens per text of a model config (a dict), or ``None`` when it sets no bound."""
    positions = config.get("max_position_embeddings")
    if isinstance(positions, bool) or not isinstance(positions, int) or positions < 1:
        return None
    if config.get("position_biased_input") is False:  # DeBERTa's relative positions only: no absolute table
        return None
    return positions - 2 if config.get("model_type") in PADDING_OFFSET_MODEL_TYPES else positions


def position_limit(
    *, path: str | os.PathLike[str] | None = None, config: Mapping[str, Any] | None = None
) -> PositionLimit | None:
    """The longest text a :class:`TransformerEncoder` of ``path`` or ``config`` takes, without building it.

    A model of ``path`` is read from the folder's ``config.json`` (JSON only, no weights; that of its
    ``Transformer`` module in a sentence-transformers folder); a ``config`` without
    ``max_position_embeddings`` takes its model type's default (``AutoConfig.for_model(model_type)``,
    512 for BERT). BERT-like models count their special tokens
    among the positions; RoBERTa-like ones (:data:`PADDING_OFFSET_MODEL_TYPES`) keep two positions for
    padding, so ``max_position_embeddings`` 514 takes 512 tokens. DeBERTa with
    ``position_biased_input: false`` has no bound.

    Args:
        path (str | os.PathLike, optional): A local model folder. Default: ``None``.
        config (Mapping[str, Any], optional): A ``model_type`` and the config's other arguments.
            Default: ``None``.

    Returns:
        PositionLimit | None: ``None`` when the config cannot be read or sets no bound (the encoder's own
        checks name a folder or config that is wrong).
    """
    if path is not None:
        try:
            directory = read_model_folder(path).model_dir  # a sentence-transformers folder's model
            values = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError, TypeError):
            return None
        default = False
    elif isinstance(config, Mapping) and isinstance(config.get("model_type"), str):
        values, default = dict(config), "max_position_embeddings" not in config
        if default:
            values["max_position_embeddings"] = _default_positions(config["model_type"])
    else:
        return None
    tokens = _token_positions(values) if isinstance(values, Mapping) else None
    if tokens is None:
        return None
    model_type = str(values.get("model_type", ""))
    return PositionLimit(tokens, values["max_position_embeddings"], model_type, default)


def _default_positions(model_type: str) -> int | None:
    """``max_position_embeddings`` of ``AutoConfig.for_model(model_type)``, or ``None``."""
    try:
        auto_config = import_text_extra("transformers", "TransformerEncoder").AutoConfig
        return getattr(auto_config.for_model(model_type), "max_position_embeddings", None)
    except (ImportError, ValueError):
        return None


def _from_config(config: Any, vocab_size: int | None) -> nn.Module:
    """A randomly initialised ``AutoModel`` of ``config``'s ``model_type`` and arguments."""
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
    return _without_pooler(transformers.AutoModel.from_config, auto_config.for_model(model_type, **arguments))


def _without_pooler(build: Any, *args: Any, **kwargs: Any) -> nn.Module:
    """``build(*args, add_pooling_layer=False)`` where the model takes it (BERT, RoBERTa...), else ``build``."""
    try:
        return build(*args, add_pooling_layer=False, **kwargs)
    except TypeError as error:
        if "add_pooling_layer" not in str(error):
            raise
        return build(*args, **kwargs)
