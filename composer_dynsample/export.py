"""Export a trained text encoder for use outside this project: Hugging Face and sentence-transformers.

* :func:`export_huggingface` writes a directory that :func:`load_exported_encoder` reads back: for a
  :class:`~composer_dynsample.models.text.TransformerEncoder`, the ``AutoModel``'s ``save_pretrained``
  files (so ``transformers.AutoModel.from_pretrained(out_dir)`` loads it, nothing newly initialised: the
  pooler the encoder dropped is written back, the model folder's weights) and the tokenizer
  (``AutoTokenizer.from_pretrained(out_dir)``); for the other text encoders, their state dict
  (``encoder_state.pt``) beside the tokenizer; for a
  :class:`~composer_dynsample.models.text.TwoTowerEncoder`, one such directory per tower
  (``query/``, ``passage/``). ``encoder_config.json`` names the class and its arguments.
* :func:`export_sentence_transformers` writes a sentence-transformers model directory (Transformer,
  Pooling in the encoder's mode and ``include_prompt``, Dense for the projection, Normalize when the model normalises) that
  ``SentenceTransformer(out_dir)`` loads and that embeds texts as the encoder does. Its model card,
  ``README.md`` (:func:`~composer_dynsample.model_card.model_card`), says the pooling, normalisation
  and ``max_seq_length`` (a folder's unless the config chose otherwise) and, given the run's config and
  metrics (:func:`~composer_dynsample.model_card.run_metrics`), the training data (file names and
  SHA-256, no local directories), the recipe and the scores. A ``TwoTowerEncoder`` of two transformers is
  written as one ``Router`` (:mod:`~composer_dynsample.sentence_modules`): ``encode_query`` embeds as its
  query tower, ``encode_document`` (and ``encode``) as its passage tower.

Each function writes into a new folder beside ``out_dir`` and renames it to ``out_dir`` at the end: a
failed export leaves nothing behind, never a part of a model. Every file written is readable as any
new file is (``0o666`` less the umask; ``safetensors`` alone would leave its weights ``0o600``). ``transformers``' load reports and progress bars are left out.

The tokenizer may be a ``tokenizers.Tokenizer``, the path of its ``tokenizer.json``, or a ``transformers``
tokenizer; its special tokens (``[PAD]``, ``[CLS]``, ...) are found in its vocabulary unless given.
``transformers`` and ``sentence-transformers`` (the ``[text]`` extra) are imported when a function runs.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from composer_dynsample.model_card import model_card, run_metrics, unwrap_encoder
from composer_dynsample.models.text import (
    BagOfTokensEncoder,
    TextCNNEncoder,
    TransformerEncoder,
    TwoTowerEncoder,
    import_text_extra,
)
from composer_dynsample.models.transformer import quiet_transformers
from composer_dynsample.sentence_modules import (
    router_class,
    router_module,
    sentence_transformers_modules,
    sentence_transformers_steps,
)
from composer_dynsample.validation import InputTypeError, check_int, is_int

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


def _checked_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """``out_dir`` as a path, when it is new or an empty directory."""
    directory = Path(out_dir).expanduser()
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ValueError(f"out_dir {str(out_dir)!r} exists and is not an empty directory; choose a new one.")
    return directory


def _prepare(out_dir: str | os.PathLike[str]) -> Path:
    directory = _checked_out_dir(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _umask() -> int:
    umask = os.umask(0o022)
    os.umask(umask)  # reading the umask sets it: set it back at once
    return umask


@contextlib.contextmanager
def _staged(out_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """A new folder beside ``out_dir`` to write the export into: renamed to ``out_dir`` when the block ends
    without an error, removed with what it holds otherwise (and the folders made for it), so that
    ``out_dir`` is either the whole export or not there.

    Raises:
        ValueError: If ``out_dir`` exists and is not an empty directory.
    """
    directory = _checked_out_dir(out_dir)
    made = [parent for parent in directory.parents if not parent.exists()]
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.partial-", dir=directory.parent))
    try:
        yield staging
        staging.chmod(0o777 & ~_umask())  # mkdtemp's folder is private
        if directory.exists():
            directory.rmdir()  # empty, as checked
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for parent in made:  # the deepest first
            with contextlib.suppress(OSError):
                parent.rmdir()
        raise


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
    chosen = {name: _tower_tokenizer(name, tokenizer, passage_tokenizer) for name, _ in towers}
    plan = [
        (name, tower, _tokenizer_for(tower, chosen[name], special_tokens, max_length))
        for name, tower in towers
    ]
    with _staged(out_dir) as directory:
        for name, tower, hf_tokenizer in plan:
            _write_encoder(_prepare(directory / name) if name else directory, tower, hf_tokenizer)
        if isinstance(encoder, TwoTowerEncoder):
            _write_config(directory, "TwoTowerEncoder", {})
        if prompts:
            config = json.loads((directory / CONFIG_FILE).read_text())
            (directory / CONFIG_FILE).write_text(
                json.dumps({**config, "prompts": dict(prompts)}, indent=2) + "\n"
            )
        _new_file_modes(directory)
    return Path(out_dir).expanduser()


def _tower_tokenizer(name: str, tokenizer: Any, passage_tokenizer: Any) -> Any:
    """The tokenizer a tower (or route) is written with: ``passage_tokenizer``, when given, for the passage
    tower (``passage``, or the ``document`` route), else ``tokenizer``."""
    passage = name in ("passage", "document") and passage_tokenizer is not None
    return passage_tokenizer if passage else tokenizer


def _new_file_modes(directory: Path) -> None:
    """Give every file under ``directory`` the mode of a newly created file: ``0o666`` less the umask."""
    umask = _umask()
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
    prompts: Mapping[str, str] | None = None,
    default_prompt_name: str | None = None,
    passage_tokenizer: Any = None,
) -> Path:
    """Write a transformer encoder (or two towers) as a sentence-transformers model directory, with a card.

    The modules are the encoder's own steps: ``Transformer`` (the ``AutoModel`` and the tokenizer),
    ``Pooling`` in the encoder's mode (any of sentence-transformers', several concatenated in the
    encoder's order) and ``include_prompt``, written as the installed sentence-transformers names them
    (``pooling_mode`` and ``include_prompt`` in ``1_Pooling/config.json``; the ``pooling_mode_*`` flags
    before 6.0), ``Dense`` with the projection's weights and
    an identity activation (when the encoder projects), and ``Normalize`` when the embeddings are
    L2-normalised: ``SentenceTransformer(out_dir).encode(texts)`` embeds as the encoder does. The pooler
    the encoder dropped (BERT's, unused by the pooling) is written back, as :func:`export_huggingface`
    writes it. ``README.md`` is :func:`model_card`'s.

    A :class:`TwoTowerEncoder` of two transformers is written as sentence-transformers' ``Router``: a
    ``query`` route of the query tower's steps and a ``document`` route of the passage tower's (a frozen
    passage tower with its weights, as it was trained: unchanged), each tower's ``Transformer`` in a
    subfolder of its own holding the run's tokenizer. ``SentenceTransformer(out_dir).encode_query(texts)``
    embeds as the query tower does, ``encode_document(texts)`` (and ``encode``) as the passage tower.

    Args:
        model (torch.nn.Module): A :class:`TransformerEncoder`, a :class:`TwoTowerEncoder` of two, or an
            ``EmbeddingModel`` around either.
        tokenizer: The tokenizer the encoder was trained with (see :func:`pretrained_tokenizer`).
        passage_tokenizer: Two towers of two tokenizers: the passage tower's, which its ``document`` route
            holds. Default: ``None`` (``tokenizer`` for both).
        out_dir (str | os.PathLike): A new or empty directory.
        normalize (bool, optional): Add ``Normalize``. Default: ``None``, the ``EmbeddingModel``'s
            ``normalize``, or ``True`` (``EmbeddingModel``'s default) for a bare encoder.
        special_tokens (Mapping[str, str], optional): See :func:`pretrained_tokenizer`. Default: ``None``.
        max_length (int, optional): See :func:`export_huggingface` (sentence-transformers' ``max_seq_length``).
        config (Mapping[str, Any], optional): The run's config, for the model card.
        metrics (Mapping[str, Any], optional): The run's ``metrics.json``, for the model card.
        prompts (Mapping[str, str], optional): The prompts by name, written to
            ``config_sentence_transformers.json`` (``encode(texts, prompt_name=...)`` reads them). Default:
            ``None`` (none).
        default_prompt_name (str, optional): The prompt ``encode`` puts before texts given none; one of
            ``prompts``. Default: ``None``.

    Returns:
        Path: ``out_dir``.

    Raises:
        ValueError: If the encoder is not a :class:`TransformerEncoder` (the format holds a transformer)
            or two towers of them (with a sentence-transformers that has ``Router``), it concatenates
            several modes in an order a sentence-transformers before 6.0 cannot write, or as
            :func:`export_huggingface`.
    """
    encoder, normalized = unwrap_encoder(model, normalize)
    card = {"max_length": max_length, "normalize": normalized, "config": config, "metrics": metrics}
    towers = _transformer_towers(encoder)
    library = import_text_extra("sentence_transformers", "export_sentence_transformers")
    modules = sentence_transformers_modules()
    tokenizers = {route: _tower_tokenizer(route, tokenizer, passage_tokenizer) for route, _ in towers}
    for route, tower in towers:  # checked before out_dir is created
        _tokenizer_for(tower, tokenizers[route], special_tokens, max_length)
    if len(towers) > 1:
        router_class(modules)  # a sentence-transformers without Router: refused before out_dir is made
    with _staged(out_dir) as directory, tempfile.TemporaryDirectory() as staging:
        routes = {}
        for route, tower in towers:
            staged = Path(staging) / route
            export_huggingface(
                tower, tokenizers[route], staged, special_tokens=special_tokens, max_length=max_length
            )
            routes[route] = sentence_transformers_steps(modules, tower, staged, normalized)
        if "model" in routes:
            steps = routes["model"]
        else:
            steps = [router_module(modules, routes["query"], routes["document"])]
        with quiet_transformers():
            saved = library.SentenceTransformer(
                modules=steps,
                device="cpu",
                prompts=dict(prompts or {}),
                default_prompt_name=default_prompt_name,
            )
            saved.save(str(directory), create_model_card=False)
        title = Path(out_dir).expanduser().name
        (directory / "README.md").write_text(model_card(model, title=title, **card), encoding="utf-8")
        _new_file_modes(directory)
    return Path(out_dir).expanduser()


def _transformer_towers(encoder: nn.Module) -> list[tuple[str, TransformerEncoder]]:
    """``[("model", encoder)]`` of a transformer, ``[("query", ...), ("document", ...)]`` of two towers of
    transformers: the sentence-transformers routes, each a transformer.

    Raises:
        ValueError: If the encoder is neither.
    """
    if isinstance(encoder, TransformerEncoder):
        return [("model", encoder)]
    if isinstance(encoder, TwoTowerEncoder):
        towers = [("query", encoder.query_encoder), ("document", encoder.passage_encoder)]
        if all(isinstance(tower, TransformerEncoder) for _, tower in towers):
            return towers
        got = f"a TwoTowerEncoder of {type(towers[0][1]).__name__} and {type(towers[1][1]).__name__}"
    else:
        got = type(encoder).__name__
    raise ValueError(
        f"export_sentence_transformers needs a TransformerEncoder (the format holds a Hugging Face "
        f"transformer) or a TwoTowerEncoder of two, got {got}; export_huggingface writes its state dict and "
        "config."
    )
