"""Host overhead of a training step: this package's whole training path against a bare PyTorch loop.

The subject is what ``composer-dynsample train yamls/finetune_code_search.yaml`` runs, built by the same
code (:func:`~composer_dynsample.config.run.build_run`): the P x K sampler, the index-only dataset and the
text collate, Composer's ``Trainer``, :class:`~composer_dynsample.InfoNCELoss` with the batch's text groups as
duplicate ids (and :class:`~composer_dynsample.HardNegativeMining` with its log interval where a config mines),
the run's callbacks and logging.
The encoder is a null encoder (``bag_of_tokens`` of width 8: an embedding bag), so the arithmetic is
negligible and what is left is the host's work. 128 pairs a batch, 128 tokens a text (synthetic texts of
140 words, truncated by the tokenizer trained on them).

The bare loop is what one writes by hand: the same encoder, the same batches (collected from the run's own
loader beforehand: pre-tokenized and collated), ``InfoNCELoss`` on the labels, backward, AdamW. The two are
timed interleaved step by step: after each of the Trainer's steps (at ``BATCH_END``) one bare step runs, and
its time is taken out of the Trainer's step. A step's time is from one ``BATCH_END`` to the next, so it
includes the sampler, the collate and everything Composer does between steps.

``host_reads_per_step`` counts the calls of ``Tensor.item``, ``.tolist``, ``.cpu``, ``__bool__``,
``__float__`` and ``__int__`` made by this package during the steps that are not logging steps
(:class:`~composer_dynsample.testing.HostReadCounter`); Composer's own reads are listed
beside it, per step, by call site. On CUDA the syncs are also counted with
``torch.cuda.set_sync_debug_mode("warn")``; on any device the operations that would sync on CUDA are
counted by call site (:class:`~composer_dynsample.testing.SyncOpCounter`). Goals (issue 35): ratio <= 1.10 (moonshot <= 1.03);
``host_reads_per_step`` 0.

    python benchmarks/step_overhead.py [--quick] [--device cpu|cuda] [--steps 200] [--threads 1]

Writes ``results/step_overhead.{json,md}`` (``step_overhead_cuda`` on CUDA).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import torch
from _common import goal_table, machine_info, markdown_table, trainer_overrides, write_results
from _common import parser as make_parser
from composer.core import Callback, State
from composer.loggers import Logger
from omegaconf import OmegaConf

from composer_dynsample import BagOfTokensEncoder, InfoNCELoss
from composer_dynsample.algorithms.hard_negative_mining.checks import largest_label_count
from composer_dynsample.config.loading import load_config
from composer_dynsample.config.run import build_run
from composer_dynsample.mining import BatchHardMiner
from composer_dynsample.mining.step import mining_step
from composer_dynsample.testing import HostReadCounter, HostReadsPerStep, SyncOpsPerStep, caller_of

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "yamls" / "finetune_code_search.yaml"
PAIRS, TOKENS, WIDTH = 128, 128, 8


def write_pairs(folder: Path, pairs: int, words: int = 140, seed: int = 0) -> dict[str, str]:
    """Synthetic pairs of ``words`` random words each (more than ``TOKENS`` tokens), as JSON Lines."""
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(3000)]
    paths = {}
    for split, count in (("train", pairs), ("test", 16)):
        path = folder / f"{split}.jsonl"
        with open(path, "w") as out:
            for _ in range(count):
                row = {key: " ".join(rng.choices(vocabulary, k=words)) for key in ("anchor", "positive")}
                out.write(json.dumps(row) + "\n")
        paths[split] = str(path)
    return paths


def subject_config(folder: Path, steps: int, device: str) -> Any:
    """The fine-tuning recipe with the null encoder on the synthetic pairs, for ``steps`` batches."""
    paths = write_pairs(folder, pairs=PAIRS * (steps + 4))
    return load_config(
        CONFIG,
        [
            f"data={{name: pairs, path: {paths['train']}, test_path: {paths['test']}, max_length: {TOKENS}, "
            f"cache_dir: {folder / 'cache'}}}",
            f"model.encoder={{name: bag_of_tokens, token_dim: {WIDTH}}}",
            f"sampler.classes_per_batch={PAIRS}",
            f"trainer.max_duration={steps}ba",
            "trainer.save_folder=null",
            "trainer.progress_bar=false",
            "evaluation.at_start=false",
            *trainer_overrides(device),
        ],
    )


class BareLoop:
    """The hand-written loop on the run's own batches: encode, the recipe's InfoNCE (its ``loss`` keys: which
    rows are negatives, one direction or both) on the labels, backward, AdamW.

    With ``same_work`` it also gives the loss the batch's text groups as duplicate ids and clips the gradients'
    norm at ``clip``, as the recipe does (and, where the recipe mines, mines ``batch_hard`` and drops duplicate
    negatives with ``mining_step``): what is left between it and the Trainer is the framework (Composer, the
    sampler and collate, the glue).
    """

    def __init__(
        self,
        batches: list[dict],
        vocab: int,
        device: torch.device,
        loss: dict[str, Any],
        same_work: bool,
        mines: bool = False,
        clip: float | None = None,
    ) -> None:
        torch.manual_seed(0)
        self.encoder = BagOfTokensEncoder(vocab_size=vocab, token_dim=WIDTH).to(device)
        self.optimizer = torch.optim.AdamW(self.encoder.parameters(), lr=2e-5, weight_decay=0.01)
        self.loss = InfoNCELoss(**loss)
        self.queries = loss.get("negatives") == "passages"  # the loss reads which rows are queries
        self.miner = BatchHardMiner() if same_work and mines else None
        self.clip = clip if same_work else None
        self.same_work, self.batches, self.device, self.position = same_work, batches, device, 0

    def step(self) -> None:
        batch = self.batches[self.position % len(self.batches)]
        self.position += 1
        features = {key: value.to(self.device, non_blocking=True) for key, value in batch["features"].items()}
        labels = batch["labels"].to(self.device, non_blocking=True)
        embeddings = torch.nn.functional.normalize(self.encoder(features), dim=1)
        keywords = {"is_query": features["is_query"]} if self.queries else {}
        if not self.same_work:
            loss = self.loss(embeddings, labels, **keywords)
        elif self.miner is None:
            ids = batch["text_group"].to(self.device, non_blocking=True)
            loss = self.loss(embeddings, labels, duplicate_ids=ids, **keywords)
        else:
            ids = batch["text_group"].to(self.device, non_blocking=True)
            bound = largest_label_count(batch["labels"])
            mined = mining_step(embeddings, labels, self.miner, duplicate_ids=ids, deferred=True,
                                max_positives=None if bound is None else bound - 1)  # fmt: skip
            loss = self.loss(
                embeddings, labels, mined.indices_tuple, duplicate_ids=ids, values_checked=True, **keywords
            )
        loss.backward()
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.encoder.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


class Interleave(Callback):
    """Times each Trainer step from ``BATCH_END`` to ``BATCH_END`` and runs one step of each bare loop after
    each, timed apart and taken out of the Trainer's step."""

    def __init__(self, warmup: int, synchronize: Any) -> None:
        self.bare: dict[str, BareLoop] = {}  # set once the run's loader has given its batches
        self.warmup, self.synchronize = warmup, synchronize
        self.ours: list[float] = []
        self.theirs: dict[str, list[float]] = {}
        self._last: float | None = None

    def batch_end(self, state: State, logger: Logger) -> None:
        self.synchronize()
        now = time.perf_counter()
        timed = int(state.timestamp.batch) > self.warmup
        if self._last is not None and timed:
            self.ours.append(now - self._last)
        for name, loop in self.bare.items():
            start = time.perf_counter()
            loop.step()
            self.synchronize()
            if timed:
                self.theirs.setdefault(name, []).append(time.perf_counter() - start)
        self._last = time.perf_counter()  # the bare steps' time is not the Trainer's


class Phases(Callback):
    """Seconds of each phase of the Trainer's step, between the events that bound it (algorithms run first at
    an event, so ``forward`` includes the mining at ``AFTER_FORWARD``)."""

    BOUNDS: ClassVar[dict[str, tuple[str, str]]] = {
        "data": ("before_dataloader", "after_dataloader"),
        "forward and mining": ("before_forward", "after_forward"),
        "loss": ("before_loss", "after_loss"),
        "backward": ("before_backward", "after_backward"),
    }

    def __init__(self, warmup: int, synchronize: Any) -> None:
        self.warmup, self.synchronize = warmup, synchronize
        self.seconds: dict[str, list[float]] = {name: [] for name in self.BOUNDS}
        self._start: dict[str, float] = {}
        for name, (begin, end) in self.BOUNDS.items():
            setattr(self, begin, self._marker(name, start=True))
            setattr(self, end, self._marker(name, start=False))

    def _marker(self, name: str, *, start: bool) -> Any:
        def mark(state: State, logger: Logger) -> None:
            self.synchronize()
            if start:
                self._start[name] = time.perf_counter()
            elif int(state.timestamp.batch) >= self.warmup and name in self._start:
                self.seconds[name].append(time.perf_counter() - self._start.pop(name))

        return mark

    def medians(self, step: float) -> dict[str, float]:
        phases = {name: statistics.median(values) for name, values in self.seconds.items() if values}
        return {**phases, "the rest (optimizer, Composer's events, logging)": step - sum(phases.values())}


class SyncSites(Callback):
    """Counts each step's CUDA sync warnings (``torch.cuda.set_sync_debug_mode("warn")`` from ``BATCH_START``
    to ``BATCH_END``) and where they came from: the first frame outside torch and the warnings module
    (``origin path:line``), read from the stack as the warning is shown. ``debug_mode`` is
    ``torch.cuda.set_sync_debug_mode`` (another callable in a test on the CPU)."""

    def __init__(self, debug_mode: Any = None) -> None:
        self.steps: list[int] = []
        self.sites: Counter[str] = Counter()
        self._debug_mode = debug_mode or torch.cuda.set_sync_debug_mode
        self._caught: Any = None
        self._count = 0

    def _shown(self, message: Any, *args: Any, **kwargs: Any) -> None:
        if "synchroniz" in str(message):
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename == warnings.__file__:
                frame = frame.f_back
            origin, site = caller_of(frame)
            self.sites[f"{origin} {site}"] += 1
            self._count += 1

    def batch_start(self, state: State, logger: Logger) -> None:
        self._caught = warnings.catch_warnings()
        self._caught.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._shown
        self._count = 0
        self._debug_mode("warn")

    def batch_end(self, state: State, logger: Logger) -> None:
        self._debug_mode("default")
        self._caught.__exit__(None, None, None)
        self.steps.append(self._count)


def sync_counter(device: torch.device) -> SyncSites | None:
    """On CUDA, the callback that counts the syncs ``set_sync_debug_mode("warn")`` reports; else ``None``."""
    return SyncSites() if device.type == "cuda" else None


def count_reads(cfg: Any, folder: Path, interval: int, device: torch.device) -> dict[str, Any]:
    """Host reads per step of a short run: this package's on non-logging steps, Composer's on every step."""
    with HostReadCounter() as counter:
        per_step, ops = HostReadsPerStep(counter), SyncOpsPerStep()
        syncs = sync_counter(device)
        run = build_run(cfg, folder / "reads", callbacks=[per_step, ops] + ([syncs] if syncs else []))
        run.trainer.fit()
    logging = [bool(interval) and (index + 1) % interval == 0 for index in range(len(per_step.steps))]
    ours = [
        sum(n for (who, _), n in step.items() if who == "composer_dynsample")
        for step, logs in zip(per_step.steps, logging)
        if not logs
    ]
    steps = len(per_step.steps)
    composer: Counter[str] = Counter()
    ours_by_site: Counter[str] = Counter()
    for (who, site, method), n in counter.sites.items():
        if who in ("composer", "composer_dynsample"):
            (composer if who == "composer" else ours_by_site)[f"{method} at {site}"] += n
    return {
        "non_logging_steps": len(ours),
        "host_reads_per_step": sum(ours) / max(len(ours), 1),
        "logging_step_reads": [
            sum(n for (who, _), n in step.items() if who == "composer_dynsample")
            for step, logs in zip(per_step.steps, logging)
            if logs
        ],
        "composer_reads_per_step": {site: n / steps for site, n in sorted(composer.items())},
        "our_reads_per_step_by_site": {site: n / steps for site, n in sorted(ours_by_site.items())},
        # The operations that would sync on CUDA, recognised on any device (SyncOpCounter), every step.
        "sync_ops_per_step": {
            who: sum(n for (origin, _, _), n in ops.sites.items() if origin == who) / len(ops.steps)
            for who in ("composer_dynsample", "composer", "other")
        },
        "sync_ops_per_step_by_site": {
            f"{op} at {site}": n / len(ops.steps)
            for (who, site, op), n in sorted(ops.sites.items())
            if who == "composer_dynsample"
        },
        **({"cuda_syncs_per_step": statistics.mean(syncs.steps)} if syncs and syncs.steps else {}),
        **(
            {"cuda_syncs_per_step_by_site": {site: n / steps for site, n in syncs.sites.most_common()}}
            if syncs and syncs.steps
            else {}
        ),
    }


def measure(args: Any) -> dict[str, Any]:
    device = torch.device(args.device)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory(prefix="step-overhead-") as name:
        folder = Path(name)
        cfg = subject_config(folder, args.steps + args.warmup, args.device)
        miner = (cfg.get("algorithms") or {}).get("hard_negative_mining")
        # Without a miner the recipe has no logging step of its own: every step must read nothing.
        interval = int(str(miner.get("log_interval", "1ba")).removesuffix("ba")) if miner else 0
        reads = count_reads(
            load_config(
                cfg, [f"trainer.max_duration={min(args.steps, 4 * interval) if interval else args.steps}ba"]
            ),
            folder,
            interval,
            device,
        )
        timer, phases = Interleave(args.warmup, synchronize), Phases(args.warmup, synchronize)
        run = build_run(cfg, folder / "timed", callbacks=[timer, phases])
        batches = []
        for batch in run.train_dataloader:  # the batches of the epoch the Trainer then trains
            batches.append(batch)
            if len(batches) == 16:
                break
        shape = tuple(batches[0]["features"]["input_ids"].shape)
        vocab = run.model.encoder.vocab_size
        loss = {key: value for key, value in OmegaConf.to_container(cfg.model.loss).items() if key != "name"}
        clipping = (cfg.get("algorithms") or {}).get("gradient_clipping")
        clip = float(clipping.clipping_threshold) if clipping and clipping.clipping_type == "norm" else None
        timer.bare = {
            name: BareLoop(batches, vocab, device, loss, name == "same_work", miner is not None, clip)
            for name in ("plain", "same_work")
        }
        run.trainer.fit()
    ours = statistics.median(timer.ours)
    theirs = {name: statistics.median(values) for name, values in timer.theirs.items()}
    return {
        "batch_shape": list(shape),
        "log_interval": interval,
        "steps_timed": len(timer.ours),
        "ours_s_per_step": ours,
        "bare_s_per_step": theirs["plain"],
        "bare_same_work_s_per_step": theirs["same_work"],
        "ratio": ours / theirs["plain"],
        "ratio_to_same_work": ours / theirs["same_work"],
        "phases_s": phases.medians(ours),
        **reads,
    }


def report(result: dict[str, Any], quick: bool, out: Path, name: str) -> None:
    goals = [
        {"goal": "step time, this package / bare loop <= 1.10 (moonshot 1.03)",
         "measured": f"{result['ratio']:.2f}x", "met": result["ratio"] <= 1.10},
        {"goal": "host reads by this package per non-logging step: 0",
         "measured": f"{result['host_reads_per_step']:g}", "met": result["host_reads_per_step"] == 0},
    ]  # fmt: skip
    table = markdown_table(
        ["path", "ms per step", "host reads per step"],
        "lrr",
        [
            ["this package (Composer Trainer, the recipe)", f"{1000 * result['ours_s_per_step']:.2f}",
             f"{result['host_reads_per_step']:g} (non-logging steps)"],
            ["bare PyTorch loop, same batches", f"{1000 * result['bare_s_per_step']:.2f}", "-"],
            ["bare loop with the recipe's duplicate-aware loss",
             f"{1000 * result['bare_same_work_s_per_step']:.2f}", "-"],
        ],
    )  # fmt: skip
    composer = "; ".join(f"{m}: {n:g}" for m, n in result["composer_reads_per_step"].items())
    phases = ", ".join(f"{name} {1000 * value:.2f} ms" for name, value in result["phases_s"].items())
    notes = [
        goal_table(goals),
        f"Batches of {result['batch_shape'][0]} texts x {result['batch_shape'][1]} tokens, encoder bag_of_tokens "
        f"of width {WIDTH}; {result['steps_timed']} steps timed, medians; the recipe's log interval "
        f"{result['log_interval'] or 'none (no miner)'} batches (reads on logging steps: {result['logging_step_reads']}).",
        f"Against the bare loop that does the recipe's work too (duplicate ids in the loss): "
        f"{result['ratio_to_same_work']:.2f}x, the framework alone (Composer, sampler and collate, the "
        "algorithm's glue).",
        f"Where this package's step goes (medians): {phases}.",
        f"Composer's own host reads per step (not this package's to remove): {composer}.",
        *(
            [
                "Operations that sync on CUDA, recognised on any device (composer_dynsample.testing."
                f"SyncOpCounter), per step: this package {result['sync_ops_per_step']['composer_dynsample']:g}, "
                f"Composer {result['sync_ops_per_step']['composer']:g}, other {result['sync_ops_per_step']['other']:g}; "
                "this package's by call site: "
                + "; ".join(f"{m}: {n:g}" for m, n in result["sync_ops_per_step_by_site"].items())
                + "."
            ]
            if "sync_ops_per_step" in result
            else []
        ),
        *(
            [f"This package's reads per step (every step), by call site: {ours}."]
            if (
                ours := "; ".join(
                    f"{m}: {n:g}" for m, n in result.get("our_reads_per_step_by_site", {}).items()
                )
            )
            else []
        ),
        *(
            [
                "CUDA syncs per step "
                + f"{result['cuda_syncs_per_step']:g}, by call site: "
                + "; ".join(
                    f"{site}: {n:g}" for site, n in result.get("cuda_syncs_per_step_by_site", {}).items()
                )
                + "."
            ]
            if "cuda_syncs_per_step" in result
            else []
        ),
        f"Machine: {result['machine']}.",
    ]
    write_results(out, name, quick, {**result, "goals": goals}, table, notes=notes)
    print(table + "\n\n" + goal_table(goals))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__, quick_help="40 steps timed instead of 200", threads=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=None, help="steps timed (default 200, --quick 40)")
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    args.steps = args.steps or (40 if args.quick else 200)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here.")
    torch.set_num_threads(args.threads)
    # The synthetic texts are longer than 128 tokens on purpose (full batches): the loader's warning says so.
    warnings.filterwarnings("ignore", message=r".*longer than max_length=.*truncated")
    result = {**measure(args), "device": args.device, "machine": machine_info()}
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name(0)
    report(result, args.quick, args.out, "step_overhead" if args.device == "cpu" else "step_overhead_cuda")
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
