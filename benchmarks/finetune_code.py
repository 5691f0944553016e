"""Fine-tuning a pretrained encoder on code search: this project beside sentence-transformers, with and
without hard negatives mined by a model.

all-MiniLM-L6-v2 (the ``bench`` extra: ``benchmarks/_pretrained.py``; it saw CodeSearchNet pairs in its
pre-training, so its absolute scores on Python code flatter it, while recipes from the same start compare
fairly) is fine-tuned on pairs of the code-search corpus (:mod:`composer_dynsample.data.text.code_search`: a
docstring's first paragraph and its function's code) from the training packages, and tested on queries
of packages never seen in training. Every recipe has the same start, seeds, steps, batch of pairs,
``max_length``, learning rate and schedule (AdamW at 2e-5, linear warm-up over 10% of the steps, linear
decay to zero), threads and precision (float32):

- **zero-shot**: the starting model (``composer-dynsample eval`` without a checkpoint);
- **BM25** (``bm25s`` on identifier tokens, as ``quality_code.py``);
- **sentence-transformers, in-batch**: its ``SentenceTransformerTrainer`` with
  ``MultipleNegativesRankingLoss`` (scale 20) and its no-duplicates batch sampler;
- **sentence-transformers, mined**: one negative per query from ``mine_hard_negatives`` with the base
  model (ranks 0 to 50, ``relative_margin=0.05``, as its documentation shows), mined once, then the same
  trainer and loss on the triplets;
- **this project, in-batch**: ``yamls/finetune_code_search.yaml`` (InfoNCE at temperature 0.05 over the
  batch pool);
- **this project, offline**: one mined negative per query from the warm embedding table, mined once
  (``sampler.max_snapshots=1``) and then fixed;
- **this project, online**: the same from the warm table, the negatives refreshed from the table the
  forward pass keeps fresh every ``--refresh-every`` steps.

Every trained model is scored by the same code (``composer-dynsample eval`` of its folder, or the final
evaluation of ``train``): CodeSearchNet's MRR (each query against its own code and 999 others) and, against
the whole test corpus, MRR@10, Recall@1/10 and nDCG@10. Each run is its own process; its seconds per step
and peak RSS (``ru_maxrss`` of that process, loading included) are recorded beside the scores. A
difference counts only beyond two standard errors over seeds.

    python benchmarks/finetune_code.py [--quick] [--device cpu|cuda] [--seeds 0 1 2] [--threads 2]
        [--train-pairs 3000] [--test-queries 1000] [--steps 60] [--batch 16] [--recipes NAME ...] [--merge]
        [--name finetune_code] [--report]

Writes ``results/NAME.{json,md,png}`` (``finetune_code`` unless ``--name``) with the ``recipes -> runs`` layout of
``quality_code.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import machine_info, markdown_table, merged_recipes, save_figure, write_results
from _common import parser as make_parser
from _pretrained import minilm_folder
from quality_code import bm25

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "yamls" / "finetune_code_search.yaml"
METRICS = ("csn_mrr", "mrr@10", "recall@1", "recall@10", "ndcg@10")
HEADERS = ("CSN MRR", "MRR@10", "Recall@1", "Recall@10", "nDCG@10")
ZERO_SHOT, BM25 = "zero-shot (all-MiniLM-L6-v2)", "BM25 (bm25s, identifier tokens)"
ST_IN_BATCH, ST_MINED = "sentence-transformers, in-batch (MNRL)", "sentence-transformers, mined once (MNRL)"
OURS_IN_BATCH = "this project, in-batch (InfoNCE)"
OURS_OFFLINE = "this project, mined once from the warm table"
OURS_ONLINE = "this project, mined online (warm table, refreshed)"
TRAINED = (ST_IN_BATCH, ST_MINED, OURS_IN_BATCH, OURS_OFFLINE, OURS_ONLINE)


def _mined_sampler(args: Any, offline: bool) -> list[str]:
    sampler = (
        f"sampler={{name: mined_negatives, pairs_per_batch: {args.batch}, negatives_per_anchor: 1, "
        f"window: {args.window}, max_relative_similarity: null"
        + (", max_snapshots: 1}" if offline else f", refresh_every: {args.refresh_every}}}")
    )
    return [sampler, "algorithms.embedding_table={warm_start: true}"]


def ours_overrides(recipe: str, args: Any) -> list[str]:
    """The overrides of ``yamls/finetune_code_search.yaml`` for one of this project's recipes."""
    if recipe == OURS_IN_BATCH:
        return [f"sampler.classes_per_batch={args.batch}"]
    return _mined_sampler(args, offline=recipe == OURS_OFFLINE)


# ------------------------------------------------------------------------------------------------ data
def prepare_data(folder: Path, train_pairs: int, test_queries: int, quick: bool) -> dict[str, Any]:
    """A seeded subset of the corpus's training pairs and of its test pairs, written as JSON Lines."""
    import numpy as np

    from composer_dynsample.data.text.code_search import build_code_search

    corpus = build_code_search(**({"max_pairs_per_group": 20} if quick else {}))
    rng = np.random.default_rng(0)
    written = {}
    for split, path, count in (
        ("train", corpus.train_path, train_pairs),
        ("test", corpus.test_path, test_queries),
    ):
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        chosen = sorted(rng.permutation(len(rows))[: min(count, len(rows))].tolist())
        target = folder / f"{split}.jsonl"
        target.write_text(
            "".join(
                json.dumps({"anchor": rows[i]["anchor"], "positive": rows[i]["positive"]}) + "\n"
                for i in chosen
            )
        )
        written[split] = {"path": str(target), "pairs": len(chosen), "of": len(rows)}
    written["corpus_sha256"] = corpus.manifest["sha256"]
    return written


def data_override(data: dict[str, Any], max_length: int) -> str:
    return (
        f"data={{name: pairs, path: {data['train']['path']}, test_path: {data['test']['path']}, "
        f"max_length: {max_length}, cache_dir: {Path(data['train']['path']).parent / 'cache'}}}"
    )


# ---------------------------------------------------------------------------------- processes, measured
def run_measured(command: list[str], threads: int, log: Path) -> tuple[float, int]:
    """Run ``command`` in its own process: ``(wall seconds, peak RSS in KiB of that process)``."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    start = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        sys.stderr.write(log.read_text()[-4000:])
        raise RuntimeError(f"{' '.join(command[:6])} ... failed with exit code {process.returncode}")
    return seconds, int(usage.ru_maxrss)


def _cli(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "composer_dynsample", *arguments]


def evaluate_folder(model: Path, data: dict, args: Any, out: Path) -> dict[str, Any]:
    """``composer-dynsample eval`` of a model folder as it is (no checkpoint): its metrics."""
    overrides = [
        f"model.encoder.path={model}",
        data_override(data, args.max_length),
        f"evaluation.batch_size={args.eval_batch}",
        f"evaluation.gallery_batch_size={args.eval_batch}",
    ]
    run_measured(
        _cli("eval", str(CONFIG), *overrides, "--out", str(out)), args.threads, out.with_suffix(".log")
    )
    return json.loads(out.read_text())


def _scores(metrics: dict[str, Any]) -> dict[str, float]:
    return {name: metrics[name.replace("@", "_at_")] for name in METRICS}


def run_ours(recipe: str, seed: int, model: Path, data: dict, args: Any, work: Path) -> dict[str, Any]:
    """One ``composer-dynsample train`` of this project's recipe: scores, time per step, peak RSS."""
    run_dir = work / f"ours-{TRAINED.index(recipe)}-{seed}"
    overrides = [
        f"seed={seed}", f"model.encoder.path={model}", data_override(data, args.max_length),
        f"trainer.max_duration={args.steps}ba", f"trainer.save_interval={args.steps}ba",
        "trainer.progress_bar=false", f"evaluation.batch_size={args.eval_batch}",
        f"evaluation.gallery_batch_size={args.eval_batch}", "evaluation.at_start=false",
        *([f"trainer.device={args.device}"] if args.device != "cpu" else []),
        *ours_overrides(recipe, args),
    ]  # fmt: skip
    seconds, peak_kib = run_measured(
        _cli("train", str(CONFIG), *overrides, "--run-dir", str(run_dir)),
        args.threads,
        work / f"{run_dir.name}.log",
    )
    metrics = json.loads((run_dir / "metrics.json").read_text())
    run = {
        "seed": seed,
        **_scores(metrics),
        "process_s": round(seconds, 1),
        "peak_rss_mib": round(peak_kib / 1024),
    }
    warm = metrics.get("embedding_table_warm_start") or {"seconds": 0.0}
    # The warm start's one encode of the training set is paid once, before the first step: counted apart.
    run["s_per_step"] = round((metrics["wall_time_s"] - warm["seconds"]) / args.steps, 3)
    if "rows_encoded" in warm:
        run["warm_start"] = {"rows_encoded": warm["rows_encoded"], "seconds": round(warm["seconds"], 1)}
        run["once_s"] = run["warm_start"]["seconds"]
    return run


def run_st(
    recipe: str, seed: int, model: Path, data: dict, args: Any, work: Path, mined: Path | None
) -> dict[str, Any]:
    """One sentence-transformers fine-tuning process, then the same evaluation as this project's; a mined
    recipe's ``once_s`` is the one mining of its negatives (one process for every seed)."""
    out = work / f"st-{TRAINED.index(recipe)}-{seed}"
    spec = {
        "model": str(model), "train": str(mined or data["train"]["path"]), "out": str(out), "seed": seed,
        "steps": args.steps, "batch": args.batch, "lr": args.lr, "max_length": args.max_length, "device": args.device,
    }  # fmt: skip
    seconds, peak_kib = run_measured(
        [sys.executable, __file__, "--st-worker", json.dumps(spec)], args.threads, work / f"{out.name}.log"
    )
    timing = json.loads((out / "timing.json").read_text())
    scores = _scores(evaluate_folder(out, data, args, work / f"{out.name}-eval.json"))
    return {
        "seed": seed,
        **scores,
        "process_s": round(seconds, 1),
        "peak_rss_mib": round(peak_kib / 1024),
        "s_per_step": timing["s_per_step"],
        **({"once_s": json.loads(mined.with_suffix(".timing.json").read_text())["mine_s"]} if mined else {}),
    }


def st_worker(spec: dict[str, Any]) -> None:
    """Fine-tune with sentence-transformers' trainer (in this process), save the model and its timing."""
    import datasets
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, losses
    from sentence_transformers.sentence_transformer.training_args import (
        BatchSamplers,
        SentenceTransformerTrainingArguments,
    )

    model = SentenceTransformer(spec["model"], device=spec["device"])
    model.max_seq_length = spec["max_length"]
    rows = [json.loads(line) for line in Path(spec["train"]).read_text().splitlines() if line.strip()]
    arguments = SentenceTransformerTrainingArguments(
        output_dir=str(Path(spec["out"]) / "trainer"), max_steps=spec["steps"], per_device_train_batch_size=spec["batch"],
        learning_rate=spec["lr"], warmup_steps=0.1, lr_scheduler_type="linear", weight_decay=0.01, seed=spec["seed"],
        batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", report_to=[], logging_steps=10**9,
        disable_tqdm=True, use_cpu=spec["device"] == "cpu", dataloader_drop_last=True,
    )  # fmt: skip
    trainer = SentenceTransformerTrainer(
        model=model, args=arguments, train_dataset=datasets.Dataset.from_list(rows),
        loss=losses.MultipleNegativesRankingLoss(model),
    )  # fmt: skip
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    model.save(spec["out"])
    timing = {"s_per_step": round(seconds / spec["steps"], 3), "fit_s": round(seconds, 1)}
    (Path(spec["out"]) / "timing.json").write_text(json.dumps(timing))


def mine_worker(spec: dict[str, Any]) -> None:
    """Mine one negative per query with the base model, as sentence-transformers documents, to JSON Lines."""
    import datasets
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    model = SentenceTransformer(spec["model"], device=spec["device"])
    model.max_seq_length = spec["max_length"]
    rows = [json.loads(line) for line in Path(spec["train"]).read_text().splitlines() if line.strip()]
    start = time.perf_counter()
    mined = mine_hard_negatives(
        datasets.Dataset.from_list(rows), model, range_min=0, range_max=50, relative_margin=0.05,
        num_negatives=1, batch_size=64, verbose=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    Path(spec["out"]).write_text("".join(json.dumps(row) + "\n" for row in mined))
    Path(spec["out"]).with_suffix(".timing.json").write_text(
        json.dumps({"mine_s": round(seconds, 1), "triplets": len(mined), "pairs": len(rows)})
    )


# ------------------------------------------------------------------------------------------- reporting
def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": runs}
    for metric in METRICS:
        values = [run[metric] for run in runs]
        out[metric] = statistics.fmean(values)
        out[f"{metric}_se"] = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    for key in ("s_per_step", "peak_rss_mib", "once_s"):
        if all(key in run for run in runs):
            out[key] = statistics.fmean(run[key] for run in runs)
    return out


def _difference(
    first: dict[str, Any], second: dict[str, Any], metric: str = "csn_mrr"
) -> tuple[float, float]:
    """``(mean of first - mean of second, two standard errors of that difference)``."""
    return first[metric] - second[metric], 2 * math.hypot(first[f"{metric}_se"], second[f"{metric}_se"])


def goals(recipes: dict[str, dict[str, Any]]) -> list[str]:
    """The issue's goals, each a sentence with its figures and whether it is met (differences in CSN MRR)."""
    lines = []
    if ZERO_SHOT in recipes:
        behind = [
            name
            for name in TRAINED
            if name in recipes and recipes[name]["csn_mrr"] <= recipes[ZERO_SHOT]["csn_mrr"]
        ]
        lines.append(
            "Every fine-tuned recipe beats zero-shot: "
            + ("met." if not behind else f"missed by {', '.join(behind)}.")
        )
    pairs = [
        (OURS_OFFLINE, OURS_IN_BATCH, "> 2 SE"), (OURS_ONLINE, OURS_IN_BATCH, "> 2 SE"),
        (ST_MINED, ST_IN_BATCH, "> 2 SE"), (OURS_ONLINE, OURS_OFFLINE, "> 2 SE"),
        (OURS_IN_BATCH, ST_IN_BATCH, "within 2 SE"),
    ]  # fmt: skip
    for first, second, goal in pairs:
        if first in recipes and second in recipes:
            gap, two_se = _difference(recipes[first], recipes[second])
            met = abs(gap) <= two_se if goal == "within 2 SE" else gap > two_se
            lines.append(
                f"{first} - {second}: {gap:+.4f} (2 SE {two_se:.4f}); goal {goal}: {'met' if met else 'missed'}."
            )
    ours, theirs = recipes.get(OURS_IN_BATCH), recipes.get(ST_IN_BATCH)
    if ours and theirs and "s_per_step" in ours and "s_per_step" in theirs:
        time_ratio, rss_ratio = (
            ours["s_per_step"] / theirs["s_per_step"],
            ours["peak_rss_mib"] / theirs["peak_rss_mib"],
        )
        lines.append(
            f"In-batch step, this project / sentence-transformers: {time_ratio:.2f}x the time, {rss_ratio:.2f}x the "
            f"peak RSS (goal <= 1.0x both: {'met' if max(time_ratio, rss_ratio) <= 1 else 'missed'})."
        )
    return lines


def headline_ratio(recipes: dict[str, dict[str, Any]]) -> float | None:
    """The online recipe's CSN MRR over this project's in-batch recipe's."""
    if OURS_ONLINE in recipes and OURS_IN_BATCH in recipes:
        return recipes[OURS_ONLINE]["csn_mrr"] / recipes[OURS_IN_BATCH]["csn_mrr"]
    return None


def table(recipes: dict[str, dict[str, Any]], seeds: list[int], options: dict[str, Any]) -> str:
    rows = []
    for name, result in recipes.items():
        cells = [
            f"{result[m]:.4f} +- {result[m + '_se']:.4f}" if len(result["runs"]) > 1 else f"{result[m]:.4f}"
            for m in METRICS
        ]
        step = f"{result['s_per_step']:.2f}" if "s_per_step" in result else "-"
        rss = f"{result['peak_rss_mib']:.0f}" if "peak_rss_mib" in result else "-"
        once = f"{result['once_s']:.0f}" if "once_s" in result else "-"
        rows.append([name, *cells, step, once, rss])
    text = markdown_table(["recipe", *HEADERS, "s/step", "mining s", "peak RSS MiB"], "lrrrrrrrr", rows)
    return (
        f"Fine-tuning all-MiniLM-L6-v2 on code search (unseen packages): {options['train_pairs']} training "
        f"pairs, {options['steps']} steps of {options['batch']} pairs, {options['test_queries']} test queries, "
        f"max_length {options['max_length']}, {options['threads']} threads, {len(seeds)} seed(s), mean +- "
        f"standard error.\n\n{text}\n\n" + "\n".join(f"- {line}" for line in goals(recipes))
    )


def plot(recipes: dict[str, dict[str, Any]], path: Path) -> None:
    """The dense recipes' CSN MRR, mean +- 2 SE and each seed, on an axis that shows their differences;
    BM25, far below, is named in the title."""
    from matplotlib.figure import Figure

    names = [name for name in recipes if name != BM25]
    figure = Figure(figsize=(8, 0.6 * len(names) + 1.8))
    ax = figure.subplots()
    means = [recipes[n]["csn_mrr"] for n in names]
    errors = [2 * recipes[n]["csn_mrr_se"] for n in names]
    ax.errorbar(means, range(len(names)), xerr=errors, fmt="o", color="tab:blue", capsize=4)
    for row, name in enumerate(names):
        ax.plot([r["csn_mrr"] for r in recipes[name]["runs"]], [row] * len(recipes[name]["runs"]), "k.", ms=4)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel("CodeSearchNet MRR (unseen packages)")
    ax.grid(axis="x", alpha=0.3)
    bm25 = f"; BM25 {recipes[BM25]['csn_mrr']:.3f}" if BM25 in recipes else ""
    ax.set_title(f"fine-tuning all-MiniLM-L6-v2: mean +- 2 SE over seeds, dots = seeds{bm25}", fontsize=9)
    save_figure(figure, path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__, quick_help="one seed, 6 steps of 4 pairs on a small corpus: a smoke test")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-pairs", type=int, default=3000)
    parser.add_argument("--test-queries", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--refresh-every", type=int, default=20)
    parser.add_argument("--eval-batch", type=int, default=32, help="texts per forward pass of every encode")
    parser.add_argument("--recipes", nargs="+", default=None)
    parser.add_argument(
        "--name", default="finetune_code", help="the results' file name (an ablation beside the main table)"
    )
    parser.add_argument("--merge", action="store_true", help="keep the stored recipes this run does not redo")
    parser.add_argument("--report", action="store_true", help="rewrite the table and plot of the stored json")
    args = parser.parse_args(argv)
    if args.report:
        stored = json.loads(
            (args.out / (f"{args.name}_quick.json" if args.quick else f"{args.name}.json")).read_text()
        )
        return _write(argparse.Namespace(**{**vars(args), "merge": False}), stored, stored["seeds"])
    if args.quick:
        args.train_pairs, args.test_queries, args.steps, args.batch, args.refresh_every = 64, 32, 6, 4, 3
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    model = minilm_folder()
    started, recipes = time.time(), {}
    chosen = args.recipes or [ZERO_SHOT, BM25, *TRAINED]
    with tempfile.TemporaryDirectory(prefix="dynsample-finetune-") as scratch:
        work = Path(scratch)
        data = prepare_data(work, args.train_pairs, args.test_queries, args.quick)
        result = {
            "recipes": recipes, "seeds": seeds, "data": data, "st_mining": None, "device": args.device,
            "options": {key: getattr(args, key) for key in ("train_pairs", "test_queries", "steps", "batch", "lr", "max_length", "window", "refresh_every", "threads")},
            "machine": machine_info(torch_threads=False),
        }  # fmt: skip
        if ZERO_SHOT in chosen:
            recipes[ZERO_SHOT] = summarise(
                [{"seed": 0, **_scores(evaluate_folder(model, data, args, work / "zero.json"))}]
            )
        if BM25 in chosen:
            test = [json.loads(line) for line in Path(data["test"]["path"]).read_text().splitlines()]
            recipes[BM25] = summarise([{"seed": 0, **{m: bm25(test)[m] for m in METRICS}}])
        mined = None
        if ST_MINED in chosen:
            mined = work / "st-mined.jsonl"
            spec = {
                "model": str(model),
                "train": data["train"]["path"],
                "out": str(mined),
                "max_length": args.max_length,
                "device": args.device,
            }
            run_measured(
                [sys.executable, __file__, "--mine-worker", json.dumps(spec)], args.threads, work / "mine.log"
            )
            result["st_mining"] = json.loads(mined.with_suffix(".timing.json").read_text())
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in TRAINED if name in chosen}
        for (
            seed
        ) in seeds:  # seed by seed, every recipe in turn: a drift of the machine's load hits them alike
            for recipe in runs:
                if recipe in (ST_IN_BATCH, ST_MINED):
                    runs[recipe].append(
                        run_st(recipe, seed, model, data, args, work, mined if recipe == ST_MINED else None)
                    )
                else:
                    runs[recipe].append(run_ours(recipe, seed, model, data, args, work))
                print(f"{recipe} seed {seed}: CSN MRR {runs[recipe][-1]['csn_mrr']:.4f}", flush=True)
                recipes[recipe] = summarise(runs[recipe])
                result["total_s"] = round(time.time() - started, 1)
                _write(args, result, seeds)  # what is done so far survives an interrupted run
    return _write(args, result, seeds)


def _write(args: Any, result: dict[str, Any], seeds: list[int]) -> dict[str, Any]:
    recipes, stored = result["recipes"], args.out / f"{args.name}.json"
    if args.merge:
        recipes = merged_recipes(stored, recipes, seeds, [ZERO_SHOT, BM25, *TRAINED], keep_others=True)
        if result.get("st_mining") is None and stored.exists():  # the mining of the recipes kept
            result = {**result, "st_mining": json.loads(stored.read_text()).get("st_mining")}
    shown = {**result, "recipes": recipes, "ratio": headline_ratio(recipes), "goals": goals(recipes)}
    return write_results(
        args.out,
        args.name,
        args.quick,
        shown,
        table(recipes, seeds, result["options"]),
        plot=lambda path: plot(recipes, path),
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--st-worker", "--mine-worker"):
        (st_worker if sys.argv[1] == "--st-worker" else mine_worker)(json.loads(sys.argv[2]))
    else:
        main()
