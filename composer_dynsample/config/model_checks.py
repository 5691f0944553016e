"""The ``model`` section checked before anything is built: its keys, a transformer's positions, a model folder.

:func:`check_encoder` and :func:`check_model_keys` check ``model.encoder`` (each tower's of ``two_tower``) and
``model``; :func:`check_positions` compares the data's ``max_length`` with each transformer's positions
before any data is loaded. A transformer of a ``path`` (a Hugging Face or sentence-transformers folder) is
the whole model: :func:`folder_data_defaults` gives the data its tokenizer and ``max_length`` when the
``data`` section leaves them out, and :func:`check_model_folder` refuses a missing folder, one without a
tokenizer when the data names none, a ``data.tokenizer`` of another vocabulary, and a pooling the encoder lacks.

Two towers (``two_tower``) of two folders: the data's tokenizer is the query folder's, and a passage folder
that tokenizes otherwise (another vocabulary or lower-casing) gives a pairs loader its ``passage_tokenizer``;
``max_length`` is the smaller of the two folders', two folders that disagree on ``Normalize`` need
``model.normalize``, and each tower pools as its own folder says.

Which folders a config names, and how two towers' folders relate, is
:mod:`~composer_dynsample.config.model_folders` (its names are re-exported here). Reading a folder imports
:mod:`composer_dynsample.models` (torch) when a check runs: importing this module imports neither torch nor
Composer.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from composer_dynsample.config.components import (
    ConfigError,
    check_keys,
    check_types,
    peek_entry,
    peek_parameters,
    resolve_entry,
)
from composer_dynsample.config.loading import section
from composer_dynsample.config.model_folders import (
    TOWERS,
    folder_normalize,
    folders,
    is_transformer,
    is_two_tower,
    model_folder,
    two_tokenizer_folders,
)
from composer_dynsample.config.names import DATASETS, ENCODERS, MODEL_OWNED

if TYPE_CHECKING:
    from composer_dynsample.models.sentence_folder import ModelFolder

__all__ = [  # the model folders' names are re-exported from model_folders, where they live
    "TOWERS",
    "check_encoder",
    "check_model_folder",
    "check_model_keys",
    "check_positions",
    "check_transformer_positions",
    "folder_data_defaults",
    "folder_normalize",
    "is_transformer",
    "is_two_tower",
    "model_folder",
    "tower_section",
]

# Values the encoder builder fills in from the data; stand-ins while the data is not loaded yet.
_SHAPE_STAND_INS = {"in_features": 1, "in_channels": 1, "input_length": 1, "input_size": 1, "vocab_size": 1}


def tower_section(path: str, tower: str, value: Any) -> dict[str, Any]:
    """A two-tower encoder's ``tower`` section as a dict, or a ConfigError when it is not a mapping."""
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{path}.{tower} must be an encoder section (name: bag_of_tokens, ... or _component_: ...), "
            f"got {value!r}."
        )
    return dict(value)


def check_encoder(path: str, values: dict[str, Any]) -> None:
    """The keys and value types of an encoder section, and of each tower's of a two-tower encoder."""
    if not values:
        return
    entry, _, kwargs, _ = resolve_entry(path, values, ENCODERS, supplied=_SHAPE_STAND_INS)
    if is_two_tower(entry.target):
        for tower in TOWERS:
            check_encoder(f"{path}.{tower}", tower_section(path, tower, kwargs.pop(tower)))
    check_types(path, entry, kwargs)


def check_model_keys(model: Mapping[str, Any], takes: Iterable[str]) -> None:
    """The ``model`` section's keys: ``encoder``, ``loss`` and the arguments ``takes`` names (the
    ``EmbeddingModel``'s) that the builders do not supply themselves."""
    valid = [key for key in takes if key not in MODEL_OWNED] + ["encoder", "loss"]
    check_keys("model", model, valid, "EmbeddingModel")


def check_positions(cfg: DictConfig) -> None:
    """``data.max_length`` against the positions of each transformer of ``model.encoder``, data unloaded.

    The length is the data section's ``max_length``, else a model folder's (the smaller of two towers'
    folders', see :func:`folder_data_defaults`), else its loader's default; a transformer's
    positions are read off its ``config`` (or the model type's default) or its folder's ``config.json``,
    as :func:`~composer_dynsample.models.transformer.position_limit` says. Sections that name no
    transformer, or data without a ``max_length``, are left alone.

    Raises:
        ConfigError: If ``data.max_length`` is more tokens than a transformer has positions for.
    """
    data = section(cfg, "data", "data")
    if not data:
        return
    max_length, origin = data.get("max_length"), None
    chosen = _data_length(data, folders(cfg)) if max_length is None else None
    if chosen is not None:
        max_length, where, folder = chosen
        if max_length == folder.max_seq_length:
            source = (folder.model_dir / str(folder.max_seq_length_source)).relative_to(folder.path)
            origin = (
                f"data.max_length is unset and the max_seq_length of {where}.path "
                f"{str(folder.path)!r} (its {source}) is {max_length}"
            )
    elif "max_length" not in data:
        default = peek_parameters("data", data, DATASETS).get("max_length")
        max_length = None if default is None else default.default
    if isinstance(max_length, bool) or not isinstance(max_length, int):
        return
    encoder = section(section(cfg, "model", "model"), "encoder", "model.encoder")
    _check_section_positions("model.encoder", encoder, max_length, origin)


def _check_section_positions(path: str, values: dict[str, Any], max_length: int, origin: str | None) -> None:
    """:func:`check_positions` for one encoder section and, of two towers, each tower's."""
    if not values:
        return
    target = peek_entry(path, values, ENCODERS)
    if is_two_tower(target):
        for tower in TOWERS:
            _check_section_positions(
                f"{path}.{tower}", tower_section(path, tower, values.get(tower)), max_length, origin
            )
    elif is_transformer(target):
        check_transformer_positions(path, values, max_length, origin)


def check_transformer_positions(
    path: str, values: Mapping[str, Any], max_length: int, origin: str | None = None
) -> None:
    """A one-line ConfigError when texts of ``max_length`` tokens do not fit the transformer's positions;
    ``origin`` says where the length came from when the data section does not set it."""
    from composer_dynsample.models.transformer import position_limit

    model_path, config = values.get("path"), values.get("config")
    if model_path is not None and not isinstance(model_path, (str, os.PathLike)):
        return  # the encoder names a path of the wrong type itself
    limit = position_limit(path=model_path) if model_path is not None else position_limit(config=config)
    if limit is None or max_length <= limit.tokens:
        return
    positions, reserved = limit.max_position_embeddings, limit.max_position_embeddings - limit.tokens
    if model_path is not None:
        where = f"the model of {path}.path ({str(model_path)!r}) has max_position_embeddings {positions} (its config.json)"
        fix = f"set data.max_length to at most {limit.tokens}"
    else:
        key = f"{path}.config.max_position_embeddings"
        where = (
            f"{key} is {positions}"
            if not limit.default
            else f"{key} is left at {positions}, the default for model_type {limit.model_type!r}"
        )
        fix = f"set data.max_length to at most {limit.tokens}, or {key} to at least {max_length + reserved}"
    kept = (
        f" ({limit.model_type!r} keeps {reserved} of them for padding: {limit.tokens} tokens)"
        if reserved
        else ""
    )
    said = origin or f"data.max_length is {max_length}"
    raise ConfigError(f"{said} but {where}{kept}: a longer text has no position embedding; {fix}.")


def check_model_folder(cfg: DictConfig) -> None:
    """The model folder of ``model.encoder`` (each tower's) against the config, before any data is loaded.

    Raises:
        ConfigError: If the folder is not there or two towers' folders do not share a tokenizer (see
            :func:`model_folder`), pools otherwise than by mean or CLS and ``model.encoder.pooling`` is
            unset, holds no tokenizer and ``data.tokenizer`` is unset, lower-cases texts its tokenizer
            does not, or ``data.tokenizer`` has another vocabulary than the folder's tokenizer.
    """
    found = folders(cfg)
    if not found:
        return
    from composer_dynsample.models.transformer import folder_pooling  # it imports torch: only for a folder

    encoder = section(section(cfg, "model", "model"), "encoder", "model.encoder")
    for where, tower_folder in found:
        values = encoder if where == "model.encoder" else encoder[where.rsplit(".", 1)[1]]
        if values.get("pooling") is None:
            try:
                folder_pooling(tower_folder, f"{where}.pooling", f"{where}.path")
            except ValueError as error:
                raise ConfigError(str(error)) from None
    _data_tokenizer(section(cfg, "data", "data"), found[:1] if two_tokenizer_folders(found) else found)


def folder_data_defaults(cfg: DictConfig, *, tokenizer: bool = True) -> dict[str, Any]:
    """The ``data`` keys a model folder fills when the section leaves them out (or null).

    ``tokenizer`` is the folder's own (the folder of its ``Transformer`` module, read by
    ``transformers.AutoTokenizer``); ``max_length`` is the folder's ``max_seq_length``, else, when the
    loader's default is more tokens than the model has positions for, those positions. A ``data``
    section that names its tokenizer has it checked against the folder's.

    Two towers of two folders (of one tokenizer, see :func:`model_folder`) give the query tower's
    tokenizer, and the smaller of the two folders' lengths: no tower reads a text longer than its folder
    does.

    Args:
        cfg (DictConfig): The config.
        tokenizer (bool): Fill the tokenizer too (``False`` when the run's own tokenizer is used).
            Default: ``True``.

    Returns:
        dict[str, Any]: ``{"tokenizer": ..., "max_length": ...}``, either or both; empty without a folder.

    Raises:
        ConfigError: As :func:`check_model_folder`, for the folder and the tokenizer.
    """
    found = folders(cfg)
    data = section(cfg, "data", "data")
    if not found or not data:
        return {}
    defaults: dict[str, Any] = {}
    two = two_tokenizer_folders(found)
    given = _data_tokenizer(data, found[:1] if two else found) if tokenizer else None
    if given is not None:
        defaults["tokenizer"] = given
    if two and data.get("passage_tokenizer") is None:
        defaults["passage_tokenizer"] = _passage_tokenizer(data, found)
    chosen = _data_length(data, found) if data.get("max_length") is None else None
    if chosen is not None:
        defaults["max_length"] = chosen[0]
    return defaults


def _data_length(
    data: Mapping[str, Any], found: list[tuple[str, ModelFolder]]
) -> tuple[int, str, ModelFolder] | None:
    """The smallest ``max_length`` the folders give (the first folder's of equals), with the section
    and folder it came from; ``None`` when none gives one."""
    lengths = [(_folder_max_length(data, folder), where, folder) for where, folder in found]
    given = [(length, where, folder) for length, where, folder in lengths if length is not None]
    return min(given, key=lambda item: item[0]) if given else None


def _folder_max_length(data: Mapping[str, Any], folder: ModelFolder) -> int | None:
    """The ``max_length`` a folder gives a loader that takes one: see :func:`folder_data_defaults`."""
    from composer_dynsample.models.transformer import position_limit

    takes = peek_parameters("data", data, DATASETS)
    if "max_length" not in takes:
        return None
    if folder.max_seq_length is not None:
        return folder.max_seq_length
    default, limit = takes["max_length"].default, position_limit(path=folder.path)
    if isinstance(default, int) and limit is not None and default > limit.tokens:
        return limit.tokens
    return None


def _passage_tokenizer(data: Mapping[str, Any], found: list[tuple[str, ModelFolder]]) -> str:
    """The passage folder's tokenizer for a loader that reads two (``passage_tokenizer``); a one-line
    ConfigError for one that reads one."""
    (query_where, query), (where, folder) = found[0], found[1]
    if "passage_tokenizer" not in peek_parameters("data", data, DATASETS):
        raise ConfigError(
            f"{query_where}.path {str(query.path)!r} and {where}.path {str(folder.path)!r} have two tokenizers, "
            f"and data {data.get('name')!r} tokenizes with one; use a loader of queries and passages (pairs, "
            "code_search), or give both towers folders of one tokenizer."
        )
    _check_lowercase(folder, where)  # it has a tokenizer: two were compared
    return str(folder.model_dir)


def _data_tokenizer(data: Mapping[str, Any], found: list[tuple[str, ModelFolder]]) -> str | None:
    """The first folder's tokenizer for a loader that takes one and is given none; ``None`` otherwise,
    after checking a given one against each folder's."""
    if not data or "tokenizer" not in peek_parameters("data", data, DATASETS):
        return None
    given = data.get("tokenizer")
    if given is not None:
        checked = {}  # one check of each tokenizer: two towers of one folder share it
        for where, folder in found:
            checked.setdefault(folder.model_dir.resolve(), (where, folder))
        for where, folder in checked.values():
            _check_same_vocabulary(str(given), folder, where)
        return None
    where, folder = found[0]
    if not folder.has_tokenizer:
        raise ConfigError(
            f"{where}.path {str(folder.path)!r} holds no tokenizer (tokenizer.json, vocab.txt, ...), so "
            "the ids its model was trained on are unknown; set data.tokenizer to that model's tokenizer "
            "(a tokenizer.json or a folder)."
        )
    _check_lowercase(folder, where)
    return str(folder.model_dir)


def _check_same_vocabulary(given: str, folder: ModelFolder, where: str) -> None:
    """A one-line ConfigError when ``data.tokenizer`` has another vocabulary than the folder's tokenizer."""
    from composer_dynsample.models.sentence_folder import tokenizer_vocabulary

    theirs = tokenizer_vocabulary(folder.model_dir) if folder.has_tokenizer else None
    ours = tokenizer_vocabulary(given)
    if theirs is None or ours is None or ours == theirs:
        return  # nothing to compare with, or a tokenizer the loader names as broken
    difference = _vocabulary_difference(ours, theirs, "data.tokenizer", "the folder")
    raise ConfigError(
        f"data.tokenizer {given!r} is not the tokenizer of {where}.path {str(folder.path)!r}: their "
        f"vocabularies differ ({len(ours)} and {len(theirs)} tokens; {difference}), so the model would read "
        "ids it was not trained on; leave data.tokenizer out to use the folder's tokenizer, or give one with "
        "its vocabulary."
    )


def _vocabulary_difference(
    ours: dict[str, int], theirs: dict[str, int], our_name: str, their_name: str
) -> str:
    """The first token (by ``theirs``' ids) two different vocabularies disagree on, in words; else a token
    only ``ours`` has."""
    difference = next(
        (
            f"{their_name}'s {token!r} is id {index}, {our_name}'s "
            + (f"is {ours[token]}" if token in ours else "lacks it")
            for token, index in sorted(theirs.items(), key=lambda item: item[1])
            if ours.get(token) != index
        ),
        None,
    )
    if difference is None:
        extra = min(set(ours) - set(theirs), key=ours.__getitem__)
        difference = f"{our_name} has {extra!r} (id {ours[extra]}), {their_name}'s has not"
    return difference


def _check_lowercase(folder: ModelFolder, where: str) -> None:
    """A one-line ConfigError when the folder lower-cases texts (``do_lower_case``) its tokenizer does not."""

    from composer_dynsample.models.sentence_folder import tokenizer_lowercases

    file = folder.tokenizer_file
    if folder.do_lower_case and file is not None and tokenizer_lowercases(file) is False:
        raise ConfigError(
            f"{where}.path {str(folder.path)!r} lower-cases texts (do_lower_case in its settings) but its "
            f"tokenizer {str(file)!r} does not; save that tokenizer with a Lowercase normalizer and give it "
            "as data.tokenizer."
        )
