"""The model folders a config names: a transformer ``model.encoder`` of a ``path``, or two towers of them.

:func:`folders` reads each folder's JSON (no weights) and checks two towers' folders against each other;
:func:`model_folder` is the query tower's (or the one) folder, which gives the data its tokenizer and
prompts, :func:`passage_folder` the passage tower's of two folders, and :func:`two_tokenizer_folders` tells
whether they tokenize otherwise (another vocabulary or lower-casing): then the passage folder's tokenizer is
the data's ``passage_tokenizer`` (:func:`passage_tokenizer_of`). Reading a folder imports
:mod:`composer_dynsample.models` (torch) when it runs: importing this module imports neither torch nor Composer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from composer_dynsample.config.components import ConfigError, peek_entry
from composer_dynsample.config.loading import section
from composer_dynsample.config.names import ENCODERS
from composer_dynsample.config.parameters import parameters

if TYPE_CHECKING:
    from composer_dynsample.models.sentence_folder import ModelFolder

__all__ = [
    "TOWERS",
    "folder_normalize",
    "folders",
    "is_transformer",
    "is_two_tower",
    "lowercases",
    "model_folder",
    "passage_folder",
    "passage_tokenizer_of",
    "two_tokenizer_folders",
]

TOWERS = ("query_encoder", "passage_encoder")


def is_two_tower(target: Any) -> bool:
    """Whether an encoder target takes a section for each of the two towers (:data:`TOWERS`)."""
    return all(key in parameters(target) for key in TOWERS)


def is_transformer(target: Any) -> bool:
    """Whether a registry or ``_component_`` target is :class:`~composer_dynsample.TransformerEncoder` or a subclass."""
    from composer_dynsample.models.transformer import TransformerEncoder

    return isinstance(target, type) and issubclass(target, TransformerEncoder)


def model_folder(cfg: DictConfig) -> ModelFolder | None:
    """What the folder of ``model.encoder`` says, when it is a transformer of a ``path`` (JSON read only);
    for two towers, the query tower's folder (else the passage tower's, when only it names one).

    That folder gives the data its tokenizer and prompts, and the model its normalisation unless it does
    not say (:func:`folder_normalize`). Two towers of two folders are checked (:func:`_check_tower_folders`).

    Returns:
        ModelFolder | None: ``None`` for any other encoder (random init, other encoders, towers of none).

    Raises:
        ConfigError: If the folder does not exist, holds no ``config.json``, or its sentence-transformers
            files cannot be read; or two towers' folders disagree on ``Normalize`` while ``model.normalize`` is unset.
    """
    found = folders(cfg)
    return found[0][1] if found else None


def passage_folder(cfg: DictConfig) -> ModelFolder | None:
    """The passage tower's folder of two towers of two folders (``None`` for one folder, or none)."""
    found = folders(cfg)
    if len(found) < 2 or found[0][1].model_dir.resolve() == found[1][1].model_dir.resolve():
        return None
    return found[1][1]


def folder_normalize(cfg: DictConfig) -> bool | None:
    """Whether the model folders of ``model.encoder`` L2-normalise embeddings (list a ``Normalize``): the
    first folder that says (a plain Hugging Face folder does not); ``None`` when none says. Two towers'
    folders that disagree are refused unless ``model.normalize`` is set (:func:`model_folder`)."""
    return next((folder.normalize for _, folder in folders(cfg) if folder.normalize is not None), None)


def folders(cfg: DictConfig) -> list[tuple[str, ModelFolder]]:
    """``(section, folder)`` of each transformer of a ``path`` in ``model.encoder``, the towers' checked."""
    model = section(cfg, "model", "model")
    found = _encoder_folders(section(model, "encoder", "model.encoder"))
    data = cfg.get("data")
    tokenizer = data.get("tokenizer") if isinstance(data, Mapping) else None
    _check_tower_folders(found, model.get("normalize"), tokenizer_given=tokenizer is not None)
    return found


def _check_tower_folders(
    found: list[tuple[str, ModelFolder]], normalize: Any, *, tokenizer_given: bool = False
) -> None:
    """Two towers of two folders: one ``Normalize`` unless ``model.normalize`` says, and a tokenizer in the
    passage tower's folder when the query tower's has one, unless ``data.tokenizer`` names the one both
    read (a one-line ConfigError naming the folders)."""
    if len(found) < 2:
        return
    (query_where, query), others = found[0], found[1:]
    for passage_where, passage in others:
        same = passage.model_dir.resolve() == query.model_dir.resolve()
        if query.has_tokenizer and not passage.has_tokenizer and not same and not tokenizer_given:
            raise ConfigError(
                f"{passage_where}.path {str(passage.path)!r} holds no tokenizer (tokenizer.json, vocab.txt, ...), "
                f"so the ids its model was trained on are unknown, and {query_where}.path's tokenizer would "
                "feed it; give that tower a folder with its tokenizer, or set data.tokenizer to the one both "
                "towers read."
            )
        named = f"{query_where}.path {str(query.path)!r} and {passage_where}.path {str(passage.path)!r}"
        stated = (query.normalize, passage.normalize)
        if normalize is None and None not in stated and stated[0] != stated[1]:
            normalising = query_where if query.normalize else passage_where
            raise ConfigError(
                f"{named} disagree on normalisation (only {normalising}.path lists a Normalize module) and "
                "model.normalize is unset; set model.normalize to true or false for both towers."
            )


def _two_tokenizers(query: ModelFolder, passage: ModelFolder) -> bool:
    """Whether two towers' folders tokenize otherwise: their vocabularies differ, or one lower-cases texts
    and the other does not. A folder without a tokenizer is not compared; one folder is one tokenizer."""
    from composer_dynsample.models.sentence_folder import tokenizer_vocabulary

    if query.model_dir.resolve() == passage.model_dir.resolve():
        return False
    theirs = tokenizer_vocabulary(query.model_dir) if query.has_tokenizer else None
    ours = tokenizer_vocabulary(passage.model_dir) if passage.has_tokenizer else None
    if theirs is not None and ours is not None and ours != theirs:
        return True
    lower = [lowercases(folder) for folder in (query, passage)]
    return None not in lower and lower[0] != lower[1]


def two_tokenizer_folders(found: list[tuple[str, ModelFolder]]) -> bool:
    return len(found) > 1 and _two_tokenizers(found[0][1], found[1][1])


def passage_tokenizer_of(cfg: DictConfig) -> str | None:
    """The passage tower's tokenizer of towers of two tokenizers (``data.passage_tokenizer``, else the passage
    folder's); ``None`` for one tokenizer."""
    found = folders(cfg)
    if not two_tokenizer_folders(found):
        return None
    return str(section(cfg, "data", "data").get("passage_tokenizer") or found[1][1].model_dir)


def lowercases(folder: ModelFolder) -> bool | None:
    """Whether sentence-transformers lower-cases the folder's texts (``do_lower_case``, or its
    ``tokenizer.json``'s normalizer); ``None`` when it cannot tell (no ``tokenizer.json``)."""
    from composer_dynsample.models.sentence_folder import tokenizer_lowercases

    if folder.do_lower_case:
        return True
    return None if folder.tokenizer_file is None else tokenizer_lowercases(folder.tokenizer_file)


def _encoder_folders(
    encoder: Mapping[str, Any], where: str = "model.encoder"
) -> list[tuple[str, ModelFolder]]:
    """``(section, folder)`` of every transformer of a ``path`` in ``encoder`` (each tower's of two)."""
    try:
        entry = peek_entry(where, dict(encoder), ENCODERS)
    except ConfigError:
        return []  # a section naming no encoder: the encoder's own check says so
    if is_two_tower(entry):
        return [
            pair
            for tower in TOWERS
            if isinstance(encoder.get(tower), Mapping)
            for pair in _encoder_folders(encoder[tower], f"{where}.{tower}")
        ]
    path = encoder.get("path")
    if (
        not isinstance(path, (str, os.PathLike))
        or encoder.get("config") is not None
        or not is_transformer(entry)
    ):
        return []
    from composer_dynsample.models.sentence_folder import read_model_folder

    try:
        folder = read_model_folder(path)
    except ValueError as error:
        raise ConfigError(f"{where}.path: {error}") from None
    if not (folder.model_dir / "config.json").is_file():
        reason = "holds no config.json" if folder.model_dir.is_dir() else "does not exist"
        raise ConfigError(
            f"{where}.path {str(path)!r} {reason}; give a local folder holding a Hugging Face or "
            "sentence-transformers model (config.json and weights): nothing is downloaded."
        )
    return [(where, folder)]
