"""Code search on packages never seen in training: BM25 against the dense recipes.

CodeSearchNet's task (Husain et al. 2019) on the Python installed here
(:mod:`composer_dynsample.data.text.code_search`): the query is the first paragraph of a public function's
docstring, the answer the function's code without it; the test split holds whole distributions that no
training pair comes from. Scores (:mod:`composer_dynsample.metrics.ranking`) are CodeSearchNet's MRR
(each query against its own code and 999 other test functions, ties counted against the query) and,
against the whole test corpus, MRR@10, Recall@1/10 and nDCG@10.

- **BM25** (``bm25s``, its default k1 = 1.5, b = 0.75) on identifier-split, lower-cased tokens
  (``getItemCount`` and ``get_item_count`` both give ``get item count``): the classic lexical baseline,
  deterministic, no training.
- **Dense recipes** (``yamls/code_search.yaml`` and overrides), each a ``composer-dynsample train``
  process per seed: in-batch InfoNCE, InfoNCE over mined negatives, triplets with semi-hard mining; mean +- standard error over seeds. The transformer recipe
  (``yamls/code_search_transformer.yaml``) runs one seed on a short budget, with its time per step.

A difference counts only beyond two standard errors. Writes ``results/quality_code.{json,md,png}``;
``ratio`` is the best dense recipe's mean CodeSearchNet MRR / BM25's.

    python benchmarks/quality_code.py [--quick] [--seeds 0 1 2] [--threads 1] [--recipes NAME ...] [--merge]
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

from _common import machine_info, markdown_table, merged_recipes, save_figure, write_results
from _common import parser as make_parser
from _quality_runs import run_command

METRICS = ("csn_mrr", "mrr@10", "recall@1", "recall@10", "ndcg@10")
HEADERS = ("CSN MRR", "MRR@10", "Recall@1", "Recall@10", "nDCG@10")
CONFIG = "yamls/code_search.yaml"
TRANSFORMER = "yamls/code_search_transformer.yaml"
RECIPES: dict[str, tuple[str, list[str]]] = {
    "InfoNCE, in-batch negatives": (CONFIG, []),
    "InfoNCE, mined negatives (semi-hard)": (
        CONFIG,
        ["model.loss.negatives=mined", "algorithms.hard_negative_mining.strategy=semi_hard"],
    ),
    "triplets, semi-hard mining": (
        CONFIG,
        [
            "model.loss={name: triplet_margin, margin: 0.2}",
            "algorithms.hard_negative_mining.strategy=semi_hard",
        ],
    ),
}
ONE_SEED = {"transformer (tiny BERT, random init), InfoNCE": (TRANSFORMER, [])}


def identifier_tokens(text: str) -> list[str]:
    """Lower-cased words of ``text`` with identifiers split at ``_``, digits and camelCase humps.

    Example:
        >>> identifier_tokens("def getItemCount(self, max_items=10): HTTPServer")
        ['def', 'get', 'item', 'count', 'self', 'max', 'items', '10', 'http', 'server']
    """
    parts = []
    for word in re.findall(r"[A-Za-z0-9]+", text):
        parts += re.findall(r"[A-Z]+(?=[A-Z][a-z]|\d|\b)|[A-Z]?[a-z]+|[A-Z]+|\d+", word)
    return [part.lower() for part in parts]


def read_pairs(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bm25(test: list[dict], csn_candidates: int = 1000, seed: int = 0) -> dict:
    """BM25's scores of every test query against the test corpus, by the package's ranking metrics."""
    import bm25s
    import numpy as np
    import torch

    from composer_dynsample.metrics.ranking import csn_groups, rank_sums

    start = time.perf_counter()
    retriever = bm25s.BM25()
    retriever.index([identifier_tokens(row["positive"]) for row in test], show_progress=False)
    scores = np.stack([retriever.get_scores(identifier_tokens(row["anchor"])) for row in test])
    labels = torch.arange(len(test))
    sums = rank_sums(
        -torch.from_numpy(scores).double(), labels, labels, recall_ks=(1, 10), mrr_ks=(10,), ndcg_ks=(10,),
        groups=csn_groups(len(test), csn_candidates, seed),
    )  # fmt: skip
    result = {name: (sums[name] / sums["count"]).item() for name in METRICS}
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def run_dense(config: str, overrides: list[str], seed: int, run_dir: Path, threads: int) -> dict:
    """One training process; its test metrics, train time and time per step."""
    metrics, seconds = run_command(config, seed, run_dir, overrides, threads)
    run = {"seed": seed, "process_s": round(seconds, 2), "fit_s": metrics["wall_time_s"]}
    for name in METRICS:
        run[name] = metrics[name.replace("@", "_at_")]  # metrics.json spells mrr@10 as mrr_at_10
    steps = metrics.get("batches") or metrics.get("steps")
    if steps:
        run["s_per_step"] = metrics["wall_time_s"] / steps
    return run


def summarise(runs: list[dict]) -> dict:
    out: dict = {"runs": runs}
    for metric in METRICS:
        values = [run[metric] for run in runs]
        out[metric] = statistics.fmean(values)
        out[f"{metric}_se"] = (statistics.stdev(values) / math.sqrt(len(values))) if len(values) > 1 else 0.0
    out["fit_s_max"] = max(run["fit_s"] for run in runs)
    if all("s_per_step" in run for run in runs):
        out["s_per_step"] = statistics.fmean(run["s_per_step"] for run in runs)
    return out


def table(baseline: dict, recipes: dict, seeds: list[int]) -> str:
    rows = [["BM25 (bm25s, identifier tokens)", *(f"{baseline[m]:.4f}" for m in METRICS), "-", "-"]]
    for name, result in recipes.items():
        cells = [
            f"{result[m]:.4f} +- {result[m + '_se']:.4f}" if len(result["runs"]) > 1 else f"{result[m]:.4f}"
            for m in METRICS
        ]
        step = f"{1000 * result['s_per_step']:.0f}" if "s_per_step" in result else "-"
        rows.append([name, *cells, f"{result['fit_s_max']:.0f}", step])
    text = markdown_table(["recipe", *HEADERS, "max train s", "ms/step"], "lrrrrrrr", rows)
    best = max(recipes, key=lambda name: recipes[name]["csn_mrr"])
    gap = recipes[best]["csn_mrr"] - baseline["csn_mrr"]
    two_se = 2 * recipes[best]["csn_mrr_se"]
    verdict = (
        f"beats BM25 by {gap:.4f}" + (" (beyond 2 SE)" if gap > two_se else " (within 2 SE)")
        if gap > 0
        else f"is behind BM25 by {-gap:.4f}"
    )
    return (
        f"Code search on unseen packages: {len(seeds)} seed(s), mean +- standard error; CSN MRR is "
        f"CodeSearchNet's (the query's code among 1000 test functions), the rest against the whole test "
        f"corpus.\n\n{text}\n\nBest dense recipe by CSN MRR: **{best}**, which {verdict}."
    )


def plot(baseline: dict, recipes: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 0.6 * len(recipes) + 1.8))
    ax = figure.subplots()
    names = list(recipes)
    means = [recipes[n]["csn_mrr"] for n in names]
    errors = [2 * recipes[n]["csn_mrr_se"] for n in names]
    ax.barh(range(len(names)), means, xerr=errors, color="tab:blue", alpha=0.7, capsize=3)
    for row, name in enumerate(names):
        ax.plot([r["csn_mrr"] for r in recipes[name]["runs"]], [row] * len(recipes[name]["runs"]), "k.", ms=4)
    ax.axvline(baseline["csn_mrr"], color="tab:red", ls="--", label=f"BM25 {baseline['csn_mrr']:.3f}")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel("CodeSearchNet MRR (unseen packages)")
    ax.legend(fontsize=8)
    ax.set_title("code search: mean +- 2 SE over seeds, dots = seeds", fontsize=9)
    save_figure(figure, path)


def code_search_record(
    baseline: dict, recipes: dict, seeds: list[int], corpus, threads: int, started: float
) -> dict:
    """What a code-search comparison records beside its ratio: BM25, recipes, corpus and machine."""
    return {
        "bm25": baseline,
        "recipes": recipes,
        "seeds": seeds,
        "corpus": {key: corpus.manifest[key] for key in ("pairs", "sha256", "distributions")},
        "threads": threads,
        "machine": machine_info(torch_threads=False),
        "total_s": round(time.time() - started, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__, quick_help="one seed, 1 epoch on a small corpus: a smoke test")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run")
    parser.add_argument("--recipes", nargs="+", default=None, help="run only these recipe names")
    parser.add_argument("--merge", action="store_true", help="keep the stored recipes this run does not redo")
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    quick = ["trainer.max_duration=1ep", "data.max_pairs_per_group=20"] if args.quick else []
    from composer_dynsample.data.text.code_search import build_code_search

    corpus = build_code_search(**({"max_pairs_per_group": 20} if args.quick else {}))
    baseline = bm25(read_pairs(corpus.test_path))
    print(f"BM25: CSN MRR {baseline['csn_mrr']:.4f}  MRR@10 {baseline['mrr@10']:.4f}", flush=True)
    every = {**RECIPES, **ONE_SEED}
    chosen = {name: every[name] for name in (args.recipes or every)}
    started, recipes = time.time(), {}
    with tempfile.TemporaryDirectory(prefix="dynsample-code-") as work:
        for number, (name, (config, overrides)) in enumerate(chosen.items()):
            runs = []
            for seed in seeds if name in RECIPES else seeds[:1]:
                run_dir = Path(work) / f"recipe{number}" / f"seed{seed}"
                run = run_dense(config, [*overrides, *quick], seed, run_dir, args.threads)
                print(
                    f"{name:<44} seed {seed}: CSN MRR {run['csn_mrr']:.4f}  train {run['fit_s']:.0f} s",
                    flush=True,
                )
                runs.append(run)
            recipes[name] = summarise(runs)
    if args.merge:
        recipes = merged_recipes(args.out / "quality_code.json", recipes, seeds, (*RECIPES, *ONE_SEED))
    text = table(baseline, recipes, seeds)
    print(f"\n{text}")
    best = max(recipes, key=lambda name: recipes[name]["csn_mrr"])
    result = {
        "ratio": recipes[best]["csn_mrr"] / baseline["csn_mrr"],
        "ratio_meaning": "best dense recipe's mean CodeSearchNet MRR / BM25's, unseen packages",
        **code_search_record(baseline, recipes, seeds, corpus, args.threads, started),
    }
    return write_results(
        args.out, "quality_code", args.quick, result, text, plot=lambda path: plot(baseline, recipes, path)
    )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    main()
