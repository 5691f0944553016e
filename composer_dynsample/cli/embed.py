"""``composer-dynsample embed``: a split's embeddings, or a file's, by a checkpoint's model, as ``.npz``.

What a file gives (``--input``, ``--column``, ``--prompt``, ``--prompt-name``) is
:mod:`composer_dynsample.cli.inputs`'s; the model is built as ``eval`` builds it. An existing ``--out`` is
replaced only with ``--overwrite``, and the ``.npz`` appears whole or not at all (written beside it first,
then renamed).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from composer_dynsample.cli.commands import OutputError, _build_model_run, _out_path, _prepare_model_run
from composer_dynsample.cli.run_dir import is_rank_zero
from composer_dynsample.config.components import ConfigError
from composer_dynsample.config.mix_data import one_source
from composer_dynsample.config.model_folders import passage_tokenizer_of
from composer_dynsample.config.model_only import build_model_only

__all__ = ["embed", "written_whole"]


def embed(
    config: str | os.PathLike[str] | Mapping[str, Any],
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    *,
    split: str | None = None,
    input_path: str | os.PathLike[str] | None = None,
    column: str | None = None,
    prompt: str | None = None,
    prompt_name: str | None = None,
    overwrite: bool = False,
    source: str | None = None,
    trust_checkpoint: bool = False,
) -> Path:
    """Write the embeddings of a split, or of a file, with a checkpoint's model to an ``.npz`` file.

    Args:
        config (str | os.PathLike | Mapping): The config the checkpoint was trained with.
        checkpoint (str | os.PathLike): The checkpoint file.
        out (str | os.PathLike): The ``.npz`` file (``.npz`` is appended when missing, as numpy does):
            arrays ``embeddings`` (N, D) float32, ``labels`` (N,) and ``indices`` (N,), the rows of the
            split; for text data also ``is_query`` (N,) and ``source_rows`` (N,), each row's row in the
            data file.
        overrides (Sequence[str]): Dotted overrides. Default: none.
        split (str, optional): ``"test"`` or ``"train"``. Default: ``"test"`` unless ``input_path`` is given.
        input_path (str | os.PathLike, optional): ``--input``: embed this instead of a split: a file of
            texts (a ``text`` column, or ``anchor`` and ``positive``) for text data, a folder of images
            for image data (see :mod:`composer_dynsample.cli.inputs`); ``indices`` are then its rows. A
            file of ``anchor`` and ``positive`` gives its rows interleaved: anchor 0, positive 0, anchor 1, ...
        column (str, optional): ``--column``: of a text ``input_path``, embed this column only
            (``text``, ``anchor`` or ``positive``, or the file's own name of a column ``data.columns``
            maps), one row per file row in file order. Default: ``None``.
        prompt, prompt_name (str, optional): ``--prompt``, ``--prompt-name``: of a text ``input_path``,
            put this prompt (or the model folder's prompt of this name) before every text. Default:
            ``None``: each column's prompt of the run (:func:`~composer_dynsample.cli.inputs.embed_prompt`).
        overwrite (bool): ``--overwrite``: replace ``out`` when it exists. Default: ``False`` (refuse).
        source (str, optional): ``--source NAME``: of a mix of data sets, the source whose split is embedded,
            or whose columns and prompts read ``input_path``. Default: ``None`` (every source's split).
        trust_checkpoint (bool): Skip the safety check of the file. Default: ``False``.

    Returns:
        Path: The file written.

    Raises:
        OutputError: If ``out`` is a directory, under a file or exists without ``overwrite`` (before
            anything is loaded), or writing it fails (a full disk; nothing is left behind).
        ConfigError: If ``split`` and ``input_path`` are both given, ``column`` comes without
            ``input_path`` or names a column the file does not have, or the input is bad (one line naming it).
    """
    import numpy as np

    from composer_dynsample.cli import inputs
    from composer_dynsample.models.embed import embed_store

    split = inputs.check_embed_source(
        split, input_path, column, prompt if prompt_name is None else prompt_name
    )
    path = _out_path(out, "embeddings.npz", ".npz", overwrite=overwrite)
    cfg, directory = _prepare_model_run(config, checkpoint, overrides, trust_checkpoint)
    if input_path is not None or source is not None:  # a mix: --source NAME's columns, prompts and splits
        cfg = one_source(cfg, source, "embed --input")
    given = inputs.embed_prompt(cfg, prompt, prompt_name)
    run = build_model_only(cfg, checkpoint) if input_path is not None else None
    run = run or _build_model_run(cfg, directory)  # a split, or a tokenizer only the training data gives
    if input_path is not None:
        try:
            store, arrays = inputs.read_embed_input(
                input_path, run.splits, column, given, passage_tokenizer_of(cfg)
            )
        except ValueError as error:
            raise ConfigError(str(error)) from error
        what = str(input_path) if column is None else f"column {column!r} of {input_path}"
    else:
        store = run.splits.test if split == "test" else run.splits.train
        arrays, what = inputs.split_arrays(store), f"{split} split of {run.splits.name}"
    embeddings = embed_store(run.model, store, batch_size=run.batch_sizes[1]).cpu()
    if is_rank_zero():
        with written_whole(path) as temporary, open(temporary, "wb") as handle:
            np.savez(handle, embeddings=embeddings.numpy().astype(np.float32), **arrays)
        print(f"wrote {tuple(embeddings.shape)} embeddings of the {what} to {path}")
    return path


@contextlib.contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """The file to write ``path``'s contents into: one beside it, renamed to ``path`` when the block ends
    without an error and removed in any case, so ``path`` is whole or untouched (``embed``, ``mine``).

    Raises:
        OutputError: If the file cannot be written (a full disk): nothing is left at ``path`` or beside it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield temporary
        os.replace(temporary, path)
    except OSError as error:
        raise OutputError(
            f"--out {str(path)!r}: could not be written ({error.strerror or error}); nothing was written: free "
            "space there or choose another folder."
        ) from error
    finally:
        temporary.unlink(missing_ok=True)
