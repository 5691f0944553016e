"""The ``composer-dynsample`` command line: argument parsing only; the work is in :mod:`composer_dynsample.cli.commands`.

Nothing heavy is imported until a command runs, so ``--help``, ``--version`` and config errors answer at
once; every expected error (a config key, a checkpoint, the run directory) ends in one line on stderr
and exit status 2. A training run stopped by ``SIGINT`` or ``SIGTERM`` says in one line where its checkpoint
is and how to resume, with exit status ``128 + signal``.
"""

from __future__ import annotations

# The commands and the config and checkpoint modules (numpy, OmegaConf) are imported in main() once the
# arguments are parsed: --help and --version answer before they load.
import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CLI_PACKAGES", "main", "missing_cli_packages", "one_line_message"]

DESCRIPTION = """\
Model-aware sampling for metric learning on MosaicML Composer.

  composer-dynsample train CONFIG.yaml [key.path=value ...] [--run-dir DIR]
  composer-dynsample eval  CONFIG.yaml [--checkpoint PATH] [key.path=value ...]
  composer-dynsample embed CONFIG.yaml --checkpoint PATH --out FILE.npz [--split test | --input FILE [--column NAME]
      [--prompt TEXT | --prompt-name NAME]] [--overwrite] [--source NAME]
  composer-dynsample export CONFIG.yaml --checkpoint PATH --out DIR [--format sentence-transformers]
  composer-dynsample mine   CONFIG.yaml [--checkpoint PATH] --out TRIPLETS.jsonl [--negatives N] [--overwrite] [--source NAME]
  composer-dynsample convert CONFIG.yaml --to mds OUT [--shard-size 64mb] [--compression zstd] [--source NAME]

eval, embed, export and mine also take --run RUN_DIR instead of CONFIG.yaml --checkpoint PATH: the run
directory's config.yaml and latest checkpoint.

The same commands run on many processes under
  composer -n N -m composer_dynsample train ...   or   torchrun --nproc_per_node N -m composer_dynsample train ...
"""

TRAIN_HELP = """\
Train from CONFIG.yaml (see yamls/) with dotted key.path=value overrides, for example
  composer-dynsample train yamls/mnist1d_default.yaml trainer.max_duration=10ep seed=1
A mapping replaces a whole section: model.loss={_component_: my_losses.MyLoss, scale: 2}.
Writes RUN_DIR/config.yaml, metrics.json and checkpoints/; embeddings.png (the test embeddings' PCA)
for all data but text pairs, retrievals.png for images, tokenizer.json for texts. Resume with
trainer.load_path=RUN_DIR/checkpoints/latest-rank0.pt and a larger trainer.max_duration, or set
trainer.autoresume=true: rerunning the same command then continues from the run's latest checkpoint.
Ctrl-C (or SIGTERM) saves a checkpoint at the batch reached and prints the command that resumes it
(exit status 130, or 143). One train at a time uses a run directory (RUN_DIR/train.lock).
evaluation.at_start=true also scores the starting model before the first step (the training is the
same as without it) and reports it beside the final metrics: a column of the table, "at_start" in
metrics.json; a resumed run does not score it again (it reports what its checkpoint recorded).
The progress bar is off when stdout is not a terminal (or with --quiet) unless the config sets
trainer.progress_bar; without a terminal a plain line shows the step, epoch, loss, steps/s and time
left every tenth of the run or 30 s (callbacks.progress_lines={every_batches: 50} to choose, =null: none).
"""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("composer-dynsample")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _add_common(parser: argparse.ArgumentParser, *, run: bool = False) -> None:
    if run:  # optional: --run RUN_DIR gives the run's config.yaml instead
        parser.add_argument("config", nargs="?", default=None, help="the YAML config (or --run RUN_DIR)")
    else:
        parser.add_argument("config", type=Path, help="the YAML config (see yamls/)")
    parser.add_argument("overrides", nargs="*", help="key.path=value overrides, applied in order")
    parser.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="load a checkpoint without checking that it holds only this project's types (only for files you trust)",
    )


def _checkpoint_command(
    commands: Any, name: str, summary: str, description: str, *, required: bool = True
) -> argparse.ArgumentParser:
    command = commands.add_parser(name, help=summary, description=description)
    _add_common(command, run=True)
    what = "the checkpoint file" if required else "the checkpoint file (default: the model as built)"
    command.add_argument("--checkpoint", type=Path, default=None, help=what)  # or --run: checked in main
    command.add_argument(
        "--run",
        default=None,
        metavar="RUN_DIR",
        help="instead of CONFIG and --checkpoint: the run directory's config.yaml and latest checkpoint",
    )
    command.set_defaults(needs_checkpoint=required)
    return command


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``composer-dynsample``."""
    parser = argparse.ArgumentParser(
        prog="composer-dynsample",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"composer-dynsample {_version()}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="{train,eval,embed,export,mine,convert}"
    )
    _add_train_command(commands)
    _add_eval_command(commands)
    _add_embed_command(commands)
    _add_export_command(commands)
    _add_mine_command(commands)
    _add_convert_command(commands)
    return parser


def _add_train_command(commands: Any) -> None:
    """``train``: the config, its overrides and the run directory's options."""
    train = commands.add_parser(
        "train",
        help="train an embedding model from a YAML config",
        description=TRAIN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_common(train)
    train.add_argument(
        "--run-dir", type=Path, default=None, help="output directory (default: runs/<config name>)"
    )
    train.add_argument("--overwrite", action="store_true", help="replace a previous run in the run directory")
    train.add_argument(
        "--quiet", action="store_true", help="no progress bar, no progress lines and no metrics table"
    )


def _add_eval_command(commands: Any) -> None:
    """``eval``: a checkpoint's metrics, written as json."""
    evaluate = _checkpoint_command(
        commands,
        "eval",
        "retrieval metrics of a saved checkpoint or of the model as built (table and json; a retrievals "
        "plot for image data)",
        "Score CHECKPOINT on the test split as at the end of train: against the train gallery, "
        "leave-one-out among the test items, or, for text pairs, the test queries against the test passages. "
        "Without --checkpoint, score the model the config builds before training (a pretrained folder, or "
        "the random initialisation of its seed: the model train starts from; trainer.load_path and "
        "autoresume are ignored); nothing is trained and no checkpoint folder is made.",
        required=False,
    )
    evaluate.add_argument(
        "--out",
        type=Path,
        default=None,
        help="metrics json (default: RUN_DIR/eval.json beside the checkpoint's folder; without --checkpoint "
        "RUN_DIR/eval-start.json, RUN_DIR the config's run_dir or runs/<config name>); image data also get "
        "a retrievals plot beside it",
    )


def _add_embed_command(commands: Any) -> None:
    """``embed``: a split's (or a file's) embeddings, written as .npz."""
    embed = _checkpoint_command(
        commands,
        "embed",
        "embeddings, labels and indices of a split or a file, from a saved checkpoint, as .npz",
        "Write the embeddings, labels and indices of one split, or of the items of a file, embedded by "
        "CHECKPOINT's model (texts are tokenized with the run's tokenizer).",
    )
    source = embed.add_mutually_exclusive_group()
    source.add_argument(
        "--split", choices=("test", "train"), default=None, help="which split (default: test)"
    )
    source.add_argument(
        "--input",
        type=Path,
        default=None,
        help="embed this instead: a JSONL/CSV/TSV/Parquet file with a 'text' column (or 'anchor' and "
        "'positive') for text data, a folder of images for image data",
    )
    embed.add_argument(
        "--column",
        default=None,
        metavar="NAME",
        help="with --input, embed only this column of the text file, one row per file row in file order "
        "(default: 'text', else 'anchor' and 'positive' interleaved: anchor 0, positive 0, anchor 1, ...)",
    )
    prompt = embed.add_mutually_exclusive_group()
    prompt.add_argument(
        "--prompt", default=None, metavar="TEXT", help="with --input, put TEXT before every text (default: "
        "each column's prompt of the run, data.prompts; --prompt '' for none)",
    )  # fmt: skip
    prompt.add_argument(
        "--prompt-name", default=None, metavar="NAME", help="with --input, put the model folder's prompt NAME "
        "(config_sentence_transformers.json) before every text, as SentenceTransformer.encode(prompt_name=NAME)",
    )  # fmt: skip
    embed.add_argument(
        "--out", type=Path, required=True, help="the .npz file to write (.npz is appended when missing)"
    )
    embed.add_argument("--overwrite", action="store_true", help="replace OUT when it exists")
    _add_source(embed)


def _add_export_command(commands: Any) -> None:
    """``export``: a text encoder and its tokenizer, written for sentence-transformers or transformers."""
    export = _checkpoint_command(
        commands,
        "export",
        "write a trained text encoder for sentence-transformers or Hugging Face transformers",
        "Write CHECKPOINT's text encoder and the run's tokenizer to a new directory: a sentence-transformers "
        "model (transformer encoders; SentenceTransformer(DIR) embeds as the model does) or Hugging Face files.",
    )
    export.add_argument("--out", type=Path, required=True, help="a new or empty directory")
    export.add_argument(
        "--format",
        choices=("sentence-transformers", "huggingface"),
        default="sentence-transformers",
        help="the directory's format (default: sentence-transformers)",
    )


def _add_mine_command(commands: Any) -> None:
    """``mine``: the hard negatives of a pairs config's mined_negatives sampler, written as JSON Lines."""
    mine = _checkpoint_command(
        commands,
        "mine",
        "write the hard negatives a mined_negatives sampler mines, as anchor/positive/negative JSON Lines",
        "Encode the training pairs with CHECKPOINT's model (without --checkpoint: the model as built) and "
        "search each anchor's nearest passages of other pairs as the config's mined_negatives sampler does "
        "(skip_top, window, max_relative_similarity, absolute_margin, no identical texts); write the first "
        "N kept ones of each anchor, nearest first, one line per anchor and negative.",
        required=False,
    )
    mine.add_argument("--out", type=Path, required=True, help="the JSON Lines file to write")
    mine.add_argument(
        "--negatives",
        type=int,
        default=None,
        metavar="N",
        help="negatives per anchor, at most sampler.window (default: sampler.negatives_per_anchor)",
    )
    mine.add_argument("--overwrite", action="store_true", help="replace OUT when it exists")
    _add_source(mine)


def _add_convert_command(commands: Any) -> None:
    """``convert``: a config's data written as MDS shards (MosaicML Streaming) with their manifest."""
    convert = commands.add_parser(
        "convert",
        help="write a config's data as MosaicML Streaming (MDS) shards, for data: {name: streaming}",
        description="Load CONFIG's data section as train would (tokenized by its tokenizer, split as it splits) "
        "and write each split's rows, in order, as MDS shards in OUT with a manifest (row and label counts, "
        "the per-row arrays the samplers read, hashes). Upload OUT whole; train with "
        "data={name: streaming, remote: URL_OR_OUT, local: CACHE_DIR}. Needs the streaming extra.",
    )
    _add_common(convert)
    convert.add_argument(
        "--to", nargs=2, metavar=("FORMAT", "OUT"), required=True, help="mds and the folder to write"
    )
    convert.add_argument(
        "--shard-size", default="64mb", help="the largest shard before compression (default: 64mb)"
    )
    convert.add_argument(
        "--compression", default="zstd", help="zstd (default), zstd:LEVEL, br, gz, snappy or none"
    )
    convert.add_argument("--overwrite", action="store_true", help="replace OUT when it exists")
    _add_source(convert)


def _add_source(command: Any) -> None:
    """``--source NAME``: of a mix of data sets (``data: {name: mix}``), the one source the command reads."""
    command.add_argument(
        "--source",
        metavar="NAME",
        default=None,
        help="of a mix of data sets (data: {name: mix}), the source to read",
    )


def _one_line_errors(*known: type[BaseException]) -> tuple[type[BaseException], ...]:
    """The errors printed as one line. Evaluated only when an error reaches ``except``, so a module not
    loaded yet (the distributed helpers, which import torch) adds its error class only once it is loaded:
    an error of that class cannot exist before."""
    classes = [*known, FileNotFoundError]
    distributed = sys.modules.get("composer_dynsample.distributed")
    if distributed is not None:
        classes.append(distributed.RankMismatchError)  # ranks built different samplers: every rank says so
    node_rows = sys.modules.get("composer_dynsample.algorithms.embedding_table.node_rows")
    if node_rows is not None:
        classes.append(node_rows.StorageDirError)  # the embedding table's storage_dir cannot hold its file
    streaming = sys.modules.get("composer_dynsample.data.streaming.manifest")
    if streaming is not None:
        classes.append(streaming.StreamingDataError)  # a shard missing, corrupt or not downloadable
    return tuple(classes)


def one_line_message(error: BaseException) -> str:
    """The one line of an error: an error raised in a DataLoader worker arrives with the worker's traceback in
    its message (``Caught ... Original Traceback ...``), whose last line is the error's own."""
    text = str(error).strip()
    if "Original Traceback" not in text:
        return text
    last = text.splitlines()[-1]
    prefix = f"{type(error).__name__}: "
    return last.split(prefix, 1)[1] if prefix in last else last


def one_line_warning(
    message: Any, category: type[Warning], filename: str, lineno: int, line: Any = None
) -> str:
    """``warnings.formatwarning`` while a command runs: a warning of this package's code is one line,
    ``composer-dynsample: warning: ...`` (not its file, line and source line); others as Python prints them.
    Only the printing changes: a warning recorded (``warnings.catch_warnings(record=True)``) is not formatted.
    """
    if f"{os.sep}composer_dynsample{os.sep}" in os.path.abspath(filename):
        return f"composer-dynsample: warning: {message}\n"
    return _PYTHON_FORMAT(message, category, filename, lineno, line)


_PYTHON_FORMAT = warnings.formatwarning


#: What the ``cli`` extra installs, by the module the command line imports: the YAML config, the plots and the
#: bundled MNIST-1D, digits and image data. The plugin (samplers, algorithms, losses) needs none of them.
CLI_PACKAGES = {
    "omegaconf": "omegaconf",
    "yaml": "pyyaml",
    "matplotlib": "matplotlib",
    "mnist1d": "mnist1d",
    "sklearn": "scikit-learn",
    "PIL": "pillow",
}


def missing_cli_packages() -> list[str]:
    """The distributions of the ``cli`` extra that are not installed (none when it is), without importing them."""
    import importlib.util

    return [package for module, package in CLI_PACKAGES.items() if importlib.util.find_spec(module) is None]


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``composer-dynsample`` and ``python -m composer_dynsample``."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    not_overrides = [item for item in extra if "=" not in item or item.startswith("-")]
    if not_overrides:
        parser.error(f"unrecognized arguments: {' '.join(not_overrides)}")
    overrides = [*args.overrides, *extra]
    missing = missing_cli_packages()
    if missing:
        print(
            f"composer-dynsample {args.command}: error: the command line needs the 'cli' extra, which is not "
            f"installed (no {', '.join(missing)}): pip install 'composer-dynsample[cli]'",
            file=sys.stderr,
        )
        raise SystemExit(2)
    from composer_dynsample.cli.user_folders import matplotlib_config_in_cache

    matplotlib_config_in_cache()  # before Composer, which imports matplotlib
    from composer_dynsample.checkpoints import CheckpointError
    from composer_dynsample.cli import commands
    from composer_dynsample.config.components import ConfigError

    previous, warnings.formatwarning = warnings.formatwarning, one_line_warning
    try:
        _run_command(commands, args, overrides)
    except _one_line_errors(
        ConfigError, CheckpointError, commands.RunDirError, commands.OutputError
    ) as error:
        message = one_line_message(error)
        if isinstance(error, CheckpointError) and getattr(args, "run", None) is not None:
            from composer_dynsample.cli.run_dir import checkpoint_note

            message = f"{message} {checkpoint_note(args.run, args.checkpoint)}"  # which file --run took
        print(f"composer-dynsample {args.command}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    except commands.Interrupted as stop:
        print(f"composer-dynsample {args.command}: {stop}", file=sys.stderr)
        raise SystemExit(stop.exit_code) from None
    except KeyboardInterrupt:
        print(
            f"composer-dynsample {args.command}: interrupted; nothing saved since the last checkpoint",
            file=sys.stderr,
        )
        raise SystemExit(130) from None
    finally:
        warnings.formatwarning = previous


def _run_command(commands: Any, args: argparse.Namespace, overrides: list[str]) -> None:
    """Call the function of :mod:`composer_dynsample.cli.commands` that ``args.command`` names."""
    every_command = {"trust_checkpoint": args.trust_checkpoint}  # the keyword each command takes
    if args.command == "convert":
        from composer_dynsample.cli.convert import convert

        fmt, out = args.to
        convert(args.config, overrides, fmt, Path(out), shard_size=args.shard_size,
                compression=args.compression, overwrite=args.overwrite, source=args.source)  # fmt: skip
        return
    if args.command != "train":  # CONFIG [--checkpoint CKPT], or --run RUN_DIR
        from composer_dynsample.cli.run_dir import run_sources

        args.config, args.checkpoint, overrides = run_sources(
            args.command,
            args.config,
            args.checkpoint,
            args.run,
            overrides,
            needs_checkpoint=args.needs_checkpoint,
        )
    if args.command == "train":
        commands.train(
            args.config,
            overrides,
            run_dir=args.run_dir,
            overwrite=args.overwrite,
            quiet=args.quiet,
            **every_command,
        )
    elif args.command == "eval":
        commands.evaluate(args.config, args.checkpoint, overrides, out=args.out, **every_command)
    elif args.command == "embed":
        from composer_dynsample.cli.embed import embed

        embed(
            args.config,
            args.checkpoint,
            args.out,
            overrides,
            split=args.split,
            input_path=args.input,
            column=args.column,
            prompt=args.prompt,
            prompt_name=args.prompt_name,
            overwrite=args.overwrite,
            source=args.source,
            **every_command,
        )
    elif args.command == "mine":
        from composer_dynsample.cli.mine import mine

        mine(args.config, args.checkpoint, args.out, overrides, negatives=args.negatives,
             overwrite=args.overwrite, source=args.source, **every_command)  # fmt: skip
    else:
        from composer_dynsample.cli.export import export

        export(args.config, args.checkpoint, args.out, overrides, export_format=args.format, **every_command)
