"""What a model folder says of its model beyond the weights: tokenizer, pooling, normalisation, length.

A sentence-transformers folder (one with ``modules.json``) lists its modules in order: a
``Transformer`` (the Hugging Face model and its tokenizer, in the folder itself or in a subfolder such
as ``0_Transformer``), a ``Pooling`` (``1_Pooling/config.json``: ``pooling_mode`` or the
``pooling_mode_*`` flags of older versions, and ``include_prompt``) and, when the embeddings are
L2-normalised, a
``Normalize``. The longest text is ``max_seq_length`` of the Transformer's ``sentence_bert_config.json``,
else the ``model_max_length`` of its ``tokenizer_config.json`` capped by the model's
``max_position_embeddings``, as sentence-transformers reads them. A plain Hugging Face folder
(``config.json`` and weights, no ``modules.json``) says none of this, only where its tokenizer is.

:func:`read_model_folder` reads these JSON files alone: no weights, no ``transformers``, so the config
checks can read a folder before anything is built. :func:`tokenizer_vocabulary` reads a tokenizer's
vocabulary as cheaply (a ``tokenizer.json``, or BERT's ``vocab.txt``), to tell whether two tokenizers
give the same ids; :func:`tokenizer_lowercases` says whether a ``tokenizer.json`` lower-cases its
input.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

__all__ = [
    "MODULES_FILE",
    "POOLING_FILE",
    "SETTINGS_FILE",
    "ModelFolder",
    "read_model_folder",
    "tokenizer_lowercases",
    "tokenizer_vocabulary",
]

MODULES_FILE = "modules.json"
SETTINGS_FILE = "config_sentence_transformers.json"  # its prompts and default_prompt_name
POOLING_FILE = "config.json"  # in the Pooling module's folder, 1_Pooling/ as a rule
# The names sentence-transformers has given the Transformer module's settings file, newest first.
_SETTINGS_FILES = (
    "sentence_bert_config.json",
    "sentence_roberta_config.json",
    "sentence_distilbert_config.json",
    "sentence_camembert_config.json",
    "sentence_albert_config.json",
    "sentence_xlm-roberta_config.json",
    "sentence_xlnet_config.json",
)
# The pooling_mode_* flags of sentence-transformers before 6.0, and the mode each one names (in the order
# those versions concatenate them).
POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# Files of a tokenizer that transformers' AutoTokenizer reads from a folder.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
)
_UNSTATED_LENGTH = 10**6  # transformers writes model_max_length 1e30 for "no limit"


@dataclasses.dataclass(frozen=True)
class ModelFolder:
    """The settings of a model folder (see the module docstring).

    Attributes:
        path (Path): The folder given.
        model_dir (Path): The folder of the Hugging Face model and its tokenizer: ``path``, or the
            subfolder of a sentence-transformers ``Transformer`` module (``0_Transformer``).
        sentence_transformers (bool): Whether the folder has a ``modules.json``.
        pooling (str | None): The Pooling module's mode as sentence-transformers names it (``"mean"``,
            ``"cls"``, ``"max"``, ..., several joined by ``+``); ``None`` without a Pooling module.
        pooling_file (Path | None): The file ``pooling`` was read from.
        include_prompt (bool): The Pooling module's ``include_prompt``: whether a prompt's tokens are
            pooled with the text's (``False``: they are left out). ``True`` when it does not say.
        normalize (bool | None): Whether ``modules.json`` lists a ``Normalize``; ``None`` for a plain
            Hugging Face folder.
        max_seq_length (int | None): The longest text in tokens; ``None`` when the folder does not say.
        max_seq_length_source (str | None): The file ``max_seq_length`` was read from.
        do_lower_case (bool): The Transformer's ``do_lower_case``: sentence-transformers lower-cases
            texts its tokenizer leaves as they are.
        other_modules (tuple[str, ...]): Modules besides Transformer, Pooling and Normalize, as
            ``"Dense (2_Dense)"``.
        prompts (dict[str, str]): The prompts of ``config_sentence_transformers.json``, by name.
        default_prompt_name (str | None): The prompt sentence-transformers' ``encode`` puts before every
            text when it is given none.
    """

    path: Path
    model_dir: Path
    sentence_transformers: bool = False
    pooling: str | None = None
    pooling_file: Path | None = None
    include_prompt: bool = True
    normalize: bool | None = None
    max_seq_length: int | None = None
    max_seq_length_source: str | None = None
    do_lower_case: bool = False
    other_modules: tuple[str, ...] = ()
    prompts: dict[str, str] = dataclasses.field(default_factory=dict)
    default_prompt_name: str | None = None

    @property
    def has_tokenizer(self) -> bool:
        """Whether :attr:`model_dir` holds a tokenizer's files (its vocabulary)."""
        return any((self.model_dir / name).is_file() for name in _TOKENIZER_FILES)

    @property
    def tokenizer_file(self) -> Path | None:
        """The ``tokenizer.json`` of :attr:`model_dir`, if it has one."""
        file = self.model_dir / "tokenizer.json"
        return file if file.is_file() else None


def _read_json(file: Path, folder: Path) -> Any:
    """The JSON of ``file``, or a one-line ValueError naming it."""
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise ValueError(f"model folder {str(folder)!r}: cannot read {file.name}: {reason}.") from None
    except ValueError as error:
        raise ValueError(
            f"model folder {str(folder)!r}: {file.relative_to(folder)} is not valid JSON ({error})."
        ) from None


def _modules(folder: Path) -> list[tuple[str, Path, str]] | None:
    """``(class name, folder, path as written)`` of each module in ``modules.json``; ``None`` without one."""
    file = folder / MODULES_FILE
    if not file.is_file():
        return None
    entries = _read_json(file, folder)
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise ValueError(f"model folder {str(folder)!r}: {MODULES_FILE} is not a list of modules.")
    modules = []
    for entry in entries:
        kind, where = entry.get("type"), entry.get("path", "")
        if not isinstance(kind, str) or not isinstance(where, str):
            raise ValueError(
                f"model folder {str(folder)!r}: {MODULES_FILE} has a module without a 'type' or 'path': {entry}."
            )
        modules.append((kind.rsplit(".", 1)[-1], folder / where if where else folder, where))
    return modules


def _pooling(file: Path, folder: Path) -> tuple[str, bool]:
    """The mode of a Pooling module's ``config.json`` (``pooling_mode``, else the ``pooling_mode_*``
    flags) and its ``include_prompt``."""
    values = _json_object(file, folder)
    mode = values.get("pooling_mode")
    if mode is None:
        flagged = [name for flag, name in POOLING_FLAGS.items() if values.get(flag)]
        mode = flagged or "mean"  # sentence-transformers' default
    if isinstance(mode, list):
        mode = "+".join(str(part) for part in mode)
    return str(mode), values.get("include_prompt", True) is not False


def _max_seq_length(model_dir: Path, folder: Path) -> tuple[int | None, str | None, bool]:
    """``(max_seq_length, the file it came from, do_lower_case)`` of a Transformer module's folder."""
    name = next((name for name in _SETTINGS_FILES if (model_dir / name).is_file()), None)
    settings = _json_object(model_dir / name, folder) if name is not None else {}
    lower = bool(settings.get("do_lower_case", False))
    arguments = settings.get("processor_kwargs") or settings.get("tokenizer_args") or {}
    stated = arguments.get("model_max_length") if isinstance(arguments, dict) else None
    for value in (stated, settings.get("max_seq_length")):
        if _length(value) is not None:
            return int(value), name, lower
    stated = _json_object(model_dir / "tokenizer_config.json", folder).get("model_max_length")
    if _length(stated) is None or stated >= _UNSTATED_LENGTH:
        return None, None, lower
    positions = _json_object(model_dir / "config.json", folder).get("max_position_embeddings")
    if _length(positions) is not None:
        stated = min(stated, positions)  # as sentence-transformers caps it
    return int(stated), "tokenizer_config.json", lower


def _prompts(folder: Path) -> tuple[dict[str, str], str | None]:
    """``(prompts, default_prompt_name)`` of ``config_sentence_transformers.json``, checked."""
    settings = _json_object(folder / SETTINGS_FILE, folder)
    prompts, default = settings.get("prompts") or {}, settings.get("default_prompt_name")
    if not isinstance(prompts, dict) or not all(
        isinstance(name, str) and isinstance(prompt, str) for name, prompt in prompts.items()
    ):
        raise ValueError(
            f"model folder {str(folder)!r}: {SETTINGS_FILE} 'prompts' must map names to strings, got {prompts!r}."
        )
    if default is not None and default not in prompts:
        raise ValueError(
            f"model folder {str(folder)!r}: {SETTINGS_FILE} names default_prompt_name {default!r}, which is not "
            f"one of its prompts ({sorted(prompts)})."
        )
    return dict(prompts), default


def _json_object(file: Path, folder: Path) -> dict[str, Any]:
    """The JSON object of ``file``; ``{}`` when there is no such file or it holds another JSON value."""
    values = _read_json(file, folder) if file.is_file() else {}
    return values if isinstance(values, dict) else {}


def _length(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def read_model_folder(path: str | os.PathLike[str]) -> ModelFolder:
    """The settings of the model folder ``path`` (see the module docstring), read from its JSON files.

    A folder that does not exist, or holds no ``modules.json``, reads as a plain Hugging Face folder:
    the encoder that loads it names what is missing.

    Args:
        path (str | os.PathLike): A local model folder.

    Returns:
        ModelFolder: What the folder says.

    Raises:
        ValueError: If ``modules.json``, a Pooling module's ``config.json`` or a Transformer's settings
            file cannot be read or is not valid JSON, or ``modules.json`` is not a list of modules.
    """
    folder = Path(path).expanduser()
    modules = _modules(folder)
    if modules is None:
        return ModelFolder(path=folder, model_dir=folder)
    model_dir, pooling, pooling_file, normalize, others = folder, None, None, False, []
    include_prompt = True
    for kind, where, written in modules:
        if kind == "Transformer":
            model_dir = where
        elif kind == "Pooling" and pooling is None:
            pooling_file = where / POOLING_FILE
            pooling, include_prompt = _pooling(pooling_file, folder)
        elif kind == "Normalize":
            normalize = True
        else:
            others.append(f"{kind} ({written or '.'})")
    length, source, lower = _max_seq_length(model_dir, folder)
    prompts, default_prompt_name = _prompts(folder)
    return ModelFolder(
        path=folder,
        model_dir=model_dir,
        sentence_transformers=True,
        pooling=pooling,
        pooling_file=pooling_file,
        include_prompt=include_prompt,
        normalize=normalize,
        max_seq_length=length,
        max_seq_length_source=source,
        do_lower_case=lower,
        other_modules=tuple(others),
        prompts=prompts,
        default_prompt_name=default_prompt_name,
    )


def tokenizer_vocabulary(path: str | os.PathLike[str]) -> dict[str, int] | None:
    """The vocabulary (token to id, added tokens included) of a ``tokenizer.json`` or a folder's tokenizer.

    A folder is read as :func:`read_model_folder` finds its tokenizer: its ``tokenizer.json``, else
    BERT's ``vocab.txt`` (one token a line, ids in line order).

    Args:
        path (str | os.PathLike): A ``tokenizer.json`` file or a model folder.

    Returns:
        dict[str, int] | None: ``None`` when neither file is there, or the file does not parse (the
        tokenizer's loader names what is wrong with it).
    """
    place = Path(path).expanduser()
    if place.is_dir():
        try:
            model_dir = read_model_folder(place).model_dir
        except ValueError:
            return None
        file, vocab_txt = model_dir / "tokenizer.json", model_dir / "vocab.txt"
        if not file.is_file():
            if not vocab_txt.is_file():
                return None
            lines = vocab_txt.read_text(encoding="utf-8").splitlines()
            return {token: index for index, token in enumerate(lines)}
    else:
        file = place
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(file)).get_vocab(with_added_tokens=True)
    except Exception:  # tokenizers raises a bare Exception on a file it cannot parse
        return None


def tokenizer_lowercases(file: str | os.PathLike[str]) -> bool | None:
    """Whether the normalizer of a ``tokenizer.json`` lower-cases (``Lowercase``, or BERT's with
    ``lowercase``), alone or in a ``Sequence``; ``None`` when the file cannot be read."""
    try:
        values = json.loads(Path(file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    stack = [values.get("normalizer") if isinstance(values, dict) else None]
    while stack:
        step = stack.pop()
        if not isinstance(step, dict):
            continue
        if step.get("type") == "Lowercase" or (
            step.get("type") == "BertNormalizer" and step.get("lowercase")
        ):
            return True
        stack.extend(step.get("normalizers") or [])
    return False
