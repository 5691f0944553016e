"""Every default of sentence-transformers' trainer beside this project's recipe, measured one at a time on
every corpus the harness builds: which differences explain the in-batch gap, and which to adopt.

The harness's sentence-transformers run (``_finetune_workers.st_worker``) is its ``SentenceTransformerTrainer``
with ``MultipleNegativesRankingLoss``; this project's is ``yamls/finetune_code_search.yaml``. Where the two
differ (benchmarks/README.md, "The defaults side by side"), a variant of this project's in-batch recipe takes
sentence-transformers' value for that one default. The recipe it changes is pinned (``_PLAIN``: no gradient
clipping, NT-Xent over every row of the batch), as it was before this comparison: the YAML has since taken
clipping and the ``symmetric`` loss, and each variant's overrides say all it changes, so a stored result is
rebuilt by its command whatever the YAML holds.

- ``clip``: gradient clipping at norm 1.0 (Hugging Face's ``max_grad_norm``), Composer's ``GradientClipping``;
- ``passages``: the loss in one direction, each query against the batch's passages
  (``model.loss.negatives=passages``: ``MultipleNegativesRankingLoss``), instead of NT-Xent over every row;
- ``st_defaults``: both;
- ``symmetric``: with clipping, not a default of the harness's run but sentence-transformers' other in-batch
  loss, ``MultipleNegativesSymmetricRankingLoss``: the one-way loss and its reverse (each passage against the
  batch's queries), averaged, as CLIP trains (``negatives=passages`` with ``symmetric=true``);
- ``miner``: repeated texts masked by their text alone, through a batch-hard miner whose dropped triplets
  take their anchors' positives (the recipe before text groups; it differs only on corpora with repeats);
- ``mined``: not a default but the other half of the comparison: both tools' mined-once recipes (hard negatives
  mined once from the starting model: sentence-transformers' ``mine_hard_negatives``, this project's warm
  table), at each tool's defaults (ours with clipping); ``mined_symmetric``: this project's mined-once recipe
  with ``symmetric``'s clipping and loss (the YAML's recipe now); ``mined_passages``: it with the one-way loss
  (the loss of sentence-transformers' mined recipe, and of ``st_defaults``).

Each (corpus, variant) is one ``finetune_code.py`` run of 3 seeds (the CPU size: 3,000 training pairs, 60
steps of 16), stored as ``results/ablations/finetune_defaults/CORPUS_VARIANT.json`` and run only where that
file is missing (``--redo`` runs it again); ``base`` holds both tools' plain in-batch recipes. The gathered
table goes to ``results/ablations/finetune_defaults/finetune_defaults.{json,md}``: each variant's CSN MRR and
its difference from this project's plain recipe and from sentence-transformers, with two standard errors.

    python benchmarks/finetune_defaults.py [--corpora code code:1 docstring] [--variants NAME ...]
        [--seeds 0 1 2] [--redo] [--keep-st] [--report] [--quick]
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import _finetune_report as report
from _common import RESULTS, ablation_folder, markdown_table, write_results
from _common import parser as make_parser

HERE = Path(__file__).resolve().parent
NAME = "finetune_defaults"
FOLDER = ablation_folder(RESULTS, NAME)
_CLIP = "algorithms.gradient_clipping={clipping_type: norm, clipping_threshold: 1.0}"
_PASSAGES = "model.loss.negatives=passages"
_SYMMETRIC = (_PASSAGES, "model.loss.symmetric=true")
#: The recipe the variants change, pinned whatever ``yamls/finetune_code_search.yaml`` has since adopted: no
#: gradient clipping, NT-Xent over every row of the batch (the recipe before this comparison).
_PLAIN = ("algorithms.gradient_clipping=null", "model.loss.negatives=pool", "model.loss.symmetric=false")
#: variant -> (what it changes, its overrides of the recipe: ``_PLAIN`` and the variant's own values).
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "base": ("both tools' in-batch recipes as they are", _PLAIN),
    "clip": ("gradient clipping at norm 1.0", (*_PLAIN, _CLIP)),
    "passages": ("the loss one way: queries against passages (MNRL)", (*_PLAIN, _PASSAGES)),
    "st_defaults": ("clipping and the one-way loss (both defaults)", (*_PLAIN, _CLIP, _PASSAGES)),
    "symmetric": (
        "clipping and the loss both ways between queries and passages (MultipleNegativesSymmetricRankingLoss)",
        (*_PLAIN, _CLIP, *_SYMMETRIC),
    ),
    "miner": (
        "repeats masked by text only, through a batch-hard miner (the recipe before text groups)",
        (
            *_PLAIN,
            "algorithms.hard_negative_mining={strategy: batch_hard, duplicate_key: text_hash}",
            "model.duplicate_key=null",
        ),
    ),
    "mined": ("both tools mined once (ours with clipping)", (*_PLAIN, _CLIP)),
    "mined_symmetric": (
        "mined once, clipping and the loss both ways between queries and passages",
        (*_PLAIN, _CLIP, *_SYMMETRIC),
    ),
    "mined_passages": (
        "mined once, clipping and the loss one way, queries against passages (sentence-transformers' mined loss)",
        (*_PLAIN, _CLIP, _PASSAGES),
    ),
}
#: variant -> the recipes its run trains (default: this project's in-batch one, and sentence-transformers'
#: in-batch one with ``base``).
VARIANT_RECIPES = {
    "mined": (report.OURS_OFFLINE, report.ST_MINED),
    "mined_symmetric": (report.OURS_OFFLINE,),
    "mined_passages": (report.OURS_OFFLINE,),
}
#: ``--corpora`` entries: ``CORPUS`` or ``CORPUS:SPLIT_SEED`` of ``benchmarks/_corpora.py``.
CORPORA = ("docstring", "code:1", "code")


def stem(corpus: str, variant: str) -> str:
    return f"{corpus.replace(':', '_split')}_{variant}"


def run(corpus: str, variant: str, seeds: list[int], quick: bool, keep_st: bool = False) -> None:
    name, split = [*corpus.split(":"), "0"][:2]
    with_st = variant == "base" and not keep_st
    recipes = list(
        VARIANT_RECIPES.get(variant, [report.OURS_IN_BATCH] + ([report.ST_IN_BATCH] if with_st else []))
    )
    command = [
        sys.executable, str(HERE / "finetune_code.py"), "--corpus", name, "--split-seed", split,
        "--recipes", *recipes, "--seeds", *map(str, seeds), "--name", stem(corpus, variant), "--out", str(FOLDER),
        *(["--quick"] if quick else []), *(["--merge"] if variant == "base" and keep_st else []),
    ]  # fmt: skip
    overrides = VARIANTS[variant][1]
    if overrides:
        command += ["--override", *overrides]
    print(f"{stem(corpus, variant)}: {' '.join(command[2:])}", flush=True)
    subprocess.run(command, check=True)


def _mrr(stored: dict[str, Any], recipe: str) -> tuple[float, float, int] | None:
    found = stored["recipes"].get(recipe)
    if not found:
        return None
    return found["csn_mrr"], found.get("csn_mrr_se", 0.0), len(found["runs"])


def _by_seed(stored: dict[str, Any], recipe: str) -> dict[int, float]:
    return {run["seed"]: run["csn_mrr"] for run in stored["recipes"].get(recipe, {}).get("runs", [])}


def _paired(a: dict[int, float], b: dict[int, float]) -> str:
    """The mean of the per-seed differences ``a - b`` +- two standard errors of them: a variant of this project's
    recipe trains on the same batches in the same order as the plain recipe of the same seed."""
    seeds = sorted(a.keys() & b.keys())
    if len(seeds) < 2:
        return "-"
    differences = [a[seed] - b[seed] for seed in seeds]
    mean = sum(differences) / len(differences)
    se = math.sqrt(sum((d - mean) ** 2 for d in differences) / (len(differences) - 1) / len(differences))
    return f"{mean:+.4f} +- {2 * se:.4f}"


def gather(corpora: list[str], quick: bool) -> tuple[dict[str, Any], str]:
    suffix = "_quick" if quick else ""
    rows, table = {}, []
    for corpus in corpora:
        base_path = FOLDER / f"{stem(corpus, 'base')}{suffix}.json"
        if not base_path.exists():
            continue
        base = json.loads(base_path.read_text())
        st = _mrr(base, report.ST_IN_BATCH)
        data = base["data"]
        rows[corpus] = {
            "sentence-transformers": st,
            "corpus_sha256": data.get("corpus_sha256"),
            "variants": {},
        }
        table.append([corpus, "sentence-transformers, in-batch (MNRL)", _cell(st), "", ""])
        for variant, (change, _) in VARIANTS.items():
            path = FOLDER / f"{stem(corpus, variant)}{suffix}.json"
            if not path.exists():
                continue
            stored = json.loads(path.read_text())
            if variant in VARIANT_RECIPES:
                mined = FOLDER / f"{stem(corpus, 'mined')}{suffix}.json"
                against = json.loads(mined.read_text()) if mined.exists() else None
                table += _own_rows(corpus, variant, stored, rows[corpus]["variants"], against)
                continue
            mine = _mrr(stored, report.OURS_IN_BATCH)
            if mine is None:
                continue
            rows[corpus]["variants"][variant] = mine
            label = "this project, in-batch" + ("" if variant == "base" else f" + {change}")
            paired = _paired(_by_seed(stored, report.OURS_IN_BATCH), _by_seed(base, report.OURS_IN_BATCH))
            table.append([corpus, label, _cell(mine), paired if variant != "base" else "", _diff(mine, st)])
    header = ("corpus", "recipe", "CSN MRR", "- ours plain, paired by seed", "- sentence-transformers")
    text = (
        "Fine-tuning of all-MiniLM-L6-v2, 3,000 pairs, 60 steps of 16, CPU; mean +- standard error over "
        "seeds (their number in brackets); a difference +- its two standard errors. A variant of this project's "
        "recipe trains on the batches of the plain recipe of the same seed, in the same order: its difference is "
        "taken seed by seed. The mined-once rows compare the two tools' mined recipes with each other.\n\n"
        + markdown_table(header, "llrrr", table)
    )
    return {"corpora": rows}, text


def _own_rows(
    corpus: str, variant: str, stored: dict[str, Any], into: dict[str, Any], mined: dict[str, Any] | None
) -> list[list[str]]:
    """The rows of a variant that trains recipes of its own: ``mined``, sentence-transformers' first, then this
    project's with its difference from it; a variant of this project's mined recipe alone
    (``mined_symmetric``), against the ``mined`` run's two recipes (``mined``, the same seeds' batches)."""
    if len(VARIANT_RECIPES[variant]) == 1:
        (ours_name,) = VARIANT_RECIPES[variant]
        ours = into[variant] = _mrr(stored, ours_name)
        st = None if mined is None else _mrr(mined, report.ST_MINED)
        paired = "-" if mined is None else _paired(_by_seed(stored, ours_name), _by_seed(mined, ours_name))
        label = f"this project, {VARIANTS[variant][0]}"
        return [[corpus, label, _cell(ours), f"{paired} (against mined once)", _diff(ours, st)]]
    ours_name, st_name = VARIANT_RECIPES[variant]
    ours, st = _mrr(stored, ours_name), _mrr(stored, st_name)
    into[variant] = ours
    into[f"{variant} (sentence-transformers)"] = st
    return [
        [corpus, st_name, _cell(st), "", ""],
        [corpus, ours_name, _cell(ours), "", _diff(ours, st)],
    ]


def _cell(value: tuple[float, float, int] | None) -> str:
    return "-" if value is None else f"{value[0]:.4f} +- {value[1]:.4f} ({value[2]})"


def _diff(a: tuple[float, float, int] | None, b: tuple[float, float, int] | None) -> str:
    if a is None or b is None:
        return "-"
    return f"{a[0] - b[0]:+.4f} +- {2 * math.hypot(a[1], b[1]):.4f}"


def main(argv: list[str] | None = None) -> None:
    parser = make_parser(__doc__, quick_help="one seed, a few steps of a few pairs: a smoke test")
    parser.add_argument("--corpora", nargs="+", default=list(CORPORA))
    parser.add_argument("--variants", nargs="+", choices=tuple(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--redo", action="store_true")
    parser.add_argument(
        "--keep-st",
        action="store_true",
        help="base: keep the stored sentence-transformers runs and redo this project's (after a recipe change)",
    )
    parser.add_argument("--report", action="store_true", help="only gather the stored runs")
    args = parser.parse_args(argv)
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    if not args.report:
        for corpus in args.corpora:
            for variant in args.variants:
                done = FOLDER / f"{stem(corpus, variant)}{'_quick' if args.quick else ''}.json"
                if args.redo or args.keep_st or not done.exists():
                    run(corpus, variant, seeds, args.quick, keep_st=args.keep_st)
    # Every corpus with stored runs, not only those run now: the gathered table is the whole comparison.
    result, text = gather(
        [*CORPORA, *(corpus for corpus in args.corpora if corpus not in CORPORA)], args.quick
    )
    write_results(FOLDER, NAME, args.quick, result, text)
    print(text)


if __name__ == "__main__":
    main()
