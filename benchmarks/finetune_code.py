"""Fine-tuning a pretrained encoder on code search: this project beside sentence-transformers, with and
without hard negatives mined by a model.

all-MiniLM-L6-v2 (the ``bench`` extra: ``benchmarks/_pretrained.py``, or ``--model DIR``; it saw CodeSearchNet
pairs in its pre-training, so its absolute scores on Python code flatter it, while recipes from the same start
compare fairly) is fine-tuned on pairs of the code-search corpus (:mod:`composer_dynsample.data.text.code_search`:
a docstring's first paragraph and its function's code) from the training packages, and tested on queries
of packages never seen in training. Every recipe has the same start, seeds, steps, batch of pairs,
``max_length``, learning rate and schedule (AdamW at 2e-5, linear warm-up over 10% of the steps, linear
decay to zero), threads, device and precision:

- **zero-shot**: the starting model (``composer-dynsample eval`` without a checkpoint);
- **BM25** (``bm25s`` on identifier tokens, as ``quality_code.py``);
- **sentence-transformers, in-batch**: its ``SentenceTransformerTrainer`` with
  ``MultipleNegativesRankingLoss`` (scale 20) and its no-duplicates batch sampler;
- **sentence-transformers, mined**: one negative per query from ``mine_hard_negatives`` with the base
  model (ranks 0 to 50, ``relative_margin=0.05``, as its documentation shows), mined once, then the same
  trainer and loss on the triplets;
- **this project, in-batch**: ``yamls/finetune_code_search.yaml`` (InfoNCE at temperature 0.05 both ways
  between the batch's queries and passages, gradients clipped at norm 1.0);
- **this project, offline**: one mined negative per query from the warm embedding table, mined once
  (``sampler.max_snapshots=1``) and then fixed;
- **this project, online**: the same from the warm table, the negatives refreshed from the table the
  forward pass keeps fresh every ``--refresh-every`` steps.

Every trained model is scored by the same code (``composer-dynsample eval`` of its folder, or the final
evaluation of ``train``): CodeSearchNet's MRR (each query against its own code and 999 others) and, against
the whole test corpus, MRR@10, Recall@1/10 and nDCG@10; a run evaluated at Matryoshka dimensions (``--override
evaluation.matryoshka_dims=[256,128,64]`` or ``model.loss.matryoshka_dims=...``) also records CSN MRR and MRR@10 at
each (a second table). Seconds per step are those of the fit (no checkpoint is saved) beside the scores. A
difference counts only beyond two standard errors over seeds.

Two sizes (:data:`SIZES`; a flag given overrides its size's value):

- ``--size cpu`` (the stored table): 3,000 training pairs, 60 steps of 16, float32, each run its own process
  (its peak RSS recorded, loading included);
- ``--size gpu`` (with ``--device cuda``): every training pair of the corpus for one epoch (``--epochs N``: N) of 128 pairs a step,
  bf16 autocast (``trainer.precision=amp_bf16``; sentence-transformers' ``bf16=True``), evaluation batches of
  256, 3 seeds, one process per tool (``_finetune_workers.py``: the imports paid once; each run's peak of
  allocated GPU memory recorded), results in ``finetune_code_gpu``. On the CPU it runs in float32.

    python benchmarks/finetune_code.py [--quick] [--size cpu|gpu] [--device cpu|cuda] [--precision fp32|bf16]
        [--model DIR] [--seeds 0 1 2] [--threads 2] [--train-pairs N] [--test-queries N] [--steps N] [--batch N]
        [--eval-batch N] [--epochs N] [--process-per run|tool] [--recipes NAME ...] [--override KEY=VALUE ...] [--merge]
        [--split-seed N] [--name NAME] [--report]

Writes ``results/NAME.{json,md,png}`` (``finetune_code``, ``finetune_code_gpu`` for ``--size gpu``, unless
``--name``) with the ``recipes -> runs`` layout of ``quality_code.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _finetune_report as report
from _common import machine_info, merged_recipes, trainer_overrides, write_results
from _common import parser as make_parser
from _corpora import CORPORA, prepare_data
from _finetune_workers import PROGRESS
from _pretrained import minilm_folder
from quality_code import bm25

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "yamls" / "finetune_code_search.yaml"
WORKERS = Path(__file__).with_name("_finetune_workers.py")
RECIPES = (report.ZERO_SHOT, report.BM25, *report.TRAINED)
#: What ``--size`` sets unless the flag of the same name is given (``None``: every training pair, one epoch,
#: refreshes every third of the steps).
SIZES: dict[str, dict[str, Any]] = {
    "cpu": {"train_pairs": 3000, "test_queries": 1000, "steps": 60, "batch": 16, "refresh_every": 20,
            "eval_batch": 32, "mine_batch": 64, "precision": "fp32", "process_per": "run", "name": "finetune_code"},
    "gpu": {"train_pairs": None, "test_queries": 1000, "steps": None, "batch": 128, "refresh_every": None,
            "eval_batch": 256, "mine_batch": 256, "precision": "bf16", "process_per": "tool",
            "name": "finetune_code_gpu"},
}  # fmt: skip
#: What ``--quick`` sets on top of its size: a smoke test on a small corpus, one seed.
QUICK: dict[str, dict[str, Any]] = {
    "cpu": {"train_pairs": 64, "test_queries": 32, "steps": 6, "batch": 4, "refresh_every": 3},
    "gpu": {"train_pairs": 64, "test_queries": 32, "batch": 8, "eval_batch": 32, "mine_batch": 32},
}
OPTIONS = (
    "size", "device", "precision", "process_per", "train_pairs", "test_queries", "steps", "batch", "lr",
    "max_length", "window", "refresh_every", "eval_batch", "threads", "override", "split_seed", "corpus",
)  # fmt: skip


def _mined_sampler(args: Any, offline: bool) -> list[str]:
    sampler = (
        f"sampler={{name: mined_negatives, pairs_per_batch: {args.batch}, negatives_per_anchor: 1, "
        f"window: {args.window}, max_relative_similarity: null"
        + (", max_snapshots: 1}" if offline else f", refresh_every: {args.refresh_every}}}")
    )
    return [sampler, "algorithms.embedding_table={warm_start: true}"]


def ours_overrides(recipe: str, args: Any) -> list[str]:
    """The overrides of ``yamls/finetune_code_search.yaml`` for one of this project's recipes."""
    if recipe == report.OURS_IN_BATCH:
        return [f"sampler.classes_per_batch={args.batch}"]
    return _mined_sampler(args, offline=recipe == report.OURS_OFFLINE)


# ------------------------------------------------------------------------------------------------ plan
def resolve_size(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Fill every option left unset from ``--quick``'s values, else ``--size``'s; bf16 only on CUDA."""
    chosen_precision = args.precision
    for key, value in {**SIZES[args.size], **(QUICK[args.size] if args.quick else {})}.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if chosen_precision is None and args.device != "cuda":  # the size's bf16 is an autocast on CUDA
        args.precision = "fp32"
    try:
        trainer_overrides(args.device, args.precision)
    except ValueError as error:
        parser.error(f"--precision {args.precision} --device {args.device}: {error}")
    if args.seeds is None:
        args.seeds = [0] if args.quick else [0, 1, 2]
    return args


def one_epoch(args: argparse.Namespace, train_pairs: int) -> None:
    """Set ``--steps`` to ``--epochs`` (default one) of the training pairs and ``--refresh-every`` to a third
    of the steps, where the size leaves them to the data."""
    if args.steps is None:
        args.steps = (train_pairs // args.batch) * (args.epochs or 1)
        if args.steps < 1:
            raise SystemExit(f"--batch {args.batch} is larger than the {train_pairs} training pairs: lower it.")  # fmt: skip
    if args.refresh_every is None:
        args.refresh_every = max(1, args.steps // 3)
    args.train_pairs = train_pairs


# ------------------------------------------------------------------------------------------------ data
def data_override(data: dict[str, Any], max_length: int) -> str:
    return (
        f"data={{name: pairs, path: {data['train']['path']}, test_path: {data['test']['path']}, "
        f"max_length: {max_length}, cache_dir: {Path(data['train']['path']).parent / 'cache'}}}"
    )


# ---------------------------------------------------------------------------------- commands, measured
def run_measured(
    command: list[str], threads: int, log: Path, *, echo: str | None = None
) -> tuple[float, int]:
    """Run ``command`` in its own process: ``(wall seconds, peak RSS in KiB of that process)``. Its output
    goes to ``log``; the lines that start with ``echo`` are printed too, without it."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    start = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in process.stdout or ():
            out.write(line)
            if echo is not None and line.startswith(echo):
                print(line[len(echo) :], end="", flush=True)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        sys.stderr.write(log.read_text()[-4000:])
        raise RuntimeError(f"{' '.join(command[:6])} ... failed with exit code {process.returncode}")
    return seconds, int(usage.ru_maxrss)


def _cli(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "composer_dynsample", *arguments]


def _worker(flag: str, spec: dict[str, Any]) -> list[str]:
    return [sys.executable, str(WORKERS), flag, json.dumps(spec)]


def eval_command(model: Path, data: dict, args: Any, out: Path) -> list[str]:
    """``composer-dynsample eval`` of a model folder as it is (no checkpoint), on ``--device``."""
    overrides = [
        f"model.encoder.path={model}", data_override(data, args.max_length),
        f"evaluation.batch_size={args.eval_batch}", f"evaluation.gallery_batch_size={args.eval_batch}",
        *trainer_overrides(args.device),  # the model is scored in float32 whatever the training's precision
    ]  # fmt: skip
    return _cli("eval", str(CONFIG), *overrides, "--out", str(out))


def ours_command(recipe: str, seed: int, model: Path, data: dict, args: Any, run_dir: Path) -> list[str]:
    """One ``composer-dynsample train`` of this project's recipe."""
    overrides = [
        f"seed={seed}", f"model.encoder.path={model}", data_override(data, args.max_length),
        f"trainer.max_duration={args.steps}ba", "trainer.save_folder=null",
        "trainer.progress_bar=false", f"evaluation.batch_size={args.eval_batch}",
        f"evaluation.gallery_batch_size={args.eval_batch}", "evaluation.at_start=false",
        *trainer_overrides(args.device, args.precision), *ours_overrides(recipe, args),
        *getattr(args, "override", ()),
    ]  # fmt: skip
    return _cli("train", str(CONFIG), *overrides, "--run-dir", str(run_dir))


def st_spec(seed: int, model: Path, train: Path | str, args: Any, out: Path) -> dict[str, Any]:
    """The spec of one sentence-transformers fine-tuning (``_finetune_workers.st_worker``)."""
    return {
        "model": str(model), "train": str(train), "out": str(out), "seed": seed, "steps": args.steps,
        "batch": args.batch, "lr": args.lr, "max_length": args.max_length, "device": args.device,
        "bf16": args.precision == "bf16",
    }  # fmt: skip


@dataclass(frozen=True)
class Job:
    """One command line of the benchmark, named; ``tool`` is the process that runs it with
    ``--process-per tool`` (sentence-transformers' first: this project's evaluates its folders)."""

    name: str
    command: list[str]

    @property
    def tool(self) -> str:
        return "composer" if self.command[1:3] == ["-m", "composer_dynsample"] else "sentence-transformers"


@dataclass(frozen=True)
class Planned:
    """A recipe's run of one seed (or the mining before them): its jobs, and what makes its result of the
    jobs' records (``{name: {"seconds", "peak_rss_mib" or "peak_gpu_mib"}}``)."""

    recipe: str
    seed: int
    jobs: list[Job]
    collect: Callable[[dict[str, dict[str, float]]], dict[str, Any]]


def _cost(record: dict[str, float], process_per: str) -> dict[str, Any]:
    """A run's seconds and peak memory: its process's with ``--process-per run``, else its own."""
    seconds = {"process_s" if process_per == "run" else "run_s": record["seconds"]}
    return {**seconds, **{key: record[key] for key in ("peak_rss_mib", "peak_gpu_mib") if key in record}}


def plan_ours(recipe: str, seed: int, model: Path, data: dict, args: Any, work: Path) -> Planned:
    run_dir = work / f"ours-{report.TRAINED.index(recipe)}-{seed}"

    def collect(records: dict[str, dict[str, float]]) -> dict[str, Any]:
        metrics = json.loads((run_dir / "metrics.json").read_text())
        run = {"seed": seed, **report.scores(metrics), **_cost(records[run_dir.name], args.process_per)}
        warm = metrics.get("embedding_table_warm_start") or {"seconds": 0.0}
        # The warm start's one encode of the training set is paid once, before the first step: counted apart.
        run["s_per_step"] = round((metrics["wall_time_s"] - warm["seconds"]) / args.steps, 3)
        if "rows_encoded" in warm:
            run["warm_start"] = {"rows_encoded": warm["rows_encoded"], "seconds": round(warm["seconds"], 1)}
            run["once_s"] = run["warm_start"]["seconds"]
        if (mining := report.mining_record(metrics)) is not None:
            run["mining"] = mining
        return run

    job = Job(run_dir.name, ours_command(recipe, seed, model, data, args, run_dir))
    return Planned(recipe, seed, [job], collect)


def plan_st(
    recipe: str, seed: int, model: Path, data: dict, args: Any, work: Path, mined: Path | None
) -> Planned:
    """A sentence-transformers fine-tuning, then the same evaluation as this project's; a mined recipe's
    ``once_s`` is the one mining of its negatives (one process for every seed)."""
    out = work / f"st-{report.TRAINED.index(recipe)}-{seed}"
    scored = work / f"{out.name}-eval.json"
    spec = st_spec(seed, model, mined or data["train"]["path"], args, out)
    train, evaluate = (
        Job(out.name, _worker("--st-worker", spec)),
        Job(scored.stem, eval_command(out, data, args, scored)),
    )

    def collect(records: dict[str, dict[str, float]]) -> dict[str, Any]:
        run = {
            "seed": seed,
            **report.scores(json.loads(scored.read_text())),
            **_cost(records[out.name], args.process_per),
        }
        run["s_per_step"] = json.loads((out / "timing.json").read_text())["s_per_step"]
        if mined:
            run["once_s"] = json.loads(mined.with_suffix(".timing.json").read_text())["mine_s"]
        return run

    return Planned(recipe, seed, [train, evaluate], collect)


def _bm25(test: Path) -> dict[str, Any]:
    scores = bm25([json.loads(line) for line in test.read_text().splitlines()])
    return {"seed": 0, **{metric: scores[metric] for metric in report.METRICS}}


def plan(chosen: list[str], model: Path, data: dict, args: Any, work: Path) -> list[Planned]:
    """Every job of the benchmark in the order of ``--process-per run``: the zero-shot evaluation, BM25 (no
    job), the mining, then seed by seed every recipe in turn (a drift of the machine's load hits them alike)."""
    planned = []
    if report.ZERO_SHOT in chosen:
        zero = work / "zero.json"
        job = Job("zero-shot", eval_command(model, data, args, zero))
        planned.append(Planned(report.ZERO_SHOT, 0, [job], lambda _: {"seed": 0, **report.scores(json.loads(zero.read_text()))}))  # fmt: skip
    if report.BM25 in chosen:
        planned.append(Planned(report.BM25, 0, [], lambda _: _bm25(Path(data["test"]["path"]))))
    mined = work / "st-mined.jsonl" if report.ST_MINED in chosen else None
    if mined is not None:
        spec = {
            "model": str(model), "train": data["train"]["path"], "out": str(mined), "max_length": args.max_length,
            "device": args.device, "batch_size": args.mine_batch,
        }  # fmt: skip
        timing, job = mined.with_suffix(".timing.json"), Job("st-mining", _worker("--mine-worker", spec))
        planned.append(Planned("mining", 0, [job], lambda _: json.loads(timing.read_text())))
    for seed in args.seeds:
        for recipe in (name for name in report.TRAINED if name in chosen):
            if recipe in (report.ST_IN_BATCH, report.ST_MINED):
                negatives = mined if recipe == report.ST_MINED else None
                planned.append(plan_st(recipe, seed, model, data, args, work, negatives))
            else:
                planned.append(plan_ours(recipe, seed, model, data, args, work))
    return planned


def run_jobs(jobs: list[Job], args: Any, work: Path) -> dict[str, dict[str, float]]:
    """Run ``jobs``, each in its own process (``--process-per run``) or each tool's in one: their records."""
    if args.process_per == "run":
        records = {}
        for job in jobs:
            seconds, peak_kib = run_measured(job.command, args.threads, work / f"{job.name}.log")
            records[job.name] = {"seconds": round(seconds, 1), "peak_rss_mib": round(peak_kib / 1024)}
        return records
    records = {}
    for tool in ("sentence-transformers", "composer"):
        listed = [{"name": job.name, "command": job.command} for job in jobs if job.tool == tool]
        if listed:
            listing, out = work / f"{tool}-commands.json", work / f"{tool}-records.json"
            listing.write_text(json.dumps(listed))
            command = [sys.executable, str(WORKERS), "--commands", str(listing), str(out)]
            run_measured(command, args.threads, work / f"{tool}.log", echo=PROGRESS)
            records.update(json.loads(out.read_text()))
    return records


# ------------------------------------------------------------------------------------------------ main
def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(
        __doc__, quick_help="one seed, a few steps of a few pairs on a small corpus: a smoke test"
    )
    parser.add_argument(
        "--size", choices=tuple(SIZES), default="cpu", help="the defaults of the options below"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--precision", choices=("fp32", "bf16"), default=None, help="bf16: autocast, CUDA only"
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="the starting folder (default: the bench extra's)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument(
        "--split-seed", type=int, default=0, help="the corpus's package split (another: a second corpus)"
    )
    parser.add_argument(
        "--corpus", choices=tuple(CORPORA), default="code", help="which pairs (benchmarks/_corpora.py)"
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="where --steps is left to the data (--size gpu): epochs of it",
    )
    for flag in ("--train-pairs", "--test-queries", "--steps", "--batch", "--refresh-every", "--eval-batch"):
        parser.add_argument(flag, type=int, default=None, help="default: the size's (SIZES)")
    parser.add_argument(
        "--process-per", choices=("run", "tool"), default=None, help="one process a run, or a tool"
    )
    parser.add_argument("--recipes", nargs="+", default=None)
    parser.add_argument("--override", nargs="+", default=[], help="config overrides of this project's runs")
    parser.add_argument("--name", default=None, help="the results' file name (default: the size's)")
    parser.add_argument("--merge", action="store_true", help="keep the stored recipes this run does not redo")
    parser.add_argument("--report", action="store_true", help="rewrite the table and plot of the stored json")
    return parser  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = build_parser()
    args = resolve_size(parser.parse_args(argv), parser)
    if args.report:
        stored = json.loads((args.out / f"{args.name}{'_quick' if args.quick else ''}.json").read_text())
        return _write(argparse.Namespace(**{**vars(args), "merge": False}), stored, stored["seeds"])
    model, started = args.model or minilm_folder(), time.time()
    chosen = args.recipes or list(RECIPES)
    with tempfile.TemporaryDirectory(prefix="dynsample-finetune-") as scratch:
        work = Path(scratch)
        data = prepare_data(
            work, args.train_pairs, args.test_queries, args.quick, args.split_seed, args.corpus
        )
        one_epoch(args, data["train"]["pairs"])
        result = {
            "recipes": {}, "seeds": args.seeds, "data": data, "st_mining": None, "device": args.device,
            **_device_names(args.device), "options": {key: getattr(args, key) for key in OPTIONS},
        }  # fmt: skip
        return run_planned(plan(chosen, model, data, args, work), args, work, result, started)


def run_planned(
    planned: list[Planned], args: Any, work: Path, result: dict[str, Any], started: float
) -> dict[str, Any]:
    """Run the planned jobs, collect each run into ``result`` and write it after each (after all with
    ``--process-per tool``): what is done so far survives an interrupted run. ``started``: ``time.time()``
    at the benchmark's start, for ``total_s``."""
    recipes, runs = result["recipes"], {}
    records = (
        run_jobs([job for item in planned for job in item.jobs], args, work)
        if args.process_per == "tool"
        else {}
    )
    for item in planned:
        if args.process_per == "run":
            records.update(run_jobs(item.jobs, args, work))
        if item.recipe == "mining":
            result["st_mining"] = item.collect(records)
            continue
        runs.setdefault(item.recipe, []).append(item.collect(records))
        recipes[item.recipe] = report.summarise(runs[item.recipe])
        if item.recipe in report.TRAINED:
            run = runs[item.recipe][-1]
            line = f"CSN MRR {run['csn_mrr']:.4f}{report.dims_line(run)}, {run['s_per_step']:.3f} s a step"
            print(f"{item.recipe} seed {item.seed}: {line}")
        result["total_s"] = round(time.time() - started, 1)
        _write(args, result, args.seeds)
    return _write(args, result, args.seeds)


def _device_names(device: str) -> dict[str, str | None]:
    """``{"gpu": name or None, "machine": the machine's line, the GPU's name at its end}``."""
    from _cuda import gpu_name

    name = gpu_name(device)
    return {"gpu": name, "machine": machine_info(torch_threads=False) + (f", {name}" if name else "")}


def _write(args: Any, result: dict[str, Any], seeds: list[int]) -> dict[str, Any]:
    recipes, stored = result["recipes"], args.out / f"{args.name}{'_quick' if args.quick else ''}.json"
    if args.merge:
        recipes = merged_recipes(stored, recipes, seeds, RECIPES, keep_others=True)
        if result.get("st_mining") is None and stored.exists():  # the mining of the recipes kept
            result = {**result, "st_mining": json.loads(stored.read_text()).get("st_mining")}
    options = {**result["options"], "gpu": result.get("gpu")}
    shown = {
        **result,
        "recipes": recipes,
        "ratio": report.headline_ratio(recipes),
        "goals": report.goals(recipes, options),
    }
    return write_results(
        args.out,
        args.name,
        args.quick,
        shown,
        report.table(recipes, seeds, options),
        plot=lambda path: report.plot(recipes, path),
    )


if __name__ == "__main__":
    main()
