"""A text run's model without its data: what ``export`` and ``embed --input`` need, and nothing more.

Writing a trained model out, or embedding a file with it, needs the model (built from the config, its
weights from the checkpoint) and how its texts are tokenized: the tokenizer, ``max_length``, the prompts
and the column names. None of that needs the training or test files, which may be large, elsewhere, or
gone. :func:`build_model_only` reads it from the config alone:

- the tokenizer is the run's own ``tokenizer.json`` (written beside its checkpoints when it trained one),
  else ``data.tokenizer``, else the model folder's (``model.encoder.path``);
- ``max_length`` is ``data.max_length``, else the model folder's ``max_seq_length``, else the loader's
  default; the prompts (:mod:`~composer_dynsample.config.prompts`) and ``data.columns`` as training read
  them;
- the encoder is built as training built it (its vocabulary from the tokenizer), and the checkpoint's
  ``state.model`` weights are loaded into it.

The data files are neither opened nor hashed, so nothing checks that the checkpoint was trained on them
(the full build does, when it resumes). :func:`build_model_only` returns ``None`` when the config's data
are not texts or the tokenizer can only come from the training data (a run whose ``tokenizer.json`` is
not beside its checkpoint): the caller then builds the whole run.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from composer_dynsample.config.components import ConfigError, peek_entry
from composer_dynsample.config.loading import evaluation_config, section
from composer_dynsample.config.mix_data import is_mix
from composer_dynsample.config.model_checks import folder_data_defaults
from composer_dynsample.config.names import DATASETS
from composer_dynsample.config.parameters import parameters
from composer_dynsample.config.prompts import data_prompts
from composer_dynsample.config.run_tokenizer import run_tokenizer

__all__ = ["ModelOnly", "build_model_only"]

_PAIR_COLUMNS = ("anchor", "positive", "negative")


@dataclasses.dataclass
class ModelOnly:
    """What :func:`build_model_only` builds: the parts of a run that ``export`` and ``embed`` read.

    Attributes:
        config (DictConfig): The config.
        model (EmbeddingModel): The model with the checkpoint's weights, in eval mode.
        splits (TextSplits): Empty splits whose ``info`` says how the run tokenized its texts.
        batch_sizes (tuple[int, int]): The evaluation's queries and gallery items per forward pass.
    """

    config: DictConfig
    model: Any
    splits: Any
    batch_sizes: tuple[int, int]


def build_model_only(cfg: DictConfig, checkpoint: str | os.PathLike[str] | None) -> ModelOnly | None:
    """The model of ``cfg`` with ``checkpoint``'s weights, and how it tokenizes texts, without the data.

    Args:
        cfg (DictConfig): A checked config.
        checkpoint (str | os.PathLike, optional): A Composer checkpoint (already checked for safety);
            ``None``: the model as built.

    Returns:
        ModelOnly | None: ``None`` when the data are not texts or their tokenizer needs the training data.

    Raises:
        ConfigError: If the config is wrong, or the checkpoint's weights do not fit the model.
    """
    if is_mix(cfg):  # the sources' tokenization is known once they are loaded
        return None
    data = section(cfg, "data", "data")
    loader = peek_entry("data", dict(data), DATASETS)
    takes = parameters(loader)
    if "tokenizer" not in takes or "prompts" not in takes:
        return None
    tokenizer = data.get("tokenizer") or run_tokenizer(cfg)
    defaults = folder_data_defaults(cfg, tokenizer=tokenizer is None)
    tokenizer = tokenizer or defaults.get("tokenizer")
    if tokenizer is None:
        return None
    splits = _empty_splits(cfg, data, loader, takes, str(tokenizer), defaults.get("max_length"))
    from composer_dynsample.config.model_builders import build_model

    model = build_model(cfg, splits, metrics=False)
    if checkpoint is not None:
        _load_weights(model, Path(checkpoint))
    evaluation = evaluation_config(cfg)
    return ModelOnly(cfg, model.eval(), splits, (evaluation.batch_size, evaluation.gallery_batch_size))


def _empty_splits(
    cfg: DictConfig, data: Any, loader: Any, takes: dict[str, Any], tokenizer: str, folder_length: int | None
) -> Any:
    """Splits without rows, whose ``info`` holds the tokenizer, ``max_length``, prompts and columns."""
    from composer_dynsample.data.text.cache import text_cache_dir
    from composer_dynsample.data.text.columns import check_column_map
    from composer_dynsample.data.text.prompts import check_prompts
    from composer_dynsample.data.text.store import TextInfo, TextSplits, TextStore
    from composer_dynsample.data.text.tokenized import TokenStore, TokenStoreWriter
    from composer_dynsample.data.text.tokenizer import load_tokenizer

    text = loader.__name__ == "load_texts"
    roles = ("text", "label") if text else _PAIR_COLUMNS
    length = data.get("max_length") or folder_length or takes["max_length"].default
    plain = {key: OmegaConf.to_container(value) if isinstance(value, DictConfig) else value for key, value in data.items()}  # fmt: skip
    try:
        loaded = load_tokenizer(tokenizer)
        prompts = check_prompts(
            data_prompts(cfg, plain.get("prompts"), plain.get("prompt_names")),
            "data.prompts",
            ("text",) if text else _PAIR_COLUMNS,
        )
        columns = check_column_map(plain.get("columns"), roles) if "columns" in takes else {}
    except (OSError, ValueError) as error:
        raise ConfigError(f"data: {error}") from None
    cache_dir = data.get("cache_dir")
    if loader.__name__ == "load_code_search":
        from composer_dynsample.data.text.code_search_pairs import token_cache_dir

        cache_dir = token_cache_dir(cache_dir)
    cache = text_cache_dir(cache_dir)
    folder = cache / f"tokens-empty-{int(length)}"
    if not (folder / "meta.json").is_file():
        with TokenStoreWriter(folder, {"max_length": int(length), "source": "no data"}):
            pass
    info = TextInfo(
        tokenizer=loaded.source, tokenizer_path=loaded.path, tokenizer_sha256=loaded.sha256,
        vocab_size=loaded.vocab_size, pad_id=loaded.pad_id, max_length=int(length), split="none",
        num_truncated=0, cache_dirs=(folder,), from_cache=(True,), columns=columns, prompts=prompts,
    )  # fmt: skip
    empty = TextStore(TokenStore(folder), [], [], pad_id=loaded.pad_id, vocab_size=loaded.vocab_size)
    name = str(data.get("name") or "data")
    return TextSplits(train=empty, test=empty, num_classes=0, name=name, info=info)


def _load_weights(model: Any, checkpoint: Path) -> None:
    """Load a Composer checkpoint's ``state.model`` into ``model``; a mismatch is one ConfigError line."""
    from composer_dynsample.checkpoints import model_weights

    state = model_weights(checkpoint)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:  # missing, unexpected or mis-shaped weights, one per line
        lines = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
        raise ConfigError(
            f"checkpoint {str(checkpoint)!r} does not fit the model the config builds ({lines[0] if lines else error}); "
            "give the config it was trained with."
        ) from None
